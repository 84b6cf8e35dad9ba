#include "common/units.h"

#include <fmt/format.h>

#include <array>
#include <charconv>
#include <cmath>

namespace quarry {
namespace {

// What the parse errors suggest.
constexpr std::string_view kSizeUnits = "use B, KiB, MiB, GiB or TiB, e.g. 512MiB";
constexpr std::string_view kDurationUnits = "use ms, s, m, h or d, e.g. 30s or 1h30m";

struct Unit {
  std::string_view suffix;
  double factor;
};

// Splits "1.5GiB" into 1.5 and "GiB"; whitespace between them is allowed. Errors quote
// `whole`, the value the user wrote, of which `text` may be one part ("-" of "1s-").
Result<std::pair<double, std::string_view>> split_number(std::string_view text,
                                                         std::string_view what,
                                                         std::string_view units,
                                                         std::string_view whole) {
  while (!text.empty() && text.front() == ' ')
    text.remove_prefix(1);
  while (!text.empty() && text.back() == ' ')
    text.remove_suffix(1);
  double value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end == text.data()) {
    return make_error(ErrorCode::kInvalidArgument, "'{}' is not a {} ({})", whole, what, units);
  }
  std::string_view unit(end, text.data() + text.size() - end);
  while (!unit.empty() && unit.front() == ' ')
    unit.remove_prefix(1);
  if (value < 0 || !std::isfinite(value)) {
    return make_error(ErrorCode::kInvalidArgument, "'{}' is not a {}: it must not be negative",
                      whole, what);
  }
  return std::pair{value, unit};
}

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) !=
        std::tolower(static_cast<unsigned char>(b[i]))) {
      return false;
    }
  }
  return true;
}

}  // namespace

Result<uint64_t> parse_size(std::string_view text) {
  static constexpr std::array<Unit, 14> kUnits = {{
      {"", 1},
      {"b", 1},
      {"k", 1024.0},
      {"kb", 1024.0},
      {"kib", 1024.0},
      {"m", 1024.0 * 1024},
      {"mb", 1024.0 * 1024},
      {"mib", 1024.0 * 1024},
      {"g", 1024.0 * 1024 * 1024},
      {"gb", 1024.0 * 1024 * 1024},
      {"gib", 1024.0 * 1024 * 1024},
      {"t", 1024.0 * 1024 * 1024 * 1024},
      {"tb", 1024.0 * 1024 * 1024 * 1024},
      {"tib", 1024.0 * 1024 * 1024 * 1024},
  }};
  ASSIGN_OR_RETURN(auto parts, split_number(text, "size", kSizeUnits, text));
  auto [value, unit] = parts;
  for (const Unit& candidate : kUnits) {
    if (iequals(unit, candidate.suffix)) {
      const double bytes = value * candidate.factor;
      // llround returns an int64: 2^63 and more do not fit (9000000TiB came back as 8 EiB).
      if (bytes >= 0x1p63) {
        return make_error(ErrorCode::kInvalidArgument,
                          "'{}' is too large a size: it must be under 8388608TiB", text);
      }
      return static_cast<uint64_t>(std::llround(bytes));
    }
  }
  return make_error(ErrorCode::kInvalidArgument, "'{}' has an unknown size unit '{}' ({})", text,
                    unit, kSizeUnits);
}

Result<Duration> parse_duration(std::string_view text) {
  static constexpr std::array<Unit, 7> kUnits = {{
      {"", 1000},
      {"ms", 1},
      {"s", 1000},
      {"m", 60 * 1000},
      {"min", 60 * 1000},
      {"h", 3600 * 1000},
      {"d", 24 * 3600 * 1000},
  }};
  // One or more number-unit pairs: "30s", "1h30m", "1m30s"; a bare number is seconds.
  std::string_view rest = text;
  double total_ms = 0;
  bool any = false;
  while (!rest.empty() || !any) {
    size_t unit_end = 0;
    while (unit_end < rest.size() &&
           (std::isdigit(static_cast<unsigned char>(rest[unit_end])) || rest[unit_end] == '.' ||
            rest[unit_end] == ' ' || rest[unit_end] == '-')) {
      ++unit_end;
    }
    while (unit_end < rest.size() && std::isalpha(static_cast<unsigned char>(rest[unit_end]))) {
      ++unit_end;
    }
    ASSIGN_OR_RETURN(auto parts,
                     split_number(rest.substr(0, unit_end), "duration", kDurationUnits, text));
    auto [value, unit] = parts;
    const Unit* found = nullptr;
    for (const Unit& candidate : kUnits) {
      if (iequals(unit, candidate.suffix)) found = &candidate;
    }
    if (!found || (found->suffix.empty() && (any || unit_end < rest.size()))) {
      return make_error(ErrorCode::kInvalidArgument, "'{}' is not a duration ({})", text,
                        kDurationUnits);
    }
    total_ms += value * found->factor;
    any = true;
    rest.remove_prefix(unit_end);
    if (rest.empty()) break;
  }
  // Durations end up on steady clocks counting nanoseconds in an int64, which hold 292 years: a
  // longer one (someone's "never") would wrap, and every wait would end at once. (And llround
  // of a value past int64 is unspecified: a huge one would become negative.)
  constexpr double kLongestMs = 36500.0 * 24 * 3600 * 1000;
  if (!(total_ms <= kLongestMs)) {
    return make_error(ErrorCode::kInvalidArgument,
                      "'{}' is too long a duration: at most 36500d (100 years)", text);
  }
  return Duration(std::llround(total_ms));
}

std::string format_size(uint64_t bytes) {
  static constexpr std::array<std::string_view, 5> kNames = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  size_t index = 0;
  while (value >= 1024 && index + 1 < kNames.size()) {
    value /= 1024;
    ++index;
  }
  if (index == 0) return fmt::format("{} B", bytes);
  if (std::fabs(value - std::round(value)) < 0.05) {
    return fmt::format("{:.0f} {}", value, kNames[index]);
  }
  return fmt::format("{:.1f} {}", value, kNames[index]);
}

std::string format_duration(Duration duration) {
  auto ms = duration.count();
  if (ms % 1000 != 0) return fmt::format("{}ms", ms);
  auto seconds = ms / 1000;
  std::string out;
  if (seconds >= 3600) {
    out += fmt::format("{}h", seconds / 3600);
    seconds %= 3600;
  }
  if (seconds >= 60) {
    out += fmt::format("{}m", seconds / 60);
    seconds %= 60;
  }
  if (seconds > 0 || out.empty()) out += fmt::format("{}s", seconds);
  return out;
}

std::string format_elapsed(double milliseconds) {
  if (milliseconds < 9.95) return fmt::format("{:.1f} ms", milliseconds);
  if (milliseconds < 999.5) return fmt::format("{:.0f} ms", milliseconds);
  return fmt::format("{:.2f} s", milliseconds / 1000);
}

}  // namespace quarry

#include "common/retry_policy.h"

#include <time.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <string>

#include "common/text.h"

namespace quarry {
namespace {

std::optional<double> parse_number(std::string_view text) {
  double value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || !std::isfinite(value) || value < 0) {
    return std::nullopt;
  }
  return value;
}

// The three date forms HTTP allows (RFC 9110, section 5.6.7), always GMT.
std::optional<std::chrono::system_clock::time_point> parse_http_date(std::string_view text) {
  const std::string value(text);
  for (const char* format :
       {"%a, %d %b %Y %H:%M:%S GMT", "%A, %d-%b-%y %H:%M:%S GMT", "%a %b %e %H:%M:%S %Y"}) {
    struct tm fields = {};
    const char* end = ::strptime(value.c_str(), format, &fields);
    if (end == nullptr || *end != '\0') continue;
    const time_t seconds = ::timegm(&fields);
    if (seconds == static_cast<time_t>(-1)) continue;
    return std::chrono::system_clock::from_time_t(seconds);
  }
  return std::nullopt;
}

}  // namespace

bool is_retryable_status(int status) {
  return status == 408 || status == 429 || status >= 500;
}

std::optional<Duration> parse_retry_after(std::string_view value,
                                          std::chrono::system_clock::time_point now) {
  value = trim_blanks(value);
  if (value.empty()) return std::nullopt;
  if (auto seconds = parse_number(value)) {
    return std::chrono::duration_cast<Duration>(
        std::chrono::duration<double>(std::min(*seconds, 1e9)));
  }
  auto date = parse_http_date(value);
  if (!date) return std::nullopt;
  if (*date <= now) return Duration::zero();
  return std::chrono::ceil<Duration>(*date - now);
}

std::optional<Duration> parse_retry_after_ms(std::string_view value) {
  auto ms = parse_number(trim_blanks(value));
  if (!ms) return std::nullopt;
  return Duration(static_cast<int64_t>(std::min(*ms, 1e12)));
}

Duration backoff_delay(uint32_t retry, double random01, const BackoffPolicy& policy) {
  const uint32_t doublings = std::min<uint32_t>(retry == 0 ? 0 : retry - 1, 30);
  const double step =
      std::min(static_cast<double>(policy.initial.count()) * std::ldexp(1.0, doublings),
               static_cast<double>(policy.max.count()));
  const double jitter = std::clamp(random01, 0.0, 1.0);
  return Duration(static_cast<int64_t>(std::llround(step / 2 + jitter * step / 2)));
}

}  // namespace quarry

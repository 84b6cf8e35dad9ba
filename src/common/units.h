// Parsing and printing of the sizes ("1GiB") and durations ("120s") used in config and CLI.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/error.h"

namespace quarry {

using Duration = std::chrono::milliseconds;

inline constexpr uint64_t kKiB = 1024;
inline constexpr uint64_t kMiB = 1024 * kKiB;
inline constexpr uint64_t kGiB = 1024 * kMiB;

// Accepts a plain byte count or a number with a unit: B, K/KB/KiB, M/MB/MiB, G/GB/GiB, T/TB/TiB.
// Units are binary (KB means KiB, as in most memory-limit settings); fractions are allowed
// ("1.5GiB").
Result<uint64_t> parse_size(std::string_view text);

// Accepts a number with a unit: ms, s, m (or min), h, d, and combinations ("1h30m"). A bare
// number means seconds.
Result<Duration> parse_duration(std::string_view text);

// "1 GiB", "512 MiB", "1.5 GiB", "300 B".
std::string format_size(uint64_t bytes);

// "120s", "15m", "1h30m", "250ms".
std::string format_duration(Duration duration);

// A measured time, as the web UI shows it: "0.4 ms", "12 ms", "1.23 s".
std::string format_elapsed(double milliseconds);

}  // namespace quarry

// What the benchmarks print of their samples: the median and the 90th percentile.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <vector>

namespace quarry::bench {

using Clock = std::chrono::steady_clock;

struct Stats {
  double p50 = 0, p90 = 0;
  size_t n = 0;
};

inline Stats stats(std::vector<double> samples) {
  if (samples.empty()) return {};
  std::sort(samples.begin(), samples.end());
  auto at = [&](double q) { return samples[static_cast<size_t>(q * (samples.size() - 1))]; };
  return {at(0.5), at(0.9), samples.size()};
}

inline double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

}  // namespace quarry::bench

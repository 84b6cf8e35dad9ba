// Time as a dependency: the system clock in production, a clock tests move by hand (so an idle
// timeout of 15 minutes can be tested in microseconds).
#pragma once

#include <chrono>
#include <mutex>

namespace quarry {

class Clock {
 public:
  using time_point = std::chrono::system_clock::time_point;
  virtual ~Clock() = default;
  virtual time_point now() const = 0;
};

class SystemClock final : public Clock {
 public:
  time_point now() const override { return std::chrono::system_clock::now(); }
};

class ManualClock final : public Clock {
 public:
  explicit ManualClock(time_point start = std::chrono::system_clock::now()) : now_(start) {}
  time_point now() const override {
    std::lock_guard lock(mutex_);
    return now_;
  }
  void advance(std::chrono::milliseconds by) {
    std::lock_guard lock(mutex_);
    now_ += by;
  }

 private:
  mutable std::mutex mutex_;
  time_point now_;
};

// Milliseconds since the Unix epoch, the form timestamps take in stores and JSON.
inline int64_t to_unix_ms(Clock::time_point time) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(time.time_since_epoch()).count();
}
inline Clock::time_point from_unix_ms(int64_t ms) {
  return Clock::time_point(std::chrono::milliseconds(ms));
}

}  // namespace quarry

#include "common/retry_policy.h"

#include <gtest/gtest.h>

namespace quarry {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

TEST(RetryPolicy, RetriesRateLimitsTimeoutsAndServerErrors) {
  for (int status : {408, 429, 500, 502, 503, 504})
    EXPECT_TRUE(is_retryable_status(status));
  for (int status : {200, 400, 401, 403, 404, 413, 422})
    EXPECT_FALSE(is_retryable_status(status));
}

TEST(RetryPolicy, ParsesRetryAfterSecondsAndDates) {
  // Wed, 21 Oct 2015 07:28:00 GMT
  const auto now = std::chrono::system_clock::from_time_t(1445412480);
  struct Case {
    const char* value;
    std::optional<Duration> expected;
  } cases[] = {
      {"1", seconds(1)},
      {" 120 ", seconds(120)},
      {"0", Duration::zero()},
      {"1.5", milliseconds(1500)},
      {"Wed, 21 Oct 2015 07:28:30 GMT", seconds(30)},
      {"Wednesday, 21-Oct-15 07:29:00 GMT", seconds(60)},
      {"Wed Oct 21 07:28:02 2015", seconds(2)},
      {"Wed, 21 Oct 2015 07:00:00 GMT", Duration::zero()},  // in the past
      {"", std::nullopt},
      {"-1", std::nullopt},
      {"soon", std::nullopt},
      {"Wed, 21 Oct 2015 07:28:30", std::nullopt},  // no GMT
      {"12abc", std::nullopt},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.value);
    EXPECT_EQ(parse_retry_after(c.value, now), c.expected);
  }
  EXPECT_EQ(parse_retry_after_ms("250"), milliseconds(250));
  EXPECT_EQ(parse_retry_after_ms(""), std::nullopt);
}

TEST(RetryPolicy, BackoffDoublesWithinJitterBoundsUpToTheCap) {
  const BackoffPolicy policy{.initial = milliseconds(500), .max = seconds(8)};
  const Duration steps[] = {milliseconds(500), seconds(1), seconds(2), seconds(4),
                            seconds(8),        seconds(8), seconds(8)};
  for (uint32_t retry = 1; retry <= 7; ++retry) {
    SCOPED_TRACE(retry);
    const Duration step = steps[retry - 1];
    EXPECT_EQ(backoff_delay(retry, 0.0, policy), step / 2);
    EXPECT_EQ(backoff_delay(retry, 1.0, policy), step);
    for (double random01 : {0.1, 0.37, 0.5, 0.99}) {
      const Duration delay = backoff_delay(retry, random01, policy);
      EXPECT_GE(delay, step / 2);
      EXPECT_LE(delay, step);
    }
  }
  // Huge retry numbers neither overflow nor pass the cap; out-of-range randomness is clamped.
  EXPECT_EQ(backoff_delay(1000, 1.0, policy), seconds(8));
  EXPECT_EQ(backoff_delay(2, 7.0, policy), seconds(1));
  EXPECT_EQ(backoff_delay(2, -1.0, policy), milliseconds(500));
}

}  // namespace
}  // namespace quarry

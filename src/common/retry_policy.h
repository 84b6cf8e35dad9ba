// When to try an HTTP request again (to the model, to a remote sandbox provider) and how long
// to wait: exponential backoff with jitter, and the server's own Retry-After.
#pragma once

#include <chrono>
#include <optional>
#include <string_view>

#include "common/units.h"

namespace quarry {

// 408, 429 and 5xx: the server may answer the same request later.
bool is_retryable_status(int status);

// A Retry-After value: delay-seconds ("120", fractions allowed) or an HTTP date ("Wed, 21 Oct
// 2015 07:28:00 GMT", also the obsolete RFC 850 and asctime forms), relative to `now`. A date
// in the past is zero. nullopt when the value is neither.
std::optional<Duration> parse_retry_after(std::string_view value,
                                          std::chrono::system_clock::time_point now);

// The retry-after-ms header some OpenAI-compatible servers send (milliseconds).
std::optional<Duration> parse_retry_after_ms(std::string_view value);

struct BackoffPolicy {
  Duration initial = std::chrono::milliseconds(500);
  Duration max = std::chrono::seconds(8);
};

// The wait before retry number `retry` (1 = the first retry): the exponential step
// initial * 2^(retry-1), capped at max, of which a random part (`random01` in [0, 1)) is kept
// above half: the result lies in [step/2, step]. The jitter keeps many clients that failed
// together from coming back together.
Duration backoff_delay(uint32_t retry, double random01, const BackoffPolicy& policy = {});

}  // namespace quarry

// What a fuzzer asserts of an input its parser accepted: a broken rule is reported, with what
// it was, as a crash (libFuzzer then saves the input).
#pragma once

#include <fmt/format.h>

#include <cstdlib>
#include <string_view>

inline void check(bool condition, std::string_view what) {
  if (!condition) {
    fmt::print(stderr, "broken: {}\n", what);
    std::abort();
  }
}

#include "common/units.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

namespace quarry {
namespace {

TEST(ParseSize, AcceptsBinaryUnitsAndPlainBytes) {
  struct Case {
    const char* text;
    uint64_t bytes;
  } cases[] = {
      {"0", 0},
      {"512", 512},
      {"1B", 1},
      {"1KiB", 1024},
      {"1k", 1024},
      {"2MiB", 2 * kMiB},
      {"1GiB", kGiB},
      {"1.5GiB", kGiB + kGiB / 2},
      {"1 GiB", kGiB},
      {"3gb", 3 * kGiB},
      {"1TiB", 1024 * kGiB},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.text);
    auto value = parse_size(c.text);
    ASSERT_TRUE(value) << value.error().message;
    EXPECT_EQ(*value, c.bytes);
  }
}

TEST(ParseSize, RejectsWithAMessageThatSaysWhy) {
  for (const char* text : {"", "GiB", "-1GiB", "1 parsecs", "1e999GiB", "abc"}) {
    SCOPED_TRACE(text);
    auto value = parse_size(text);
    ASSERT_FALSE(value);
    EXPECT_EQ(value.error().code, ErrorCode::kInvalidArgument);
    EXPECT_NE(value.error().message.find(text), std::string::npos);
  }
  EXPECT_NE(parse_size("1 parsecs").error().message.find("unknown size unit"), std::string::npos);
}

// 2^63 bytes and more went through std::llround, which cannot hold them: 9000000TiB came back
// as 8388608 TiB.
TEST(ParseSize, RefusesWhatCannotBeHeld) {
  for (const char* text : {"9000000TiB", "8388608TiB", "9223372036854775808", "20000000TiB"}) {
    SCOPED_TRACE(text);
    auto value = parse_size(text);
    ASSERT_FALSE(value) << "read as " << *value;
    EXPECT_NE(value.error().message.find(
                  fmt::format("'{}' is too large a size: it must be under 8388608TiB", text)),
              std::string::npos)
        << value.error().message;
  }
  EXPECT_EQ(*parse_size("8388607TiB"), 8388607 * (1024 * kGiB));
}

TEST(ParseDuration, AcceptsCommonUnits) {
  EXPECT_EQ(*parse_duration("120s"), std::chrono::seconds(120));
  EXPECT_EQ(*parse_duration("15m"), std::chrono::minutes(15));
  EXPECT_EQ(*parse_duration("1h"), std::chrono::hours(1));
  EXPECT_EQ(*parse_duration("250ms"), std::chrono::milliseconds(250));
  EXPECT_EQ(*parse_duration("30"), std::chrono::seconds(30));
  EXPECT_EQ(*parse_duration("1.5s"), std::chrono::milliseconds(1500));
  EXPECT_FALSE(parse_duration("5 fortnights"));
  EXPECT_FALSE(parse_duration("soon"));
}

// The message names every unit (d too) and quotes the whole value, not the piece that failed.
TEST(ParseDuration, RefusesQuotingTheWholeValue) {
  struct Case {
    const char* text;
    const char* expected;
  } cases[] = {
      {"1s-", "'1s-' is not a duration (use ms, s, m, h or d, e.g. 30s or 1h30m)"},
      {"soon", "'soon' is not a duration (use ms, s, m, h or d, e.g. 30s or 1h30m)"},
      {"5 fortnights", "'5 fortnights' is not a duration (use ms, s, m, h or d"},
      {"1h-5m", "'1h-5m' is not a duration: it must not be negative"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.text);
    auto duration = parse_duration(c.text);
    ASSERT_FALSE(duration);
    EXPECT_NE(duration.error().message.find(c.expected), std::string::npos)
        << duration.error().message;
  }
}

// Found by fuzz/config_fuzzer's check that durations are not negative, with a hand-made input:
// 200000000000d is past int64 milliseconds, and llround made it negative, which
// server.shutdown_grace (zero allowed) accepted. And 200000d (a "never") is past what a steady
// clock's nanoseconds hold: a queue_timeout that long made every wait time out at once.
TEST(ParseDuration, RefusesWhatAClockCannotHold) {
  for (const char* text :
       {"200000000000d", "9300000000000000000ms", "1d200000000000d", "200000d", "36500d1ms"}) {
    SCOPED_TRACE(text);
    auto duration = parse_duration(text);
    ASSERT_FALSE(duration);
    EXPECT_NE(duration.error().message.find("too long a duration: at most 36500d"),
              std::string::npos)
        << duration.error().message;
  }
  const auto longest = *parse_duration("36500d");
  EXPECT_EQ(longest, std::chrono::hours(24) * 36500);
  const auto deadline = std::chrono::steady_clock::now() + longest;
  EXPECT_GT(deadline, std::chrono::steady_clock::now()) << "a deadline that far still lies ahead";
}

TEST(FormatSize, IsReadable) {
  EXPECT_EQ(format_size(300), "300 B");
  EXPECT_EQ(format_size(kGiB), "1 GiB");
  EXPECT_EQ(format_size(512 * kMiB), "512 MiB");
  EXPECT_EQ(format_size(kGiB + kGiB / 2), "1.5 GiB");
}

TEST(FormatDuration, RoundTripsWithParse) {
  for (const char* text : {"120s", "15m", "1h30m", "250ms", "2h"}) {
    SCOPED_TRACE(text);
    auto parsed = parse_duration(text);
    ASSERT_TRUE(parsed);
    EXPECT_EQ(*parse_duration(format_duration(*parsed)), *parsed);
  }
  EXPECT_EQ(format_duration(std::chrono::seconds(120)), "2m");
  EXPECT_EQ(format_duration(std::chrono::seconds(30)), "30s");
}

// Short steps read in milliseconds, so a 0.4 ms step does not read "0.00 s".
TEST(FormatElapsed, ReadsAsTheWebUiShowsIt) {
  EXPECT_EQ(format_elapsed(0), "0.0 ms");
  EXPECT_EQ(format_elapsed(0.42), "0.4 ms");
  EXPECT_EQ(format_elapsed(9.94), "9.9 ms");
  EXPECT_EQ(format_elapsed(9.96), "10 ms");
  EXPECT_EQ(format_elapsed(12.4), "12 ms");
  EXPECT_EQ(format_elapsed(999.4), "999 ms");
  EXPECT_EQ(format_elapsed(999.6), "1.00 s");
  EXPECT_EQ(format_elapsed(1234), "1.23 s");
  EXPECT_EQ(format_elapsed(125000), "125.00 s");
}

}  // namespace
}  // namespace quarry

#include "sandbox/metering.h"

#include <gtest/gtest.h>

namespace quarry::sandbox {
namespace {

TEST(Metering, OomMessageIsTheAgentFacingText) {
  EXPECT_EQ(oom_message(973ull << 20, 1024ull << 20),
            "Killed: command ran out of memory.\nPeak memory: 973 MiB\nSandbox limit: 1024 MiB");
}

// The line the model reads after each command; a step of a kernel is often under a millisecond.
TEST(Metering, MeteringLineGivesShortTimesInMilliseconds) {
  ExecResult quick;
  quick.exit_code = 1;
  quick.run_ms = 0.42;
  quick.cpu_ms = 0.38;
  quick.peak_memory_bytes = 86ull << 20;
  quick.memory_limit_bytes = 1024ull << 20;
  EXPECT_EQ(metering_line(quick),
            "exit code 1 · 0.4 ms · CPU 0.4 ms · peak memory 86 MiB of 1024 MiB");

  ExecResult slow = quick;
  slow.exit_code = 0;
  slow.run_ms = 1234;
  slow.cpu_ms = 1201;
  EXPECT_EQ(metering_line(slow),
            "exit code 0 · 1.23 s · CPU 1.20 s · peak memory 86 MiB of 1024 MiB");
}

TEST(Metering, DescribeChoosesOomOverTimeout) {
  ExecResult result;
  result.oom = true;
  result.timed_out = true;
  result.peak_memory_bytes = 256ull << 20;
  result.memory_limit_bytes = 256ull << 20;
  describe(result, std::chrono::seconds(30));
  ASSERT_TRUE(result.message);
  EXPECT_EQ(result.message->rfind("Killed: command ran out of memory.", 0), 0u);

  ExecResult timed_out;
  timed_out.timed_out = true;
  describe(timed_out, std::chrono::seconds(30));
  EXPECT_EQ(timed_out.message, "Timed out: command ran longer than 30s and was killed.");

  ExecResult fine;
  describe(fine, std::chrono::seconds(30));
  EXPECT_FALSE(fine.message);
}

TEST(Metering, JsonHasEveryDocumentedField) {
  ExecResult result;
  result.exit_code = 137;
  result.signal = 9;
  auto json = to_json(result);
  for (const char* key :
       {"exit_code", "signal", "stdout", "stderr", "truncated", "run_ms", "cpu_ms",
        "peak_memory_bytes", "memory_limit_bytes", "overhead_ms", "oom", "timed_out", "message"}) {
    SCOPED_TRACE(key);
    EXPECT_TRUE(json.contains(key));
  }
  EXPECT_EQ(json["signal"], 9);
  EXPECT_TRUE(json["message"].is_null());
}

}  // namespace
}  // namespace quarry::sandbox

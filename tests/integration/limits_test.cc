// Limits and metering: memory (OOM from the kernel's counters), pids, time, CPU.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <thread>

#include "common/units.h"
#include "sandbox/metering.h"
#include "sandbox_environment.h"

namespace quarry::testing {
namespace {

TEST(Limits, OverAllocationIsReportedAsOom) {
  auto spec = ScopedSandbox::default_spec();
  spec.resources.memory_bytes = 256 * kMiB;
  ScopedSandbox sandbox(spec);
  auto result = python(sandbox.id(), "b = b'x' * (512 << 20)\nprint(len(b))");
  ASSERT_TRUE(result) << result.error().message;
  EXPECT_TRUE(result->oom);
  EXPECT_EQ(result->signal, 9);
  EXPECT_EQ(result->exit_code, 137);
  EXPECT_EQ(result->memory_limit_bytes, 256 * kMiB);
  // Killed at the limit: the peak is the limit, give or take the kernel's slack.
  EXPECT_GT(result->peak_memory_bytes, 240 * kMiB);
  EXPECT_LE(result->peak_memory_bytes, 260 * kMiB);
  ASSERT_TRUE(result->message);
  EXPECT_EQ(*result->message, sandbox::oom_message(result->peak_memory_bytes, 256 * kMiB));
  EXPECT_NE(result->message->find("Sandbox limit: 256 MiB"), std::string::npos);
  // The sandbox survives its command's OOM.
  auto after = run(sandbox.id(), {"echo", "still here"});
  ASSERT_TRUE(after);
  EXPECT_EQ(after->stdout_text, "still here\n");
  EXPECT_FALSE(after->oom);
}

TEST(Limits, Exit137WithoutMemoryPressureIsNotOom) {
  ScopedSandbox sandbox;
  auto result = run(sandbox.id(), {"sh", "-c", "kill -9 $$"});
  ASSERT_TRUE(result) << result.error().message;
  EXPECT_EQ(result->exit_code, 137);
  EXPECT_FALSE(result->oom);
  EXPECT_FALSE(result->message);
}

TEST(Limits, PeakMemoryMatchesAKnownAllocation) {
  ScopedSandbox sandbox;
  // The interpreter's own footprint, measured the same way, is taken off.
  auto baseline = python(sandbox.id(), "pass");
  ASSERT_TRUE(baseline) << baseline.error().message;
  constexpr uint64_t kAllocation = 300 * kMiB;
  auto result = python(sandbox.id(), "b = b'x' * (300 << 20)");
  ASSERT_TRUE(result) << result.error().message;
  ASSERT_EQ(result->exit_code, 0) << result->stderr_text;
  const double measured = static_cast<double>(result->peak_memory_bytes) -
                          static_cast<double>(baseline->peak_memory_bytes);
  const double tolerance = std::max(0.05 * kAllocation, 8.0 * kMiB);
  EXPECT_NEAR(measured, static_cast<double>(kAllocation), tolerance)
      << "peak " << result->peak_memory_bytes << ", baseline " << baseline->peak_memory_bytes;
}

TEST(Limits, ForkBombIsStoppedByThePidsLimit) {
  auto spec = ScopedSandbox::default_spec();
  spec.resources.pids = 64;
  ScopedSandbox sandbox(spec);
  // The host keeps starting processes quickly while the bomb goes off.
  std::atomic<bool> done = false;
  std::atomic<double> slowest_host_ms = 0;
  std::thread host([&] {
    while (!done) {
      auto start = std::chrono::steady_clock::now();
      ASSERT_EQ(std::system("true"), 0);
      double ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
              .count();
      if (ms > slowest_host_ms) slowest_host_ms = ms;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  auto result = run(sandbox.id(), {"bash", "-c", "bomb() { bomb | bomb & }; bomb; sleep 3"},
                    std::chrono::seconds(5));
  done = true;
  host.join();
  ASSERT_TRUE(result) << result.error().message;
  EXPECT_NE(result->stderr_text.find("Resource temporarily unavailable"), std::string::npos)
      << result->stderr_text.substr(0, 500);
  EXPECT_LT(slowest_host_ms.load(), 2000.0);
  // Nothing of the bomb outlives the exec.
  EXPECT_EQ(host_processes_of(sandbox.id()).size(), 1u);  // init only
  auto after = run(sandbox.id(), {"echo", "ok"});
  ASSERT_TRUE(after) << after.error().message;
  EXPECT_EQ(after->stdout_text, "ok\n");
}

TEST(Limits, TimeoutKillsTheWholeProcessTree) {
  ScopedSandbox sandbox;
  auto start = std::chrono::steady_clock::now();
  auto result = run(sandbox.id(),
                    {"sh", "-c", "setsid sleep 1000 & (while :; do :; done) & while :; do :; done"},
                    std::chrono::seconds(1));
  auto elapsed = std::chrono::steady_clock::now() - start;
  ASSERT_TRUE(result) << result.error().message;
  EXPECT_TRUE(result->timed_out);
  EXPECT_EQ(result->signal, 9);
  EXPECT_EQ(result->message, sandbox::timeout_message(std::chrono::seconds(1)));
  EXPECT_LT(elapsed, std::chrono::seconds(5));
  EXPECT_EQ(host_processes_of(sandbox.id()).size(), 1u);  // init only
  auto listing = run(sandbox.id(), {"sh", "-c", "ls /proc | grep -c '^[0-9]'"});
  ASSERT_TRUE(listing);
  EXPECT_LE(std::stoi(listing->stdout_text), 4) << "left behind: " << listing->stdout_text;
}

TEST(Limits, CpuQuotaIsEnforcedAndMetered) {
  auto spec = ScopedSandbox::default_spec();
  spec.resources.cpus = 0.5;
  ScopedSandbox sandbox(spec);
  // Two busy threads for a second of wall time get about half a core between them.
  auto result = python(sandbox.id(), R"(
import threading, time, hashlib
def spin():
    end = time.monotonic() + 1.5
    while time.monotonic() < end:
        hashlib.sha256(b'x' * 4096).digest()
threads = [threading.Thread(target=spin) for _ in range(2)]
[t.start() for t in threads]
[t.join() for t in threads]
)");
  ASSERT_TRUE(result) << result.error().message;
  ASSERT_EQ(result->exit_code, 0) << result->stderr_text;
  const double share = result->cpu_ms / result->run_ms;
  EXPECT_NEAR(share, 0.5, 0.15) << "cpu " << result->cpu_ms << " ms over " << result->run_ms
                                << " ms";
}

TEST(Limits, EveryExecIsMetered) {
  ScopedSandbox sandbox;
  auto result =
      python(sandbox.id(),
             "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass");
  ASSERT_TRUE(result) << result.error().message;
  EXPECT_GE(result->run_ms, 300);
  EXPECT_GE(result->cpu_ms, 290);
  EXPECT_LE(result->cpu_ms, result->run_ms * 1.1);
  EXPECT_GT(result->peak_memory_bytes, 1 * kMiB);
  EXPECT_EQ(result->memory_limit_bytes,
            SandboxEnvironment::get().config().sandbox.resources.memory_bytes);
  EXPECT_GT(result->overhead_ms, 0);
  EXPECT_FALSE(result->oom);
  EXPECT_FALSE(result->timed_out);
}

}  // namespace
}  // namespace quarry::testing

namespace quarry::testing {
namespace {

// DuckDB, Polars and Rust read their memory and CPU limits from the cgroup filesystem; a
// sandbox shows them its own, read-only, so DuckDB spills instead of being OOM-killed.
TEST(Limits, ProgramsInsideSeeTheirLimits) {
  auto spec = ScopedSandbox::default_spec();
  spec.resources.memory_bytes = 512 * kMiB;
  spec.resources.cpus = 1;
  ScopedSandbox sandbox(spec);
  auto result = python(sandbox.id(), R"py(
import duckdb, polars
limit, threads = duckdb.sql("select current_setting('memory_limit'), current_setting('threads')").fetchall()[0]
print(limit, threads, polars.thread_pool_size())
import os
limit_file = '/sys/fs/cgroup/memory.max'  # cgroup v2; v1 below
if not os.path.exists(limit_file):
    limit_file = '/sys/fs/cgroup/memory/memory.limit_in_bytes'
try:
    open(limit_file, 'w').write('1')
except OSError as error:
    print(error.strerror)
)py");
  ASSERT_TRUE(result) << result.error().message;
  ASSERT_EQ(result->exit_code, 0) << result->stderr_text;
  // DuckDB takes 80% of what it finds.
  EXPECT_EQ(result->stdout_text, "409.5 MiB 1 1\nRead-only file system\n");
}

}  // namespace
}  // namespace quarry::testing

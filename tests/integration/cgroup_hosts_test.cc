// quarry on each kind of cgroup host: v1 only (older distributions), v2 only (the default of
// current ones) and hybrid (this machine, which every other test runs on). The same commands run
// on each, as a user runs them, and find the sandbox's limits, its measurements and nothing left
// after it:
//   v1 only  this machine's v1 hierarchies without its cgroup2 mount, in a mount namespace of the
//            test's own;
//   v2 only  a virtual machine booting Debian's kernel with cgroup_no_v1=all (v2_host/boot).
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/command.h"
#include "common/file_util.h"
#include "sandbox/local/cgroup.h"
#include "sandbox/local/image.h"
#include "sandbox_environment.h"

namespace quarry::testing {
namespace {

// What steps.sh runs first: the memory and CPU limits a program in the sandbox reads from its
// cgroup filesystem (v2's file, else v1's: on v1 the sandbox sees only these two hierarchies), as
// many threads as it may start (--pids), then more memory than it may have.
constexpr std::string_view kLimitsCode = R"py(import os, threading, time
def limit(v2, v1):
    return open(v2 if os.path.exists(v2) else v1).read().strip()
print(limit('/sys/fs/cgroup/memory.max', '/sys/fs/cgroup/memory/memory.limit_in_bytes'))
print(limit('/sys/fs/cgroup/cpu.max', '/sys/fs/cgroup/cpu/cpu.cfs_quota_us'))
threads = 0
try:
    while threads < 200:
        threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
        threads += 1
except RuntimeError:
    pass
print(threads, flush=True)
b = b'x' * (512 << 20)
)py";

// The commands, as a shell script run in the work directory, each one's output kept there.
// `quarry`: the command line that runs quarry there, with its state (and cache) directory.
std::string cli_steps(const std::string& quarry) {
  return fmt::format(
      R"sh(q="{}"
$q --log-level debug sandbox run --memory 256MiB --cpus 0.5 --pids 64 --json -- \
  python3 -c "$(cat limits.py)" >run.json 2>run.log
id=$($q sandbox create --memory 512MiB)
echo "$id" >id.txt
$q sandbox exec "$id" -- sh -c 'echo kept >/home/sandbox/kept.txt'
$q sandbox exec "$id" -- cat /home/sandbox/kept.txt >kept.txt
$q sandbox exec --json "$id" -- python3 -c '
import time
while time.process_time() < 0.3: pass' >burn.json
$q sandbox exec --timeout 1s "$id" -- sleep 30 2>timeout.log
echo $? >timeout.status
$q sandbox rm "$id" 2>rm.log
find /sys/fs/cgroup -path "*/quarry/$id*" >left.txt
)sh",
      quarry);
}

enum class Host { kV1Only, kV2Only };

std::string name(const ::testing::TestParamInfo<Host>& info) {
  return info.param == Host::kV1Only ? "V1Only" : "V2Only";
}

class CgroupHosts : public ::testing::TestWithParam<Host> {
 protected:
  void SetUp() override {
    work_ = SandboxEnvironment::get().state_dir() / ("cgroup-host-" + name({GetParam(), 0}));
    std::filesystem::remove_all(work_);
    std::filesystem::create_directories(work_);
    ASSERT_TRUE(write_file(work_ / "limits.py", kLimitsCode));
  }
  void TearDown() override { std::filesystem::remove_all(work_); }

  // Runs `steps` (from the commands it runs quarry and this test binary with) as a shell script
  // in the work directory on the host; the output of each command is then in work_.
  void run(const std::function<std::string(const std::string& quarry, const std::string& tests)>&
               steps) {
    const auto& environment = SandboxEnvironment::get();
    const std::string tests =
        (std::filesystem::path(QUARRY_BUILD_DIR) / "tests/quarry_integration_tests").string();
    CommandOptions options;
    options.working_directory = work_;
    if (GetParam() == Host::kV1Only) {
      auto mounts = sandbox::local::read_cgroup_mounts();
      ASSERT_TRUE(mounts) << mounts.error().message;
      std::string unmount;
      std::vector<sandbox::local::CgroupMount> v1;
      for (const auto& mount : *mounts) {
        if (mount.unified) unmount += fmt::format("umount '{}' && ", mount.mount_point.string());
        if (!mount.unified) v1.push_back(mount);
      }
      if (auto usable = sandbox::local::make_cgroup_driver(v1); !usable) {
        GTEST_SKIP() << "this host's cgroup v1 hierarchies are not enough: "
                     << usable.error().message;
      }
      ASSERT_TRUE(
          write_file(work_ / "steps.sh",
                     steps(fmt::format("{} --state-dir {}", environment.quarry_binary().string(),
                                       environment.state_dir().string()),
                           tests)));
      auto ran = run_command({"unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
                              unmount + "sh ./steps.sh"},
                             options);
      ASSERT_TRUE(ran) << ran.error().message;
      return;
    }
    // The machine sees this machine's files, the quarry image on a disk of its own as the cache
    // directory, and a state directory in its memory.
    auto definition = sandbox::local::default_image_definition(environment.config().sandbox);
    ASSERT_TRUE(definition) << definition.error().message;
    auto image = sandbox::local::ImageStore(environment.cache_dir()).find(*definition);
    ASSERT_TRUE(image) << image.error().message;
    ASSERT_TRUE(write_file(work_ / "steps.sh",
                           steps(fmt::format("{} --state-dir /tmp/state --cache-dir /tmp/cache",
                                             environment.quarry_binary().string()),
                                 "QUARRY_CACHE_DIR=/tmp/cache " + tests)));
    auto booted = run_command({std::string(QUARRY_SOURCE_DIR) + "/tests/integration/v2_host/boot",
                               image->rootfs.parent_path().string(), work_.string()},
                              options);
    ASSERT_TRUE(booted) << booted.error().message;
    auto status = read_file(work_ / "steps.status");
    ASSERT_TRUE(status);
    ASSERT_EQ(*status, "0\n") << *read_file(work_ / "steps.log");
  }

  std::string output(const std::string& file) const {
    auto text = read_file(work_ / file);
    EXPECT_TRUE(text) << file << ": " << text.error().message;
    return text ? *text : "";
  }

  std::filesystem::path work_;
};

TEST_P(CgroupHosts, SandboxesKeepTheirLimitsAreMeasuredAndLeaveNothing) {
  const std::string_view version = GetParam() == Host::kV1Only ? "v1" : "v2";
  run([](const std::string& quarry, const std::string&) { return cli_steps(quarry); });
  if (HasFatalFailure() || IsSkipped()) return;
  EXPECT_NE(output("run.log").find(fmt::format("cgroup {} with memory, cpu, pids", version)),
            std::string::npos)
      << output("run.log");
  // Only the v1 host has no cgroup2 filesystem to set favordynmods on.
  EXPECT_EQ(output("run.log").find("no cgroup2 mount") != std::string::npos, version == "v1")
      << output("run.log");

  // The limits, as the program read them, and the command killed for its memory, measured.
  auto run = nlohmann::json::parse(output("run.json"), nullptr, false);
  ASSERT_TRUE(run.is_object()) << output("run.json") << output("run.log");
  std::istringstream read(run.value("stdout", ""));
  std::string memory, cpu;
  int threads = 0;
  std::getline(read, memory);
  std::getline(read, cpu);
  read >> threads;
  EXPECT_EQ(memory, "268435456") << run.dump();
  EXPECT_EQ(cpu, version == "v2" ? "50000 100000" : "50000");
  EXPECT_GT(threads, 32) << "--pids 64";
  EXPECT_LT(threads, 64) << "--pids 64";
  EXPECT_EQ(run["oom"], true) << run.dump();
  EXPECT_EQ(run["exit_code"], 137);
  EXPECT_EQ(run["memory_limit_bytes"], 256u << 20);
  EXPECT_GT(run["peak_memory_bytes"].get<uint64_t>(), 200u << 20);

  // A sandbox kept between commands: its files stay, each command is measured on its own, the
  // timeout kills, and removing it removes its cgroups.
  EXPECT_EQ(output("kept.txt"), "kept\n");
  auto burn = nlohmann::json::parse(output("burn.json"), nullptr, false);
  ASSERT_TRUE(burn.is_object()) << output("burn.json");
  EXPECT_EQ(burn["exit_code"], 0);
  EXPECT_GE(burn["cpu_ms"].get<double>(), 300);
  EXPECT_EQ(burn["oom"], false);
  EXPECT_EQ(output("timeout.status"), "124\n") << output("timeout.log");
  EXPECT_EQ(output("rm.log"), "");
  EXPECT_EQ(output("left.txt"), "") << "the cgroups of sandbox " << output("id.txt");
}

// The integration tests of limits and of the Python kernel, run on the host (this binary, the
// ones it names): what each measures and enforces through the host's cgroups. In the emulated
// machine, the one of them that times output to the millisecond is left out.
TEST_P(CgroupHosts, TheLimitsAndKernelTestsPassThere) {
  run([&](const std::string&, const std::string& tests) {
    const std::string left_out =
        GetParam() == Host::kV2Only ? "-KernelTest.OutputStreamsWhileTheStepRuns" : "";
    return fmt::format(
        "{} --gtest_filter='Limits.*:KernelTest.*{}' "
        "--gtest_output=json:tests.json >tests.log 2>&1\n",
        tests, left_out);
  });
  if (HasFatalFailure() || IsSkipped()) return;
  auto report = nlohmann::json::parse(output("tests.json"), nullptr, false);
  ASSERT_TRUE(report.is_object()) << output("tests.log");
  std::vector<std::string> failed;
  for (const auto& suite : report["testsuites"]) {
    for (const auto& test : suite["testsuite"]) {
      if (test.contains("failures"))
        failed.push_back(suite["name"].get<std::string>() + "." + test["name"].get<std::string>());
    }
  }
  EXPECT_GE(report.value("tests", 0), 20) << output("tests.log");
  EXPECT_EQ(failed, std::vector<std::string>{}) << output("tests.log");
}

INSTANTIATE_TEST_SUITE_P(Hosts, CgroupHosts, ::testing::Values(Host::kV1Only, Host::kV2Only), name);

}  // namespace
}  // namespace quarry::testing

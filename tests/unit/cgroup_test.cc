// The cgroup drivers on fake cgroupfs trees (plain directories with the control files the
// kernel would create), and host detection from mountinfo samples of v1, v2 and hybrid hosts.
#include "sandbox/local/cgroup.h"

#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/sysmacros.h>

#include <fstream>

#include "common/file_util.h"
#include "common/units.h"

namespace quarry::sandbox::local {
namespace {

// What this project's CI machines mount: v1 controllers beside a nearly empty v2.
constexpr std::string_view kHybridMountinfo =
    "25 30 0:22 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
    "26 25 0:23 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n"
    "27 25 0:24 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct\n"
    "28 25 0:25 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
    "29 25 0:26 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids\n"
    "30 25 0:27 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd\n"
    "31 25 0:28 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n";

constexpr std::string_view kUnifiedMountinfo =
    "22 1 0:20 / / rw - ext4 /dev/vda rw\n"
    "35 24 0:30 / /sys/fs/cgroup rw,nosuid,nodev,noexec shared:9 - cgroup2 cgroup2 "
    "rw,nsdelegate,memory_recursiveprot\n";

constexpr std::string_view kComountedMountinfo =
    "40 25 0:33 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n"
    "41 25 0:34 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
    "42 25 0:35 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids\n";

TEST(CgroupDetection, ParsesV1ControllersAndTheV2Mount) {
  auto mounts = parse_cgroup_mounts(kHybridMountinfo);
  ASSERT_EQ(mounts.size(), 6u);
  EXPECT_EQ(mounts[0].mount_point, "/sys/fs/cgroup/cpu");
  EXPECT_EQ(mounts[0].controllers, std::vector<std::string>{"cpu"});
  EXPECT_TRUE(mounts[4].controllers.empty());  // name=systemd is not a controller
  EXPECT_TRUE(mounts[5].unified);
  EXPECT_EQ(mounts[5].mount_point, "/sys/fs/cgroup/unified");
}

TEST(CgroupDetection, HybridHostWithEmptyV2UsesV1) {
  auto mounts = parse_cgroup_mounts(kHybridMountinfo);
  mounts[5].controllers = {"hugetlb"};  // what cgroup.controllers says on such a host
  auto driver = make_cgroup_driver(mounts);
  ASSERT_TRUE(driver) << driver.error().message;
  EXPECT_EQ((*driver)->version(), "v1");
  // hugetlb, mounted in no v1 hierarchy, is limited in the unified one.
  EXPECT_EQ((*driver)->optional_controllers(), std::vector<std::string>{"hugetlb (cgroup2)"});
}

TEST(CgroupDetection, UnifiedHostUsesV2) {
  auto mounts = parse_cgroup_mounts(kUnifiedMountinfo);
  ASSERT_EQ(mounts.size(), 1u);
  mounts[0].controllers = {"cpuset", "cpu", "io", "memory", "pids"};
  auto driver = make_cgroup_driver(mounts);
  ASSERT_TRUE(driver) << driver.error().message;
  EXPECT_EQ((*driver)->version(), "v2");
  EXPECT_EQ((*driver)->optional_controllers(), std::vector<std::string>{"io"});
}

TEST(CgroupDetection, CoMountedCpuAndCpuacctWork) {
  auto driver = make_cgroup_driver(parse_cgroup_mounts(kComountedMountinfo));
  ASSERT_TRUE(driver) << driver.error().message;
  EXPECT_EQ((*driver)->version(), "v1");
  // Inside the sandbox the hierarchy is mounted under its own name, with an alias per
  // controller, as systemd does.
  auto mounts = (*driver)->sandbox_mounts();
  ASSERT_EQ(mounts.size(), 2u);
  EXPECT_EQ(mounts[0].target, "/sys/fs/cgroup/memory");
  EXPECT_EQ(mounts[0].options, "memory");
  EXPECT_EQ(mounts[1].target, "/sys/fs/cgroup/cpu,cpuacct");
  EXPECT_EQ(mounts[1].options, "cpu,cpuacct");
  EXPECT_EQ(mounts[1].aliases, (std::vector<std::string>{"cpu", "cpuacct"}));
}

TEST(CgroupDetection, UnifiedHostMountsOneHierarchy) {
  auto mounts = parse_cgroup_mounts(kUnifiedMountinfo);
  mounts[0].controllers = {"memory", "cpu", "pids"};
  auto mounted = (*make_cgroup_driver(mounts))->sandbox_mounts();
  ASSERT_EQ(mounted.size(), 1u);
  EXPECT_EQ(mounted[0].type, "cgroup2");
  EXPECT_EQ(mounted[0].target, "/sys/fs/cgroup");
}

TEST(CgroupDetection, MissingControllersAreNamed) {
  auto mounts = parse_cgroup_mounts(
      "26 25 0:23 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
      "31 25 0:28 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n");
  auto driver = make_cgroup_driver(mounts);
  ASSERT_FALSE(driver);
  EXPECT_EQ(driver.error().code, ErrorCode::kFailedPrecondition);
  EXPECT_NE(driver.error().message.find("cpu, cpuacct, pids"), std::string::npos)
      << driver.error().message;
}

TEST(CgroupDetection, FavordynmodsKeepsTheMountsOtherOptions) {
  auto mounts = parse_cgroup_mounts(kUnifiedMountinfo);
  ASSERT_EQ(mounts.size(), 1u);
  auto remount = favordynmods_remount(mounts[0]);
  ASSERT_TRUE(remount);
  EXPECT_EQ(remount->flags, MS_REMOUNT | MS_NOSUID | MS_NODEV | MS_NOEXEC);
  EXPECT_EQ(remount->data, "nsdelegate,memory_recursiveprot,favordynmods");
  // Already set: nothing to do.
  auto tuned = parse_cgroup_mounts(
      "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw,favordynmods\n");
  EXPECT_FALSE(favordynmods_remount(tuned[0]));
  auto hybrid = parse_cgroup_mounts(kHybridMountinfo);
  auto plain = favordynmods_remount(hybrid.back());
  ASSERT_TRUE(plain);
  EXPECT_EQ(plain->flags, MS_REMOUNT | MS_RELATIME);
  EXPECT_EQ(plain->data, "favordynmods");
}

TEST(CgroupDetection, UnescapesMountPoints) {
  auto mounts = parse_cgroup_mounts("26 25 0:23 / /sys/fs/my\\040cgroup rw - cgroup2 cgroup2 rw\n");
  ASSERT_EQ(mounts.size(), 1u);
  EXPECT_EQ(mounts[0].mount_point, "/sys/fs/my cgroup");
}

class FakeCgroupTree : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ =
        std::filesystem::temp_directory_path() / fmt::format("quarry-fake-cgroup-{}", ::getpid());
    std::filesystem::remove_all(root_);
  }
  void TearDown() override { std::filesystem::remove_all(root_); }

  // Creates `dir` with the control files the kernel would give it.
  void make_cgroup(const std::filesystem::path& dir, std::initializer_list<std::string> files,
                   const std::map<std::string, std::string>& contents = {}) {
    std::filesystem::create_directories(dir);
    for (const auto& file : files) {
      auto found = contents.find(file);
      std::ofstream(dir / file) << (found == contents.end() ? "" : found->second);
    }
  }

  std::string read(const std::filesystem::path& path) { return *read_file(path); }

  // One v1 hierarchy per controller, as a hybrid host mounts them.
  CgroupV1Paths v1_paths() const {
    CgroupV1Paths paths;
    paths.memory = root_ / "memory";
    paths.cpu = root_ / "cpu";
    paths.cpuacct = root_ / "cpuacct";
    paths.pids = root_ / "pids";
    return paths;
  }

  std::filesystem::path root_;
};

TEST_F(FakeCgroupTree, V2CreateSetsLimitsAndDelegatesControllers) {
  const std::initializer_list<std::string> files = {"cgroup.subtree_control",
                                                    "cgroup.procs",
                                                    "memory.max",
                                                    "memory.swap.max",
                                                    "cpu.max",
                                                    "pids.max",
                                                    "memory.peak",
                                                    "memory.events",
                                                    "cpu.stat",
                                                    "cgroup.kill"};
  make_cgroup(root_, {"cgroup.subtree_control"});
  make_cgroup(root_ / "quarry", files);
  make_cgroup(root_ / "quarry/sb1", files);
  make_cgroup(root_ / "quarry/sb1/init", files);
  auto driver = make_cgroup_v2(root_, "quarry");

  ASSERT_TRUE(driver->create_sandbox("sb1", {512ull << 20, 1.5, 64, {}}));
  EXPECT_EQ(read(root_ / "cgroup.subtree_control"), "+memory +cpu +pids");
  EXPECT_EQ(read(root_ / "quarry/cgroup.subtree_control"), "+memory +cpu +pids");
  EXPECT_EQ(read(root_ / "quarry/sb1/memory.max"), std::to_string(512ull << 20));
  EXPECT_EQ(read(root_ / "quarry/sb1/memory.swap.max"), "0");
  EXPECT_EQ(read(root_ / "quarry/sb1/cpu.max"), "150000 100000");
  EXPECT_EQ(read(root_ / "quarry/sb1/pids.max"), "64");

  ASSERT_TRUE(driver->enter_sandbox("sb1", 4242));
  EXPECT_EQ(read(root_ / "quarry/sb1/cgroup.procs"), "4242");
  ASSERT_TRUE(driver->enter_init("sb1", 4242));
  EXPECT_EQ(read(root_ / "quarry/sb1/init/cgroup.procs"), "4242");
  // Only after init left the sandbox's own cgroup may it delegate to exec children.
  EXPECT_EQ(read(root_ / "quarry/sb1/cgroup.subtree_control"), "+memory +cpu +pids");
}

TEST_F(FakeCgroupTree, V2ThrottlesTheVolumeAndAllowsNoHugePages) {
  const std::initializer_list<std::string> files = {"cgroup.subtree_control",
                                                    "cgroup.procs",
                                                    "memory.max",
                                                    "cpu.max",
                                                    "pids.max",
                                                    "io.max",
                                                    "hugetlb.2MB.max",
                                                    "hugetlb.1GB.max",
                                                    "hugetlb.2MB.rsvd.max",
                                                    "hugetlb.2MB.current",
                                                    "hugetlb.1GB.events"};
  make_cgroup(root_, {"cgroup.subtree_control"});
  make_cgroup(root_ / "quarry", files);
  make_cgroup(root_ / "quarry/sb1", files);
  make_cgroup(root_ / "quarry/sb1/init", {"cgroup.procs"});
  auto driver = make_cgroup_v2(root_, "quarry", {"cpu", "io", "memory", "pids", "hugetlb"});
  CgroupLimits limits{kGiB, 1, 64, {{makedev(7, 3), 256 * kMiB, 128 * kMiB, 4000, 0}}};
  ASSERT_TRUE(driver->create_sandbox("sb1", limits));
  EXPECT_EQ(read(root_ / "cgroup.subtree_control"), "+memory +cpu +pids +io +hugetlb");
  EXPECT_EQ(read(root_ / "quarry/cgroup.subtree_control"), "+memory +cpu +pids +io +hugetlb");
  EXPECT_EQ(read(root_ / "quarry/sb1/io.max"),
            "7:3 rbps=268435456 wbps=134217728 riops=4000 wiops=max");
  for (const char* file : {"hugetlb.2MB.max", "hugetlb.1GB.max", "hugetlb.2MB.rsvd.max"}) {
    EXPECT_EQ(read(root_ / "quarry/sb1" / file), "0") << file;
  }
  EXPECT_EQ(read(root_ / "quarry/sb1/hugetlb.2MB.current"), "");
  // Exec cgroups get what metering needs, nothing more.
  ASSERT_TRUE(driver->enter_init("sb1", 4242));
  EXPECT_EQ(read(root_ / "quarry/sb1/cgroup.subtree_control"), "+memory +cpu +pids");
}

TEST_F(FakeCgroupTree, V1ThrottlesWithBlkioAndLimitsHugetlbInTheUnifiedHierarchy) {
  CgroupV1Paths paths = v1_paths();
  paths.blkio = root_ / "blkio";
  paths.unified_hugetlb = root_ / "unified";
  make_cgroup(paths.memory / "quarry/sb1", {"cgroup.procs", "memory.limit_in_bytes"});
  make_cgroup(paths.cpu / "quarry/sb1", {"cgroup.procs", "cpu.cfs_period_us", "cpu.cfs_quota_us"});
  make_cgroup(paths.pids / "quarry/sb1", {"cgroup.procs", "pids.max"});
  make_cgroup(paths.cpuacct / "quarry/sb1", {"cgroup.procs"});
  make_cgroup(paths.blkio / "quarry/sb1",
              {"cgroup.procs", "blkio.throttle.read_bps_device", "blkio.throttle.write_bps_device",
               "blkio.throttle.read_iops_device", "blkio.throttle.write_iops_device"});
  make_cgroup(paths.unified_hugetlb, {"cgroup.subtree_control"});
  make_cgroup(paths.unified_hugetlb / "quarry", {"cgroup.subtree_control"});
  make_cgroup(paths.unified_hugetlb / "quarry/sb1",
              {"cgroup.procs", "hugetlb.2MB.max", "hugetlb.2MB.rsvd.max"});
  auto driver = make_cgroup_v1(paths, "quarry");
  EXPECT_EQ(driver->optional_controllers(),
            (std::vector<std::string>{"blkio", "hugetlb (cgroup2)"}));
  CgroupLimits limits{kGiB, 1, 64, {{makedev(7, 3), 256 * kMiB, 0, 4000, 4000}}};
  auto created = driver->create_sandbox("sb1", limits);
  ASSERT_TRUE(created) << created.error().message;
  // v1 throttling is not hierarchical: the rules are where init and the commands are.
  auto blkio = paths.blkio / "quarry/sb1";
  EXPECT_EQ(read(blkio / "blkio.throttle.read_bps_device"), "7:3 268435456");
  EXPECT_EQ(read(blkio / "blkio.throttle.write_bps_device"), "");  // 0: no limit
  EXPECT_EQ(read(blkio / "blkio.throttle.read_iops_device"), "7:3 4000");
  EXPECT_EQ(read(blkio / "blkio.throttle.write_iops_device"), "7:3 4000");
  EXPECT_EQ(read(paths.unified_hugetlb / "cgroup.subtree_control"), "+hugetlb");
  EXPECT_EQ(read(paths.unified_hugetlb / "quarry/cgroup.subtree_control"), "+hugetlb");
  EXPECT_EQ(read(paths.unified_hugetlb / "quarry/sb1/hugetlb.2MB.max"), "0");
  EXPECT_EQ(read(paths.unified_hugetlb / "quarry/sb1/hugetlb.2MB.rsvd.max"), "0");
  // init is in the sandbox's cgroup of every hierarchy, the unified one too, and stays there.
  ASSERT_TRUE(driver->enter_sandbox("sb1", 77));
  ASSERT_TRUE(driver->enter_init("sb1", 77));
  EXPECT_EQ(read(blkio / "cgroup.procs"), "77");
  EXPECT_EQ(read(paths.unified_hugetlb / "quarry/sb1/cgroup.procs"), "77");
  EXPECT_FALSE(std::filesystem::exists(paths.unified_hugetlb / "quarry/sb1/init"));
}

TEST_F(FakeCgroupTree, V2ReadsExecCountersFromTheExecCgroup) {
  make_cgroup(root_ / "quarry/sb1/exec-1",
              {"cgroup.procs", "memory.peak", "memory.events", "cpu.stat", "memory.max", "cpu.max"},
              {{"memory.peak", "268435456\n"},
               {"memory.events", "low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\noom_group_kill 0\n"},
               {"cpu.stat", "usage_usec 1500\nuser_usec 1000\nsystem_usec 500\n"}});
  auto driver = make_cgroup_v2(root_, "quarry");
  auto fds = driver->create_exec("sb1", "exec-1", {256ull << 20, 0.5, 64, {}});
  ASSERT_TRUE(fds) << fds.error().message;
  EXPECT_EQ(fds->size(), 1u);
  // The sandbox's limits are repeated where the exec's processes look for them.
  EXPECT_EQ(read(root_ / "quarry/sb1/exec-1/memory.max"), std::to_string(256ull << 20));
  EXPECT_EQ(read(root_ / "quarry/sb1/exec-1/cpu.max"), "50000 100000");
  auto counters = driver->exec_counters("sb1", "exec-1");
  ASSERT_TRUE(counters) << counters.error().message;
  EXPECT_EQ(counters->peak_memory_bytes, 268435456u);
  EXPECT_EQ(counters->oom_kills, 1u);
  EXPECT_EQ(counters->cpu_usage_ns, 1500u * 1000);
}

TEST_F(FakeCgroupTree, V1CreateWritesEachHierarchy) {
  CgroupV1Paths paths = v1_paths();
  make_cgroup(paths.memory / "quarry/sb1", {"cgroup.procs", "memory.limit_in_bytes",
                                            "memory.memsw.limit_in_bytes", "memory.swappiness"});
  make_cgroup(paths.cpu / "quarry/sb1", {"cgroup.procs", "cpu.cfs_period_us", "cpu.cfs_quota_us"});
  make_cgroup(paths.cpuacct / "quarry/sb1", {"cgroup.procs"});
  make_cgroup(paths.pids / "quarry/sb1", {"cgroup.procs", "pids.max"});
  auto driver = make_cgroup_v1(paths, "quarry");
  ASSERT_TRUE(driver->create_sandbox("sb1", {kGiB, 0.5, 100, {}}));
  EXPECT_EQ(read(paths.memory / "quarry/sb1/memory.limit_in_bytes"), std::to_string(kGiB));
  EXPECT_EQ(read(paths.memory / "quarry/sb1/memory.memsw.limit_in_bytes"), std::to_string(kGiB));
  EXPECT_EQ(read(paths.memory / "quarry/sb1/memory.swappiness"), "0");
  EXPECT_EQ(read(paths.cpu / "quarry/sb1/cpu.cfs_quota_us"), "50000");
  EXPECT_EQ(read(paths.cpu / "quarry/sb1/cpu.cfs_period_us"), "100000");
  EXPECT_EQ(read(paths.pids / "quarry/sb1/pids.max"), "100");
  // v1 allows processes beside child cgroups: init stays in <sandbox>, with no leaf of its own.
  ASSERT_TRUE(driver->enter_sandbox("sb1", 77));
  ASSERT_TRUE(driver->enter_init("sb1", 77));
  for (const auto& hierarchy : {paths.memory, paths.cpu, paths.cpuacct, paths.pids}) {
    EXPECT_EQ(read(hierarchy / "quarry/sb1/cgroup.procs"), "77");
    EXPECT_FALSE(std::filesystem::exists(hierarchy / "quarry/sb1/init"));
  }
}

TEST_F(FakeCgroupTree, V1ExecCgroupsAreInMemoryAndCpuacct) {
  CgroupV1Paths paths = v1_paths();
  make_cgroup(
      paths.memory / "quarry/sb1/exec-1",
      {"cgroup.procs", "memory.max_usage_in_bytes", "memory.oom_control", "memory.limit_in_bytes"},
      {{"memory.max_usage_in_bytes", "1048576\n"},
       {"memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n"}});
  make_cgroup(paths.cpuacct / "quarry/sb1/exec-1", {"cgroup.procs", "cpuacct.usage"},
              {{"cpuacct.usage", "123456789\n"}});
  make_cgroup(paths.cpu / "quarry/sb1/exec-1",
              {"cgroup.procs", "cpu.cfs_period_us", "cpu.cfs_quota_us"});
  auto driver = make_cgroup_v1(paths, "quarry");
  auto fds = driver->create_exec("sb1", "exec-1", {kGiB, 2, 64, {}});
  ASSERT_TRUE(fds) << fds.error().message;
  EXPECT_EQ(fds->size(), 3u);  // memory, cpuacct, cpu
  EXPECT_EQ(read(paths.memory / "quarry/sb1/exec-1/memory.limit_in_bytes"), std::to_string(kGiB));
  EXPECT_EQ(read(paths.cpu / "quarry/sb1/exec-1/cpu.cfs_quota_us"), "200000");
  EXPECT_FALSE(std::filesystem::exists(paths.pids / "quarry/sb1/exec-1"));
  auto counters = driver->exec_counters("sb1", "exec-1");
  ASSERT_TRUE(counters) << counters.error().message;
  EXPECT_EQ(counters->peak_memory_bytes, 1048576u);
  EXPECT_EQ(counters->oom_kills, 2u);
  EXPECT_EQ(counters->cpu_usage_ns, 123456789u);
}

// A process that runs step after step (the Python kernel) has its peak memory started anew
// before each step, and read from the file that was reset.
TEST_F(FakeCgroupTree, ThePeakOfAnExecIsResetForItsNextStep) {
  CgroupV1Paths paths = v1_paths();
  // (A regular file stands in for the cgroup's: one digit, which the reset's 0 overwrites.)
  make_cgroup(paths.memory / "quarry/sb1/exec-1", {"cgroup.procs", "memory.max_usage_in_bytes"},
              {{"memory.max_usage_in_bytes", "7\n"}});
  auto v1 = make_cgroup_v1(paths, "quarry");
  auto peak = v1->reset_peak("sb1", "exec-1");
  ASSERT_TRUE(peak) << peak.error().message;
  EXPECT_EQ(read(paths.memory / "quarry/sb1/exec-1/memory.max_usage_in_bytes"), "0\n");
  auto since = cgroup_files::read_number_at(peak->get());
  ASSERT_TRUE(since) << since.error().message;
  EXPECT_EQ(*since, 0u);

  make_cgroup(root_ / "quarry/sb1/exec-1", {"cgroup.procs", "memory.peak"},
              {{"memory.peak", "268435456\n"}});
  auto v2 = make_cgroup_v2(root_, "quarry");
  ASSERT_TRUE(v2->reset_peak("sb1", "exec-1"));
  EXPECT_TRUE(read(root_ / "quarry/sb1/exec-1/memory.peak").starts_with("reset"));
  EXPECT_FALSE(v1->reset_peak("sb1", "no-such-exec"));
}

TEST(CgroupFiles, ReadsNumbersAndKeyedValues) {
  auto dir = std::filesystem::temp_directory_path() / fmt::format("quarry-cg-{}", ::getpid());
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "max") << "max\n";
  std::ofstream(dir / "n") << "42\n";
  std::ofstream(dir / "keyed") << "oom 3\noom_kill 1\n";
  EXPECT_EQ(*cgroup_files::read_number(dir / "max"), UINT64_MAX);
  EXPECT_EQ(*cgroup_files::read_number(dir / "n"), 42u);
  EXPECT_EQ(*cgroup_files::read_keyed(dir / "keyed", "oom_kill"), 1u);
  EXPECT_EQ(*cgroup_files::read_keyed(dir / "keyed", "oom"), 3u);
  EXPECT_FALSE(cgroup_files::read_keyed(dir / "keyed", "nothing"));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace quarry::sandbox::local

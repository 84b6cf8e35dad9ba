// cgroup v2 (unified hierarchy): limits and per-exec metering with memory.max, cpu.max,
// pids.max, memory.peak, memory.events and cpu.stat; io.max and hugetlb.<size>.max where the
// host has those controllers.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>

#include "common/file_util.h"
#include "sandbox/local/cgroup.h"

namespace quarry::sandbox::local {
namespace {

// What exec cgroups need; a sandbox's own cgroup may also have io and hugetlb.
constexpr std::string_view kControllers = "+memory +cpu +pids";
constexpr uint64_t kCpuPeriodUs = 100'000;

// One line of io.max: "8:16 rbps=2097152 wbps=max riops=max wiops=120".
std::string io_max_line(const IoLimit& limit) {
  auto value = [](uint64_t number) { return number == 0 ? "max" : std::to_string(number); };
  return fmt::format("{}:{} rbps={} wbps={} riops={} wiops={}", major(limit.device),
                     minor(limit.device), value(limit.read_bps), value(limit.write_bps),
                     value(limit.read_iops), value(limit.write_iops));
}

class CgroupV2 final : public CgroupDriver {
 public:
  CgroupV2(std::filesystem::path root, std::string parent,
           const std::vector<std::string>& controllers)
      : root_(std::move(root)),
        parent_(root_ / parent),
        io_(std::ranges::find(controllers, "io") != controllers.end()),
        hugetlb_(std::ranges::find(controllers, "hugetlb") != controllers.end()) {}

  std::string_view version() const override { return "v2"; }

  std::vector<std::string> optional_controllers() const override {
    std::vector<std::string> controllers;
    if (io_) controllers.emplace_back("io");
    if (hugetlb_) controllers.emplace_back("hugetlb");
    return controllers;
  }

  Result<void> create_sandbox(std::string_view sandbox, const CgroupLimits& limits) override {
    RETURN_IF_ERROR(ensure_parent());
    auto dir = sandbox_dir(sandbox);
    RETURN_IF_ERROR(make_cgroup(dir));
    RETURN_IF_ERROR(set_limits(dir, limits));
    RETURN_IF_ERROR(write_control_file(dir / "pids.max", std::to_string(limits.pids)));
    if (io_) {
      for (const auto& limit : limits.io) {
        RETURN_IF_ERROR(write_control_file(dir / "io.max", io_max_line(limit)));
      }
    }
    if (hugetlb_) {
      // No huge pages: they come from a pool the host set aside, outside the memory limit.
      RETURN_IF_ERROR(cgroup_files::write_each(dir, "hugetlb.", ".max", "0"));
    }
    return make_cgroup(dir / "init");
  }

  Result<void> enter_sandbox(std::string_view sandbox, pid_t pid) override {
    return write_control_file(sandbox_dir(sandbox) / "cgroup.procs", std::to_string(pid));
  }

  Result<void> enter_init(std::string_view sandbox, pid_t pid) override {
    auto dir = sandbox_dir(sandbox);
    RETURN_IF_ERROR(write_control_file(dir / "init" / "cgroup.procs", std::to_string(pid)));
    // Only now that <sandbox> holds no process may it delegate controllers to its children
    // (the "no internal processes" rule); exec cgroups need memory and cpu accounting.
    return write_control_file(dir / "cgroup.subtree_control", kControllers);
  }

  Result<std::vector<UniqueFd>> create_exec(std::string_view sandbox, std::string_view exec,
                                            const CgroupLimits& limits) override {
    auto dir = sandbox_dir(sandbox) / exec;
    RETURN_IF_ERROR(make_cgroup(dir));
    RETURN_IF_ERROR(set_limits(dir, limits));
    UniqueFd procs(::open((dir / "cgroup.procs").c_str(), O_WRONLY | O_CLOEXEC));
    if (!procs) return errno_error("open '{}'", (dir / "cgroup.procs").string());
    std::vector<UniqueFd> fds;
    fds.push_back(std::move(procs));
    return fds;
  }

  Result<ExecCounters> exec_counters(std::string_view sandbox, std::string_view exec) override {
    auto dir = sandbox_dir(sandbox) / exec;
    ExecCounters counters;
    ASSIGN_OR_RETURN(counters.peak_memory_bytes, cgroup_files::read_number(dir / "memory.peak"));
    ASSIGN_OR_RETURN(counters.oom_kills,
                     cgroup_files::read_keyed(dir / "memory.events", "oom_kill"));
    ASSIGN_OR_RETURN(auto usage_us, cgroup_files::read_keyed(dir / "cpu.stat", "usage_usec"));
    counters.cpu_usage_ns = usage_us * 1000;
    return counters;
  }

  Result<UniqueFd> reset_peak(std::string_view sandbox, std::string_view exec) override {
    const auto path = sandbox_dir(sandbox) / exec / "memory.peak";
    UniqueFd file(::open(path.c_str(), O_RDWR | O_CLOEXEC));
    if (!file || ::write(file.get(), "reset\n", 6) != 6) {
      if (errno == EACCES || errno == EINVAL || errno == EPERM || errno == EBADF) {
        return make_error(ErrorCode::kFailedPrecondition,
                          "this kernel cannot reset '{}' (Linux 6.12 and later can)",
                          path.string());
      }
      return errno_error("resetting '{}'", path.string());
    }
    return file;
  }

  Result<std::vector<pid_t>> exec_processes(std::string_view sandbox,
                                            std::string_view exec) override {
    return cgroup_files::read_procs(sandbox_dir(sandbox) / exec / "cgroup.procs");
  }

  Result<void> kill_exec(std::string_view sandbox, std::string_view exec) override {
    return kill_tree(sandbox_dir(sandbox) / exec);
  }

  std::vector<std::string> execs(std::string_view sandbox) const override {
    return cgroup_files::exec_children(sandbox_dir(sandbox));
  }

  Result<void> remove_exec(std::string_view sandbox, std::string_view exec) override {
    auto dir = sandbox_dir(sandbox) / exec;
    RETURN_IF_ERROR(kill_tree(dir));
    return cgroup_files::remove_tree(dir);
  }

  Result<void> remove_sandbox(std::string_view sandbox) override {
    auto dir = sandbox_dir(sandbox);
    if (!std::filesystem::exists(dir)) return {};
    RETURN_IF_ERROR(kill_tree(dir));
    return cgroup_files::remove_tree(dir);
  }

  Result<uint64_t> memory_usage(std::string_view sandbox) const override {
    return cgroup_files::read_number(sandbox_dir(sandbox) / "memory.current");
  }

  std::vector<protocol::CgroupMount> sandbox_mounts() const override {
    return {{"cgroup2", "", "/sys/fs/cgroup", {}}};
  }

  bool sandbox_exists(std::string_view sandbox) const override {
    return std::filesystem::exists(sandbox_dir(sandbox));
  }

 private:
  std::filesystem::path sandbox_dir(std::string_view sandbox) const { return parent_ / sandbox; }

  // Memory without swap and the CPU quota.
  static Result<void> set_limits(const std::filesystem::path& dir, const CgroupLimits& limits) {
    RETURN_IF_ERROR(write_control_file(dir / "memory.max", std::to_string(limits.memory_bytes)));
    // No swap: without this a memory-hungry exec would crawl in swap instead of being told.
    if (std::filesystem::exists(dir / "memory.swap.max")) {
      RETURN_IF_ERROR(write_control_file(dir / "memory.swap.max", "0"));
    }
    auto quota = static_cast<uint64_t>(std::llround(limits.cpus * kCpuPeriodUs));
    return write_control_file(dir / "cpu.max", fmt::format("{} {}", quota, kCpuPeriodUs));
  }

  static Result<void> make_cgroup(const std::filesystem::path& dir) {
    if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
      return errno_error("mkdir '{}'", dir.string());
    }
    return {};
  }

  Result<void> ensure_parent() {
    if (parent_ready_) return {};
    // What the parents delegate to sandboxes: what exec cgroups need, and io and hugetlb.
    std::string controllers(kControllers);
    if (io_) controllers += " +io";
    if (hugetlb_) controllers += " +hugetlb";
    RETURN_IF_ERROR(with_context(write_control_file(root_ / "cgroup.subtree_control", controllers),
                                 fmt::format("enabling '{}' for child cgroups", controllers)));
    RETURN_IF_ERROR(make_cgroup(parent_));
    RETURN_IF_ERROR(write_control_file(parent_ / "cgroup.subtree_control", controllers));
    parent_ready_ = true;
    return {};
  }

  // cgroup.kill (Linux 5.14) kills the whole subtree atomically; before it, kill by pid.
  static Result<void> kill_tree(const std::filesystem::path& dir) {
    if (!std::filesystem::exists(dir)) return {};
    if (std::filesystem::exists(dir / "cgroup.kill")) {
      return write_control_file(dir / "cgroup.kill", "1");
    }
    std::error_code error;
    for (const auto& entry : std::filesystem::directory_iterator(dir, error)) {
      if (entry.is_directory()) RETURN_IF_ERROR(kill_tree(entry.path()));
    }
    return cgroup_files::kill_all(dir / "cgroup.procs");
  }

  std::filesystem::path root_;
  std::filesystem::path parent_;
  const bool io_;                           // the host has the io controller
  const bool hugetlb_;                      // and the hugetlb controller
  std::atomic<bool> parent_ready_ = false;  // creates may run on several threads
};

}  // namespace

std::unique_ptr<CgroupDriver> make_cgroup_v2(std::filesystem::path root, std::string parent,
                                             std::vector<std::string> controllers) {
  return std::make_unique<CgroupV2>(std::move(root), std::move(parent), std::move(controllers));
}

}  // namespace quarry::sandbox::local

// cgroup v1 (one hierarchy per controller, as on hybrid hosts): limits with
// memory.limit_in_bytes, cpu.cfs_quota_us and pids.max, and where mounted blkio.throttle.* and
// hugetlb.<size>.limit_in_bytes (or hugetlb.<size>.max in a hybrid host's unified hierarchy);
// per-exec metering with memory.max_usage_in_bytes, memory.oom_control and cpuacct.usage.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <set>

#include "common/file_util.h"
#include "sandbox/local/cgroup.h"

namespace quarry::sandbox::local {
namespace {

constexpr uint64_t kCpuPeriodUs = 100'000;

class CgroupV1 final : public CgroupDriver {
 public:
  CgroupV1(CgroupV1Paths roots, std::string parent) : roots_(std::move(roots)), parent_(parent) {
    // cpu and cpuacct are often mounted together ("cpu,cpuacct"); touch each hierarchy once.
    std::set<std::filesystem::path> seen;
    for (const auto& root : {roots_.memory, roots_.cpu, roots_.cpuacct, roots_.pids, roots_.blkio,
                             roots_.hugetlb, roots_.unified_hugetlb}) {
      if (!root.empty() && seen.insert(root).second) hierarchies_.push_back(root);
    }
    // Exec cgroups: memory and cpuacct measure the exec; memory and cpu repeat the sandbox's
    // limits where the exec's own processes look for them.
    for (const auto& root : {roots_.memory, roots_.cpuacct, roots_.cpu}) {
      if (std::find(exec_hierarchies_.begin(), exec_hierarchies_.end(), root) ==
          exec_hierarchies_.end()) {
        exec_hierarchies_.push_back(root);
      }
    }
  }

  std::string_view version() const override { return "v1"; }

  std::vector<std::string> optional_controllers() const override {
    std::vector<std::string> controllers;
    if (!roots_.blkio.empty()) controllers.emplace_back("blkio");
    if (!roots_.hugetlb.empty()) controllers.emplace_back("hugetlb");
    if (!roots_.unified_hugetlb.empty()) controllers.emplace_back("hugetlb (cgroup2)");
    return controllers;
  }

  Result<void> create_sandbox(std::string_view sandbox, const CgroupLimits& limits) override {
    RETURN_IF_ERROR(ensure_unified_parent());
    for (const auto& root : hierarchies_) {
      RETURN_IF_ERROR(make_cgroup(root / parent_));
      RETURN_IF_ERROR(make_cgroup(root / parent_ / sandbox));
    }
    RETURN_IF_ERROR(set_limits(std::filesystem::path(parent_) / sandbox, limits));
    RETURN_IF_ERROR(write_control_file(roots_.pids / parent_ / sandbox / "pids.max",
                                       std::to_string(limits.pids)));
    if (!roots_.blkio.empty()) {
      // v1 throttles each cgroup by its own rules only, not its parent's: the rules go where
      // the sandbox's processes are (exec cgroups are not made in this hierarchy).
      auto blkio = roots_.blkio / parent_ / sandbox;
      for (const auto& limit : limits.io) {
        const std::pair<const char*, uint64_t> throttles[] = {
            {"blkio.throttle.read_bps_device", limit.read_bps},
            {"blkio.throttle.write_bps_device", limit.write_bps},
            {"blkio.throttle.read_iops_device", limit.read_iops},
            {"blkio.throttle.write_iops_device", limit.write_iops}};
        for (const auto& [file, value] : throttles) {
          if (value == 0) continue;
          RETURN_IF_ERROR(write_control_file(
              blkio / file,
              fmt::format("{}:{} {}", major(limit.device), minor(limit.device), value)));
        }
      }
    }
    // No huge pages: they come from a pool the host set aside, outside the memory limit.
    if (!roots_.hugetlb.empty()) {
      RETURN_IF_ERROR(cgroup_files::write_each(roots_.hugetlb / parent_ / sandbox, "hugetlb.",
                                               ".limit_in_bytes", "0"));
    }
    if (!roots_.unified_hugetlb.empty()) {
      RETURN_IF_ERROR(cgroup_files::write_each(roots_.unified_hugetlb / parent_ / sandbox,
                                               "hugetlb.", ".max", "0"));
    }
    return {};
  }

  Result<void> enter_sandbox(std::string_view sandbox, pid_t pid) override {
    for (const auto& root : hierarchies_) {
      RETURN_IF_ERROR(
          write_control_file(root / parent_ / sandbox / "cgroup.procs", std::to_string(pid)));
    }
    return {};
  }

  // v1 lets a cgroup hold processes beside child cgroups, so init stays in <sandbox>: no
  // leaf to make, move it into and remove in each hierarchy. (A hybrid host's unified
  // hierarchy, hugetlb only, delegates nothing below <sandbox>, which the rule needs.)
  Result<void> enter_init(std::string_view, pid_t) override { return {}; }

  Result<std::vector<UniqueFd>> create_exec(std::string_view sandbox, std::string_view exec,
                                            const CgroupLimits& limits) override {
    for (const auto& root : exec_hierarchies_) {
      RETURN_IF_ERROR(make_cgroup(root / parent_ / sandbox / exec));
    }
    RETURN_IF_ERROR(set_limits(std::filesystem::path(parent_) / sandbox / exec, limits));
    std::vector<UniqueFd> fds;
    for (const auto& root : exec_hierarchies_) {
      auto dir = root / parent_ / sandbox / exec;
      UniqueFd procs(::open((dir / "cgroup.procs").c_str(), O_WRONLY | O_CLOEXEC));
      if (!procs) return errno_error("open '{}'", (dir / "cgroup.procs").string());
      fds.push_back(std::move(procs));
    }
    return fds;
  }

  Result<ExecCounters> exec_counters(std::string_view sandbox, std::string_view exec) override {
    auto memory = roots_.memory / parent_ / sandbox / exec;
    ExecCounters counters;
    ASSIGN_OR_RETURN(counters.peak_memory_bytes,
                     cgroup_files::read_number(memory / "memory.max_usage_in_bytes"));
    ASSIGN_OR_RETURN(counters.oom_kills,
                     cgroup_files::read_keyed(memory / "memory.oom_control", "oom_kill"));
    ASSIGN_OR_RETURN(
        counters.cpu_usage_ns,
        cgroup_files::read_number(roots_.cpuacct / parent_ / sandbox / exec / "cpuacct.usage"));
    return counters;
  }

  Result<UniqueFd> reset_peak(std::string_view sandbox, std::string_view exec) override {
    const auto path = roots_.memory / parent_ / sandbox / exec / "memory.max_usage_in_bytes";
    RETURN_IF_ERROR(write_control_file(path, "0"));
    UniqueFd file(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!file) return errno_error("open('{}')", path.string());
    return file;
  }

  Result<std::vector<pid_t>> exec_processes(std::string_view sandbox,
                                            std::string_view exec) override {
    return cgroup_files::read_procs(roots_.memory / parent_ / sandbox / exec / "cgroup.procs");
  }

  Result<void> kill_exec(std::string_view sandbox, std::string_view exec) override {
    // Every process of the exec is in its memory cgroup: it joined before exec and its
    // children cannot leave.
    return cgroup_files::kill_all(roots_.memory / parent_ / sandbox / exec / "cgroup.procs");
  }

  std::vector<std::string> execs(std::string_view sandbox) const override {
    return cgroup_files::exec_children(roots_.memory / parent_ / sandbox);
  }

  Result<void> remove_exec(std::string_view sandbox, std::string_view exec) override {
    RETURN_IF_ERROR(kill_exec(sandbox, exec));
    for (const auto& root : exec_hierarchies_) {
      RETURN_IF_ERROR(cgroup_files::remove_tree(root / parent_ / sandbox / exec));
    }
    return {};
  }

  Result<void> remove_sandbox(std::string_view sandbox) override {
    // Every process of the sandbox is in its memory cgroup's subtree (init, the commands and
    // the proxy join every hierarchy, and only the host moves them): killed there, they are
    // gone from all. remove_tree kills whatever it still finds in a cgroup it removes.
    RETURN_IF_ERROR(kill_subtree(roots_.memory / parent_ / sandbox));
    for (const auto& root : hierarchies_) {
      RETURN_IF_ERROR(cgroup_files::remove_tree(root / parent_ / sandbox));
    }
    return {};
  }

  Result<uint64_t> memory_usage(std::string_view sandbox) const override {
    return cgroup_files::read_number(roots_.memory / parent_ / sandbox / "memory.usage_in_bytes");
  }

  std::vector<protocol::CgroupMount> sandbox_mounts() const override {
    // The hierarchies that hold the limits programs look for: memory and cpu.
    std::vector<protocol::CgroupMount> mounts;
    for (const auto& root : {roots_.memory, roots_.cpu}) {
      auto found = roots_.controllers.find(root);
      if (found == roots_.controllers.end()) continue;
      std::string name = fmt::format("{}", fmt::join(found->second, ","));
      protocol::CgroupMount mount{"cgroup", name, "/sys/fs/cgroup/" + name, {}};
      for (const auto& controller : found->second) {
        if (controller != name) mount.aliases.push_back(controller);
      }
      if (std::none_of(mounts.begin(), mounts.end(),
                       [&](const auto& m) { return m.target == mount.target; })) {
        mounts.push_back(std::move(mount));
      }
    }
    return mounts;
  }

  bool sandbox_exists(std::string_view sandbox) const override {
    for (const auto& root : hierarchies_) {
      if (std::filesystem::exists(root / parent_ / sandbox)) return true;
    }
    return false;
  }

 private:
  // Memory without swap and the CPU quota on `relative` (a path below each hierarchy's root).
  Result<void> set_limits(const std::filesystem::path& relative, const CgroupLimits& limits) {
    auto memory = roots_.memory / relative;
    RETURN_IF_ERROR(
        write_control_file(memory / "memory.limit_in_bytes", std::to_string(limits.memory_bytes)));
    // memory+swap equal to memory means no swap; the file exists only with swap accounting.
    if (std::filesystem::exists(memory / "memory.memsw.limit_in_bytes")) {
      RETURN_IF_ERROR(write_control_file(memory / "memory.memsw.limit_in_bytes",
                                         std::to_string(limits.memory_bytes)));
    }
    if (std::filesystem::exists(memory / "memory.swappiness")) {
      RETURN_IF_ERROR(write_control_file(memory / "memory.swappiness", "0"));
    }
    auto cpu = roots_.cpu / relative;
    RETURN_IF_ERROR(write_control_file(cpu / "cpu.cfs_period_us", std::to_string(kCpuPeriodUs)));
    auto quota = static_cast<uint64_t>(std::llround(limits.cpus * kCpuPeriodUs));
    return write_control_file(cpu / "cpu.cfs_quota_us", std::to_string(quota));
  }

  // A cgroup2 hierarchy delegates hugetlb to children only when each parent says so.
  Result<void> ensure_unified_parent() {
    if (roots_.unified_hugetlb.empty() || unified_ready_) return {};
    RETURN_IF_ERROR(with_context(
        write_control_file(roots_.unified_hugetlb / "cgroup.subtree_control", "+hugetlb"),
        "enabling hugetlb for child cgroups"));
    RETURN_IF_ERROR(make_cgroup(roots_.unified_hugetlb / parent_));
    RETURN_IF_ERROR(write_control_file(roots_.unified_hugetlb / parent_ / "cgroup.subtree_control",
                                       "+hugetlb"));
    unified_ready_ = true;
    return {};
  }

  static Result<void> make_cgroup(const std::filesystem::path& dir) {
    if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
      return errno_error("mkdir '{}'", dir.string());
    }
    return {};
  }

  static Result<void> kill_subtree(const std::filesystem::path& dir) {
    std::error_code error;
    if (!std::filesystem::exists(dir, error)) return {};
    for (const auto& entry : std::filesystem::directory_iterator(dir, error)) {
      if (entry.is_directory(error)) RETURN_IF_ERROR(kill_subtree(entry.path()));
    }
    return cgroup_files::kill_all(dir / "cgroup.procs");
  }

  CgroupV1Paths roots_;
  std::filesystem::path parent_;
  std::vector<std::filesystem::path> hierarchies_;       // each distinct hierarchy once
  std::vector<std::filesystem::path> exec_hierarchies_;  // where exec cgroups are made
  std::atomic<bool> unified_ready_ = false;              // creates may run on several threads
};

}  // namespace

std::unique_ptr<CgroupDriver> make_cgroup_v1(CgroupV1Paths roots, std::string parent) {
  return std::make_unique<CgroupV1>(std::move(roots), std::move(parent));
}

}  // namespace quarry::sandbox::local

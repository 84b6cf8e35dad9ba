// cgroups for sandboxes: limits on the sandbox, one child cgroup per exec for metering. The host
// may have cgroup v1, v2, or both (hybrid); make_cgroup_driver(read_cgroup_mounts()) picks the
// driver that has every controller quarry needs.
//
// Layout (the same shape in each hierarchy):
//   <root>/quarry/<sandbox>/          limits: memory (no swap), cpu quota, pids; where the
//                                     host has the controllers, io on the sandbox volume and
//                                     hugetlb (0: no huge pages)
//   <root>/quarry/<sandbox>/init      v2: the sandbox's init process (v1 keeps it in <sandbox>)
//   <root>/quarry/<sandbox>/<exec>    one exec's process tree: peak memory, OOM kills, CPU time
//   <root>/quarry/<sandbox>/proxy     its network proxy (network.mode allowlist), made like an
//                                     exec's but not one: commands are never stopped there
#pragma once

#include <sys/types.h>

#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.h"
#include "common/unique_fd.h"
#include "sandbox/local/protocol.h"

namespace quarry::sandbox::local {

// The cgroup of a sandbox's network proxy (network_proxy.h), beside init and the execs.
inline constexpr std::string_view kProxyCgroup = "proxy";

// Throttling of reads and writes on one block device; 0 is no limit.
struct IoLimit {
  dev_t device = 0;
  uint64_t read_bps = 0;
  uint64_t write_bps = 0;
  uint64_t read_iops = 0;
  uint64_t write_iops = 0;
};

struct CgroupLimits {
  uint64_t memory_bytes = 0;
  double cpus = 1.0;
  uint32_t pids = 0;
  // Set on the sandbox's cgroup (not repeated on exec cgroups) where the io controller (v2) or
  // blkio (v1) is available. On v1, writes the kernel writes back later from the page cache are
  // not charged to the cgroup: only direct writes and reads are throttled there. (fsync in a
  // sandbox writes nothing back: its overlay is mounted with fsync=volatile.)
  std::vector<IoLimit> io;
};

// Per-exec measurements read from the exec's own cgroup.
struct ExecCounters {
  uint64_t peak_memory_bytes = 0;
  uint64_t cpu_usage_ns = 0;
  uint64_t oom_kills = 0;
};

class CgroupDriver {
 public:
  virtual ~CgroupDriver() = default;

  virtual std::string_view version() const = 0;  // "v1" or "v2"

  // Creates <sandbox> with its limits (v2: and the empty init leaf).
  virtual Result<void> create_sandbox(std::string_view sandbox, const CgroupLimits& limits) = 0;
  // Moves `pid` into <sandbox> itself (so a cgroup namespace created now is rooted there).
  virtual Result<void> enter_sandbox(std::string_view sandbox, pid_t pid) = 0;
  // Makes <sandbox> ready for exec children. v2 moves `pid` into <sandbox>/init first: a
  // cgroup that delegates controllers may hold no process. v1 has no such rule.
  virtual Result<void> enter_init(std::string_view sandbox, pid_t pid) = 0;

  // Creates <sandbox>/<exec> with the sandbox's limits repeated on it (so a program reading its
  // own cgroup sees them) and returns open cgroup.procs files of it, one per hierarchy. A
  // process that writes "0" to each of them moves itself into the exec's cgroup; the files are
  // opened here, by the host, so a sandboxed process can use them without any other access to
  // the cgroup tree.
  virtual Result<std::vector<UniqueFd>> create_exec(std::string_view sandbox, std::string_view exec,
                                                    const CgroupLimits& limits) = 0;
  virtual Result<ExecCounters> exec_counters(std::string_view sandbox, std::string_view exec) = 0;
  // Starts the exec's peak memory anew, for a command that runs one step after another: reads
  // of the returned file (cgroup_files::read_number_at) give the most it used since. v1 writes
  // 0 to memory.max_usage_in_bytes; v2 writes to memory.peak, which resets it for that open
  // file only (Linux 6.12 and later; kFailedPrecondition before).
  virtual Result<UniqueFd> reset_peak(std::string_view sandbox, std::string_view exec) = 0;
  // Kills every process of the exec and removes its cgroup.
  virtual Result<void> remove_exec(std::string_view sandbox, std::string_view exec) = 0;
  // The host pids of the exec's processes.
  virtual Result<std::vector<pid_t>> exec_processes(std::string_view sandbox,
                                                    std::string_view exec) = 0;
  // Sends SIGKILL to every process in the exec's cgroup (e.g. on timeout); does not wait.
  virtual Result<void> kill_exec(std::string_view sandbox, std::string_view exec) = 0;
  // The names of the sandbox's exec cgroups that exist now (running commands, or leftovers of
  // a process that died while it ran one).
  virtual std::vector<std::string> execs(std::string_view sandbox) const = 0;

  // Kills whatever is left in the sandbox and removes all of its cgroups. Missing is fine.
  virtual Result<void> remove_sandbox(std::string_view sandbox) = 0;
  // Whether the sandbox's cgroup exists (used to find leftovers).
  virtual bool sandbox_exists(std::string_view sandbox) const = 0;
  // Memory charged to the sandbox now (its processes, page cache and kernel objects).
  virtual Result<uint64_t> memory_usage(std::string_view sandbox) const = 0;
  // What init should mount at /sys/fs/cgroup inside the sandbox.
  virtual std::vector<protocol::CgroupMount> sandbox_mounts() const = 0;
  // The controllers in use beyond memory, cpu and pids: "io" or "blkio", "hugetlb" (for logs).
  virtual std::vector<std::string> optional_controllers() const = 0;
};

// A cgroup filesystem mount, as read from /proc/self/mountinfo.
struct CgroupMount {
  std::filesystem::path mount_point;
  bool unified = false;                  // cgroup2
  std::vector<std::string> controllers;  // v1: from the super options; v2: cgroup.controllers
  std::string mount_options;             // per mount, e.g. "rw,nosuid,nodev,noexec,relatime"
  std::string super_options;             // per filesystem, e.g. "rw,nsdelegate"
};

// Parses the cgroup and cgroup2 lines of a mountinfo file.
std::vector<CgroupMount> parse_cgroup_mounts(std::string_view mountinfo);

// Picks v2 when the unified hierarchy has memory, cpu and pids, else v1 when each of memory,
// cpu, cpuacct and pids is mounted as a v1 hierarchy (this is what a hybrid host gives), else an
// error naming what is missing. `mounts` must have v2 controllers filled in. io (blkio on v1)
// and hugetlb are used where there: on a hybrid host, hugetlb may be left to the unified
// hierarchy, whose cgroups the v1 driver then makes beside the others.
Result<std::unique_ptr<CgroupDriver>> make_cgroup_driver(const std::vector<CgroupMount>& mounts,
                                                         std::string_view parent = "quarry");

// The cgroup filesystems mounted here, from /proc/self/mountinfo, with the controllers of the
// v2 ones: what make_cgroup_driver() and favor_dynamic_modifications() take.
Result<std::vector<CgroupMount>> read_cgroup_mounts();

// Moving a process into a cgroup takes a global lock whose fast path costs an RCU grace period
// (about 8 ms here) whenever no migration happened in the last few milliseconds, which is every
// sandbox start and every exec of a conversation. cgroup2's `favordynmods` option (Linux 6.0)
// makes migrations take microseconds instead, for all hierarchies, v1 ones too, at a small cost
// to fork and exit. This remounts the host's cgroup2 filesystem with it, keeping its other
// options. Returns false when there is no cgroup2 mount; an error when the kernel refuses.
Result<bool> favor_dynamic_modifications(const std::vector<CgroupMount>& mounts);

// The options to remount `mount` with favordynmods added, or nullopt if it has it already.
struct Remount {
  unsigned long flags = 0;
  std::string data;
};
std::optional<Remount> favordynmods_remount(const CgroupMount& mount);

// Drivers over explicit directories, for hosts and for tests on a fake tree.
// `controllers`: what the root's cgroup.controllers lists (memory, cpu and pids are assumed).
std::unique_ptr<CgroupDriver> make_cgroup_v2(std::filesystem::path root, std::string parent,
                                             std::vector<std::string> controllers = {});
struct CgroupV1Paths {
  std::filesystem::path memory, cpu, cpuacct, pids;
  // Optional, empty when absent: the blkio and hugetlb hierarchies, and a cgroup2 root whose
  // cgroup.controllers has hugetlb (a hybrid host's unified hierarchy) when no v1 one does.
  std::filesystem::path blkio, hugetlb, unified_hugetlb;
  // The controllers of each hierarchy above, by mount point: mounting a v1 hierarchy again
  // (inside a sandbox) must name exactly its controllers.
  std::map<std::filesystem::path, std::vector<std::string>> controllers;
};
std::unique_ptr<CgroupDriver> make_cgroup_v1(CgroupV1Paths roots, std::string parent);

// Helpers shared by both drivers.
namespace cgroup_files {
// Reads a file holding a single number ("max" reads as UINT64_MAX).
Result<uint64_t> read_number(const std::filesystem::path& path);
// The same from an open file, read again from its start.
Result<uint64_t> read_number_at(int fd);
// Reads the value of `key` from a flat-keyed file ("oom_kill 3").
Result<uint64_t> read_keyed(const std::filesystem::path& path, std::string_view key);
// The pids listed in a cgroup.procs file.
Result<std::vector<pid_t>> read_procs(const std::filesystem::path& path);
// SIGKILLs the processes in `procs_file` until it is empty (or `rounds` pass).
Result<void> kill_all(const std::filesystem::path& procs_file);
// The names of the child cgroups of `directory` but init and the proxy: the exec cgroups of a
// sandbox.
std::vector<std::string> exec_children(const std::filesystem::path& directory);
// rmdir of a cgroup directory and its children, deepest first; retries while the kernel is
// still releasing exiting processes, killing any that joined since. Missing is fine.
Result<void> remove_tree(const std::filesystem::path& directory);
// Writes `value` to every file of `directory` named <prefix><anything><suffix>: one per huge
// page size, e.g. hugetlb.2MB.max.
Result<void> write_each(const std::filesystem::path& directory, std::string_view prefix,
                        std::string_view suffix, std::string_view value);
}  // namespace cgroup_files

}  // namespace quarry::sandbox::local

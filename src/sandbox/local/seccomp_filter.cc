#include "sandbox/local/seccomp_filter.h"

#include <fcntl.h>
#include <linux/sched.h>
#include <seccomp.h>
#include <sys/mman.h>
#include <unistd.h>

#include <array>
#include <memory>

#include "common/unique_fd.h"

namespace quarry::sandbox::local {
namespace {

// Kept in one list so the filter and its documentation cannot drift apart.
constexpr std::array kDenied = std::to_array<std::string_view>({
    // filesystems and namespaces
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "unshare",
    "setns",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "move_mount",
    "open_tree",
    "mount_setattr",
    "name_to_handle_at",
    "open_by_handle_at",
    // other processes
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "kcmp",
    "pidfd_getfd",
    // the kernel itself
    "init_module",
    "finit_module",
    "delete_module",
    "kexec_load",
    "kexec_file_load",
    "reboot",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "acct",
    "swapon",
    "swapoff",
    "syslog",
    "quotactl",
    "quotactl_fd",
    "lookup_dcookie",
    "iopl",
    "ioperm",
    // keyrings
    "keyctl",
    "add_key",
    "request_key",
    // the clock and identity of the host
    "settimeofday",
    "clock_settime",
    "clock_adjtime",
    "adjtimex",
    "sethostname",
    "setdomainname",
    "vhangup",
    // io_uring bypasses this filter for the operations it performs
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
});

// clone(2) flags that would create namespaces: refused so code cannot build its own.
constexpr std::array<uint64_t, 7> kNamespaceFlags = {CLONE_NEWNS,    CLONE_NEWUTS, CLONE_NEWIPC,
                                                     CLONE_NEWUSER,  CLONE_NEWPID, CLONE_NEWNET,
                                                     CLONE_NEWCGROUP};

struct ContextDeleter {
  void operator()(scmp_filter_ctx ctx) const { seccomp_release(ctx); }
};

}  // namespace

std::vector<std::string_view> denied_syscalls() {
  return {kDenied.begin(), kDenied.end()};
}

Result<std::vector<uint8_t>> build_seccomp_filter() {
  std::unique_ptr<void, ContextDeleter> ctx(seccomp_init(SCMP_ACT_ALLOW));
  if (!ctx) return make_error(ErrorCode::kInternal, "seccomp_init failed");
  // Only the native architecture is in the filter; anything else hits the bad-arch action.
  if (int rc = seccomp_attr_set(ctx.get(), SCMP_FLTATR_ACT_BADARCH, SCMP_ACT_KILL_PROCESS);
      rc != 0) {
    return make_error(ErrorCode::kInternal, "seccomp_attr_set(BADARCH) failed: {}", -rc);
  }
  for (std::string_view name : kDenied) {
    int number = seccomp_syscall_resolve_name(std::string(name).c_str());
    if (number == __NR_SCMP_ERROR) continue;  // not on this architecture
    if (int rc = seccomp_rule_add(ctx.get(), SCMP_ACT_ERRNO(EPERM), number, 0); rc != 0) {
      return make_error(ErrorCode::kInternal, "seccomp rule for {} failed: {}", name, -rc);
    }
  }
  for (uint64_t flag : kNamespaceFlags) {
    if (int rc = seccomp_rule_add(ctx.get(), SCMP_ACT_ERRNO(EPERM), SCMP_SYS(clone), 1,
                                  SCMP_A0(SCMP_CMP_MASKED_EQ, flag, flag));
        rc != 0) {
      return make_error(ErrorCode::kInternal, "seccomp rule for clone failed: {}", -rc);
    }
  }
  // clone3 passes its flags in memory, where a filter cannot look: answer ENOSYS so libc
  // falls back to clone(2), whose flags are checked above.
  if (int rc = seccomp_rule_add(ctx.get(), SCMP_ACT_ERRNO(ENOSYS), SCMP_SYS(clone3), 0); rc != 0) {
    return make_error(ErrorCode::kInternal, "seccomp rule for clone3 failed: {}", -rc);
  }

  // libseccomp 2.5 exports only to a file descriptor.
  UniqueFd memory(::memfd_create("seccomp-bpf", MFD_CLOEXEC));
  if (!memory) return errno_error("memfd_create");
  if (int rc = seccomp_export_bpf(ctx.get(), memory.get()); rc != 0) {
    return make_error(ErrorCode::kInternal, "seccomp_export_bpf failed: {}", -rc);
  }
  off_t size = ::lseek(memory.get(), 0, SEEK_END);
  std::vector<uint8_t> program(static_cast<size_t>(size));
  if (::pread(memory.get(), program.data(), program.size(), 0) != size) {
    return errno_error("reading the exported seccomp filter");
  }
  return program;
}

}  // namespace quarry::sandbox::local

#include "sandbox/local/seccomp_filter.h"

#include <fcntl.h>
#include <linux/sched.h>
#include <seccomp.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <memory>
#include <span>

#include "common/unique_fd.h"

namespace quarry::sandbox::local {
namespace {

// Kept in lists so the filter and its documentation cannot drift apart.

// What analysis code may call: modelled on Docker's default profile (what containers have run
// with for years), without what that profile allows only with capabilities the sandbox does
// not have. Anything not named here fails with ENOSYS, as a syscall the kernel does not have:
// a syscall a future kernel adds is refused until it is listed, and libc falls back from a new
// call to an old one.
constexpr std::array kAllowed = std::to_array<std::string_view>({
    // files and directories
    "access",
    "faccessat",
    "faccessat2",
    "chdir",
    "fchdir",
    "getcwd",
    "chmod",
    "fchmod",
    "fchmodat",
    "chown",
    "fchown",
    "fchownat",
    "lchown",
    "close",
    "close_range",
    "creat",
    "dup",
    "dup2",
    "dup3",
    "fadvise64",
    "fallocate",
    "fcntl",
    "fdatasync",
    "fsync",
    "flock",
    "ftruncate",
    "truncate",
    "getdents",
    "getdents64",
    "link",
    "linkat",
    "lseek",
    "mkdir",
    "mkdirat",
    "mknod",
    "mknodat",
    "open",
    "openat",
    "openat2",
    "pread64",
    "preadv",
    "preadv2",
    "pwrite64",
    "pwritev",
    "pwritev2",
    "read",
    "readv",
    "write",
    "writev",
    "readahead",
    "readlink",
    "readlinkat",
    "rename",
    "renameat",
    "renameat2",
    "rmdir",
    "stat",
    "fstat",
    "lstat",
    "newfstatat",
    "statx",
    "statfs",
    "fstatfs",
    "symlink",
    "symlinkat",
    "sync",
    "syncfs",
    "sync_file_range",
    "umask",
    "unlink",
    "unlinkat",
    "utime",
    "utimes",
    "utimensat",
    "futimesat",
    "copy_file_range",
    "sendfile",
    "splice",
    "tee",
    "vmsplice",
    "memfd_create",
    "getxattr",
    "lgetxattr",
    "fgetxattr",
    "listxattr",
    "llistxattr",
    "flistxattr",
    "setxattr",
    "lsetxattr",
    "fsetxattr",
    "removexattr",
    "lremovexattr",
    "fremovexattr",
    "inotify_init",
    "inotify_init1",
    "inotify_add_watch",
    "inotify_rm_watch",
    // memory
    "brk",
    "mmap",
    "munmap",
    "mremap",
    "mprotect",
    "madvise",
    "mincore",
    "msync",
    "mlock",
    "mlock2",
    "munlock",
    "mlockall",
    "munlockall",
    "membarrier",
    "get_mempolicy",
    "set_mempolicy",
    "mbind",
    "pkey_alloc",
    "pkey_free",
    "pkey_mprotect",
    "remap_file_pages",
    // processes, threads and signals
    "arch_prctl",
    "clone",
    "fork",
    "vfork",
    "execve",
    "execveat",
    "exit",
    "exit_group",
    "wait4",
    "waitid",
    "kill",
    "tkill",
    "tgkill",
    "getpid",
    "getppid",
    "gettid",
    "getpgid",
    "getpgrp",
    "setpgid",
    "getsid",
    "setsid",
    "getpriority",
    "setpriority",
    "prctl",
    "getrlimit",
    "setrlimit",
    "prlimit64",
    "getrusage",
    "rseq",
    "set_tid_address",
    "set_robust_list",
    "get_robust_list",
    "futex",
    "futex_waitv",
    "restart_syscall",
    "rt_sigaction",
    "rt_sigpending",
    "rt_sigprocmask",
    "rt_sigqueueinfo",
    "rt_sigreturn",
    "rt_sigsuspend",
    "rt_sigtimedwait",
    "rt_tgsigqueueinfo",
    "sigaltstack",
    "signalfd",
    "signalfd4",
    "pause",
    "pidfd_open",
    "pidfd_send_signal",
    "sched_getaffinity",
    "sched_setaffinity",
    "sched_getattr",
    "sched_setattr",
    "sched_getparam",
    "sched_setparam",
    "sched_getscheduler",
    "sched_setscheduler",
    "sched_get_priority_max",
    "sched_get_priority_min",
    "sched_rr_get_interval",
    "sched_yield",
    "ioprio_get",
    "ioprio_set",
    "get_thread_area",
    "set_thread_area",
    "seccomp",
    "capget",
    "capset",
    // identity (init switches to the sandbox user; without capabilities nothing else works)
    "getuid",
    "geteuid",
    "getgid",
    "getegid",
    "getresuid",
    "getresgid",
    "getgroups",
    "setuid",
    "setgid",
    "setreuid",
    "setregid",
    "setresuid",
    "setresgid",
    "setgroups",
    "setfsuid",
    "setfsgid",
    // waiting and events
    "poll",
    "ppoll",
    "select",
    "pselect6",
    "epoll_create",
    "epoll_create1",
    "epoll_ctl",
    "epoll_wait",
    "epoll_pwait",
    "epoll_pwait2",
    "eventfd",
    "eventfd2",
    "pipe",
    "pipe2",
    "timerfd_create",
    "timerfd_gettime",
    "timerfd_settime",
    "timer_create",
    "timer_delete",
    "timer_getoverrun",
    "timer_gettime",
    "timer_settime",
    "getitimer",
    "setitimer",
    "alarm",
    "nanosleep",
    "clock_nanosleep",
    "clock_gettime",
    "clock_getres",
    "gettimeofday",
    "time",
    "times",
    "io_setup",
    "io_destroy",
    "io_submit",
    "io_cancel",
    "io_getevents",
    "io_pgetevents",
    // sockets (socket and socketpair only for the families below)
    "accept",
    "accept4",
    "bind",
    "connect",
    "listen",
    "getsockname",
    "getpeername",
    "getsockopt",
    "setsockopt",
    "recvfrom",
    "recvmsg",
    "recvmmsg",
    "sendto",
    "sendmsg",
    "sendmmsg",
    "shutdown",
    // System V and POSIX IPC, inside the sandbox's IPC namespace
    "shmget",
    "shmat",
    "shmdt",
    "shmctl",
    "semget",
    "semop",
    "semtimedop",
    "semctl",
    "msgget",
    "msgsnd",
    "msgrcv",
    "msgctl",
    "mq_open",
    "mq_unlink",
    "mq_timedsend",
    "mq_timedreceive",
    "mq_notify",
    "mq_getsetattr",
    // the system, read only
    "uname",
    "sysinfo",
    "getrandom",
    "getcpu",
    "ioctl",
    // sandboxing itself (a program may restrict itself further)
    "landlock_create_ruleset",
    "landlock_add_rule",
    "landlock_restrict_self",
});

// Refused with EPERM, as an operation the sandbox may not do (a program says "Operation not
// permitted" rather than "Function not implemented").
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

std::vector<std::string_view> allowed_syscalls() {
  return {kAllowed.begin(), kAllowed.end()};
}

namespace {

Result<int> syscall_number(std::string_view name) {
  int number = seccomp_syscall_resolve_name(std::string(name).c_str());
  if (number == __NR_SCMP_ERROR) {
    const scmp_version* version = seccomp_version();
    return make_error(ErrorCode::kInternal,
                      "libseccomp {}.{}.{} does not know the syscall '{}', so the sandbox's "
                      "filter cannot be built as written; install libseccomp 2.5.4 or newer",
                      version->major, version->minor, version->micro, name);
  }
  return number;
}

Result<void> add_rule(scmp_filter_ctx ctx, uint32_t action, std::string_view name,
                      std::vector<scmp_arg_cmp> conditions = {}) {
  ASSIGN_OR_RETURN(int number, syscall_number(name));
  if (int rc = seccomp_rule_add_array(ctx, action, number, static_cast<unsigned>(conditions.size()),
                                      conditions.data());
      rc != 0) {
    return make_error(ErrorCode::kInternal, "seccomp rule for {} failed: {}", name, -rc);
  }
  return {};
}

// socket(2) and socketpair(2) for the allowed families only; any other family (a number, as
// the filter sees it) fails with EAFNOSUPPORT, as on a kernel without it.
Result<void> add_socket_rules(scmp_filter_ctx ctx, std::string_view name,
                              std::span<const int> families) {
  constexpr uint64_t kFamilies = 64;  // above AF_MAX
  for (uint64_t family = 0; family < kFamilies; ++family) {
    const bool allowed = std::ranges::find(families, static_cast<int>(family)) != families.end();
    RETURN_IF_ERROR(add_rule(ctx, allowed ? SCMP_ACT_ALLOW : SCMP_ACT_ERRNO(EAFNOSUPPORT), name,
                             {SCMP_A0(SCMP_CMP_EQ, family)}));
  }
  return add_rule(ctx, SCMP_ACT_ERRNO(EAFNOSUPPORT), name, {SCMP_A0(SCMP_CMP_GE, kFamilies)});
}

}  // namespace

Result<std::vector<uint8_t>> build_seccomp_filter() {
  std::unique_ptr<void, ContextDeleter> ctx(seccomp_init(SCMP_ACT_ERRNO(ENOSYS)));
  if (!ctx) return make_error(ErrorCode::kInternal, "seccomp_init failed");
  // Only the native architecture is in the filter; anything else (i386 through int 0x80, x32)
  // hits the bad-arch action.
  if (int rc = seccomp_attr_set(ctx.get(), SCMP_FLTATR_ACT_BADARCH, SCMP_ACT_KILL_PROCESS);
      rc != 0) {
    return make_error(ErrorCode::kInternal, "seccomp_attr_set(BADARCH) failed: {}", -rc);
  }
  // Every syscall of the sandbox runs the filter: with a few hundred names listed, a binary
  // search over them instead of a linear walk (python3 -c pass makes thousands of syscalls).
  if (int rc = seccomp_attr_set(ctx.get(), SCMP_FLTATR_CTL_OPTIMIZE, 2); rc != 0) {
    return make_error(ErrorCode::kInternal, "seccomp_attr_set(CTL_OPTIMIZE) failed: {}", -rc);
  }
  for (std::string_view name : kAllowed) {
    if (name == "clone") continue;  // below, with its flags checked
    RETURN_IF_ERROR(add_rule(ctx.get(), SCMP_ACT_ALLOW, name));
  }
  for (std::string_view name : kDenied)
    RETURN_IF_ERROR(add_rule(ctx.get(), SCMP_ACT_ERRNO(EPERM), name));

  // clone(2) without namespace flags; with any of them EPERM. clone3 passes its flags in
  // memory, where a filter cannot look: it is not listed, so it answers ENOSYS and libc falls
  // back to clone(2).
  uint64_t namespace_flags = 0;
  for (uint64_t flag : kNamespaceFlags) {
    namespace_flags |= flag;
    RETURN_IF_ERROR(add_rule(ctx.get(), SCMP_ACT_ERRNO(EPERM), "clone",
                             {SCMP_A0(SCMP_CMP_MASKED_EQ, flag, flag)}));
  }
  RETURN_IF_ERROR(add_rule(ctx.get(), SCMP_ACT_ALLOW, "clone",
                           {SCMP_A0(SCMP_CMP_MASKED_EQ, namespace_flags, 0)}));

  constexpr int kSocketFamilies[] = {AF_UNIX, AF_INET, AF_INET6, AF_NETLINK};
  constexpr int kSocketPairFamilies[] = {AF_UNIX};
  RETURN_IF_ERROR(add_socket_rules(ctx.get(), "socket", kSocketFamilies));
  RETURN_IF_ERROR(add_socket_rules(ctx.get(), "socketpair", kSocketPairFamilies));

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

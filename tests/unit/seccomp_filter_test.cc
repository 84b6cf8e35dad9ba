// Loads the real filter (the one quarry carries) in a child process and checks what it allows
// and refuses; and that it is the program libseccomp makes from seccomp_filter.cc here.
#include "sandbox/local/seccomp_filter.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <linux/vm_sockets.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/ptrace.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <functional>

#include "sandbox/local/seccomp_program.h"

namespace quarry::sandbox::local {
namespace {

// Runs `probe` in a forked child under the filter; returns the errno it ended with (0 if the
// call succeeded), or -1 if the child did not exit normally.
int errno_under_filter(std::span<const uint8_t> program, const std::function<long()>& probe) {
  pid_t pid = ::fork();
  if (pid == 0) {
    sock_fprog fprog{static_cast<unsigned short>(program.size() / sizeof(sock_filter)),
                     reinterpret_cast<sock_filter*>(const_cast<uint8_t*>(program.data()))};
    if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) ::_exit(200);
    if (::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &fprog, 0, 0) != 0) ::_exit(201);
    errno = 0;
    long rc = probe();
    ::_exit(rc < 0 ? errno : 0);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(SeccompFilter, TheBuiltInProgramIsWhatLibseccompMakesHere) {
  auto built = build_seccomp_filter();
  ASSERT_TRUE(built) << built.error().message;
  const auto carried = seccomp_program();
  EXPECT_EQ(std::vector<uint8_t>(carried.begin(), carried.end()), *built);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(carried.data()) % alignof(sock_filter), 0u);
}

TEST(SeccompFilter, RefusesWhatAnalysisNeverNeeds) {
  const auto program = seccomp_program();
  struct Case {
    const char* name;
    std::function<long()> call;
    int expected_errno;
  } cases[] = {
      {"mount", [] { return long{::mount("none", "/tmp", "tmpfs", 0, nullptr)}; }, EPERM},
      {"unshare(NEWNS)", [] { return long{::unshare(CLONE_NEWNS)}; }, EPERM},
      {"unshare(NEWUSER)", [] { return long{::unshare(CLONE_NEWUSER)}; }, EPERM},
      {"setns", [] { return long{::setns(0, 0)}; }, EPERM},
      {"ptrace", [] { return ::ptrace(PTRACE_TRACEME, 0, nullptr, nullptr); }, EPERM},
      {"bpf", [] { return ::syscall(SYS_bpf, 0, nullptr, 0); }, EPERM},
      {"perf_event_open", [] { return ::syscall(SYS_perf_event_open, nullptr, 0, -1, -1, 0); },
       EPERM},
      {"keyctl", [] { return ::syscall(SYS_keyctl, 0, 0, 0, 0, 0); }, EPERM},
      {"kexec_load", [] { return ::syscall(SYS_kexec_load, 0, 0, nullptr, 0); }, EPERM},
      {"io_uring_setup", [] { return ::syscall(SYS_io_uring_setup, 1, nullptr); }, EPERM},
      {"clone with CLONE_NEWNET",
       [] { return ::syscall(SYS_clone, CLONE_NEWNET | SIGCHLD, nullptr, nullptr, nullptr, 0); },
       EPERM},
      {"clone3", [] { return ::syscall(SYS_clone3, nullptr, 0); }, ENOSYS},
      // Socket families beyond unix, inet, inet6 and netlink: AF_VSOCK reaches a hypervisor's
      // services, rare families load kernel modules.
      {"socket(AF_VSOCK)", [] { return long{::socket(AF_VSOCK, SOCK_STREAM, 0)}; }, EAFNOSUPPORT},
      {"socket(AF_PACKET)", [] { return long{::socket(AF_PACKET, SOCK_RAW, 0)}; }, EAFNOSUPPORT},
      {"socket(AF_ALG)", [] { return long{::socket(AF_ALG, SOCK_SEQPACKET, 0)}; }, EAFNOSUPPORT},
      {"socket(AF_INET | 1 << 32)",
       [] { return ::syscall(SYS_socket, (1L << 32) | AF_INET, SOCK_STREAM, 0); }, EAFNOSUPPORT},
      {"socketpair(AF_INET)",
       [] {
         int pair[2];
         return long{::socketpair(AF_INET, SOCK_STREAM, 0, pair)};
       },
       EAFNOSUPPORT},
      // Not on the list: as if the kernel did not have it.
      {"personality", [] { return ::syscall(SYS_personality, 0xffffffff); }, ENOSYS},
      {"uselib", [] { return ::syscall(SYS_uselib, nullptr); }, ENOSYS},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    EXPECT_EQ(errno_under_filter(program, c.call), c.expected_errno);
  }
}

TEST(SeccompFilter, AllowsOrdinaryWork) {
  const auto program = seccomp_program();
  EXPECT_EQ(errno_under_filter(program, [] { return long{::getpid() > 0 ? 0 : -1}; }), 0);
  EXPECT_EQ(errno_under_filter(program,
                               [] {
                                 int fd = ::open("/dev/null", O_RDONLY);
                                 return long{fd >= 0 ? ::close(fd) : -1};
                               }),
            0);
  // A plain fork still works: only namespace flags are refused.
  EXPECT_EQ(errno_under_filter(program,
                               [] {
                                 pid_t child = ::fork();
                                 if (child == 0) ::_exit(0);
                                 return long{child > 0 ? ::waitpid(child, nullptr, 0) : -1};
                               }),
            0);
}

TEST(SeccompFilter, AllowsTheSocketsAnalysisUses) {
  const auto program = seccomp_program();
  for (int family : {AF_UNIX, AF_INET, AF_INET6, AF_NETLINK}) {
    SCOPED_TRACE(family);
    const int type = family == AF_NETLINK ? SOCK_RAW : SOCK_STREAM;
    EXPECT_EQ(errno_under_filter(program,
                                 [&] {
                                   int fd = ::socket(family, type, 0);
                                   return long{fd >= 0 ? ::close(fd) : -1};
                                 }),
              0);
  }
  EXPECT_EQ(errno_under_filter(program,
                               [] {
                                 int pair[2];
                                 return long{::socketpair(AF_UNIX, SOCK_STREAM, 0, pair)};
                               }),
            0);
}

TEST(SeccompFilter, NoSyscallIsBothAllowedAndDenied) {
  auto allowed = allowed_syscalls();
  EXPECT_GT(allowed.size(), 200u);
  for (std::string_view name : denied_syscalls()) {
    EXPECT_EQ(std::find(allowed.begin(), allowed.end(), name), allowed.end()) << name;
  }
}

TEST(SeccompFilter, DocumentsItsList) {
  auto denied = denied_syscalls();
  for (const char* name :
       {"mount", "ptrace", "kexec_load", "bpf", "keyctl", "unshare", "setns", "perf_event_open"}) {
    EXPECT_NE(std::find(denied.begin(), denied.end(), name), denied.end()) << name;
  }
}

}  // namespace
}  // namespace quarry::sandbox::local

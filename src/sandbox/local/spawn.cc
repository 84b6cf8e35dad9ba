#include "sandbox/local/spawn.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <charconv>

#include "common/file_util.h"
#include "sandbox/local/protocol.h"

namespace quarry::sandbox::local {
namespace {

constexpr size_t kChildStack = 64 * 1024;

struct ChildArgs {
  const char* path;
  char* const* argv;
  char* const* envp;
  int channel;
  int log_fd;
  int null_fd;
};

// Runs in the child while it still shares our memory (CLONE_VM): only system calls.
int child_main(void* raw) {
  const auto* args = static_cast<const ChildArgs*>(raw);
  if (::dup2(args->null_fd, STDIN_FILENO) < 0 || ::dup2(args->null_fd, STDOUT_FILENO) < 0 ||
      ::dup2(args->log_fd, STDERR_FILENO) < 0 || ::dup2(args->channel, protocol::kSetupFd) < 0) {
    ::_exit(127);
  }
  ::close_range(protocol::kSetupFd + 1, ~0U, 0);
  ::execve(args->path, args->argv, args->envp);
  ::_exit(127);
}

// Moves `fd` above the descriptors the child sets up, so no dup2 there can clobber another.
Result<UniqueFd> high_fd(int fd) {
  UniqueFd moved(::fcntl(fd, F_DUPFD_CLOEXEC, 10));
  if (!moved) return errno_error("fcntl(F_DUPFD_CLOEXEC)");
  return moved;
}

}  // namespace

Result<ChildStack> ChildStack::make(size_t size) {
  void* base =
      ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
  if (base == MAP_FAILED) return errno_error("mmap(child stack)");
  return ChildStack(base, size);
}

ChildStack::~ChildStack() {
  if (base_ != nullptr) ::munmap(base_, size_);
}

pid_t ChildStack::clone(int (*fn)(void*), void* arg, int flags, int* pidfd) {
  sigset_t all, old;
  sigfillset(&all);
  ::pthread_sigmask(SIG_SETMASK, &all, &old);
  const pid_t pid = ::clone(fn, static_cast<char*>(base_) + size_, flags, arg, pidfd);
  const int clone_errno = errno;
  ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
  errno = clone_errno;
  return pid;
}

Result<InitProcess> spawn_init(const std::filesystem::path& init_binary, int log_fd) {
  int pair[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0) {
    return errno_error("socketpair");
  }
  UniqueFd ours(pair[0]);
  UniqueFd theirs_low(pair[1]);
  ASSIGN_OR_RETURN(UniqueFd theirs, high_fd(theirs_low.get()));
  theirs_low.reset();
  ASSIGN_OR_RETURN(UniqueFd log, high_fd(log_fd));
  UniqueFd null_low(::open("/dev/null", O_RDWR | O_CLOEXEC));
  if (!null_low) return errno_error("open('/dev/null')");
  ASSIGN_OR_RETURN(UniqueFd null_fd, high_fd(null_low.get()));
  null_low.reset();

  std::string path = init_binary.string();
  char name[] = "quarry-init";
  char* argv[] = {name, nullptr};
  char* envp[] = {nullptr};  // nothing of the host's environment goes in
  ChildArgs args{path.c_str(), argv, envp, theirs.get(), log.get(), null_fd.get()};

  // CLONE_VFORK: we resume once the child has called execve, like posix_spawn, and without
  // copying our page tables as fork would. The child keeps the full signal mask through
  // execve; init sets its own.
  ASSIGN_OR_RETURN(ChildStack stack, ChildStack::make(kChildStack));
  int pidfd = -1;
  const int flags = CLONE_VM | CLONE_VFORK | CLONE_PIDFD | CLONE_NEWNS | CLONE_NEWPID |
                    CLONE_NEWNET | CLONE_NEWUTS | CLONE_NEWIPC | SIGCHLD;
  const pid_t pid = stack.clone(child_main, &args, flags, &pidfd);
  if (pid < 0) return errno_error("clone(new mount, pid, net, uts and ipc namespaces)");
  InitProcess init;
  init.pid = pid;
  init.pidfd.reset(pidfd);
  init.channel = std::move(ours);
  if (process_exited(init.pidfd.get())) {
    reap(init.pidfd.get());
    return make_error(ErrorCode::kInternal, "quarry-init could not be started from '{}'", path);
  }
  return init;
}

Result<uint64_t> process_start_time(pid_t pid) {
  ASSIGN_OR_RETURN(auto stat, read_file(fmt::format("/proc/{}/stat", pid)));
  // The command name (field 2) may contain spaces and parentheses; fields resume after the
  // last ')'. The start time is field 22, the 20th after the name.
  auto close = stat.rfind(')');
  if (close == std::string::npos) {
    return make_error(ErrorCode::kInternal, "unexpected /proc/{}/stat format", pid);
  }
  std::string_view rest(stat);
  rest.remove_prefix(close + 2);
  for (int field = 3; field < 22; ++field) {
    auto space = rest.find(' ');
    if (space == std::string_view::npos) {
      return make_error(ErrorCode::kInternal, "unexpected /proc/{}/stat format", pid);
    }
    rest.remove_prefix(space + 1);
  }
  uint64_t start_time = 0;
  std::from_chars(rest.data(), rest.data() + rest.size(), start_time);
  return start_time;
}

Result<UniqueFd> open_process(pid_t pid, uint64_t start_time) {
  UniqueFd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
  if (!pidfd) {
    if (errno == ESRCH) return make_error(ErrorCode::kNotFound, "process {} has exited", pid);
    return errno_error("pidfd_open({})", pid);
  }
  // If the process now at `pid` started at `start_time`, it is ours and was already there when
  // the pidfd was opened, so the pidfd refers to it.
  auto current = process_start_time(pid);
  if (!current || *current != start_time || process_exited(pidfd.get())) {
    return make_error(ErrorCode::kNotFound, "process {} has exited", pid);
  }
  return pidfd;
}

bool process_exited(int pidfd) {
  pollfd poll_fd{pidfd, POLLIN, 0};
  return ::poll(&poll_fd, 1, 0) > 0;
}

void reap(int pidfd) {
  siginfo_t info{};
  ::waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(pidfd), &info, WEXITED | WNOHANG);
}

Result<void> kill_and_reap(int pidfd) {
  if (::syscall(SYS_pidfd_send_signal, pidfd, SIGKILL, nullptr, 0) != 0 && errno != ESRCH) {
    return errno_error("pidfd_send_signal(SIGKILL)");
  }
  pollfd poll_fd{pidfd, POLLIN, 0};
  if (::poll(&poll_fd, 1, 10'000) == 0) {
    return make_error(ErrorCode::kInternal, "the process survived SIGKILL for 10 s");
  }
  reap(pidfd);
  return {};
}

void reap_exited(pid_t pid, uint64_t start_time) {
  UniqueFd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
  if (!pidfd) return;
  auto current = process_start_time(pid);
  if (current && *current == start_time) reap(pidfd.get());
}

}  // namespace quarry::sandbox::local

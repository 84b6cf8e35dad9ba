// init's service loop: starts each requested command in its own process group, as the sandbox
// user, in the exec's cgroup; reports its exit; reaps every orphan that ends inside.
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <unordered_map>

#include "sandbox/local/init/steps.h"

extern char** environ;

namespace quarry::sandbox::local::init {
namespace {

int64_t monotonic_ns() {
  timespec now{};
  ::clock_gettime(CLOCK_MONOTONIC, &now);
  return static_cast<int64_t>(now.tv_sec) * 1'000'000'000 + now.tv_nsec;
}

// Writes to the command's stderr before it exists; the host shows it like the command's own.
void report(int fd, const std::string& text) {
  std::string line = "quarry-init: " + text + "\n";
  (void)!::write(fd, line.data(), line.size());
}

// Runs in the forked child; never returns.
[[noreturn]] void start_command(const protocol::ExecRequest& request, std::vector<UniqueFd>& fds,
                                const protocol::Setup& setup) {
  const int stdout_fd = fds[0].get();
  const int stderr_fd = fds[1].get();
  const int stdin_fd = request.has_stdin ? fds[2].get() : -1;
  // Join the exec's cgroups first, so everything the command does is measured.
  for (size_t i = request.has_stdin ? 3 : 2; i < fds.size(); ++i) {
    if (::write(fds[i].get(), "0", 1) != 1) {
      report(stderr_fd, fmt::format("joining the exec cgroup failed: {}", strerror(errno)));
      ::_exit(126);
    }
  }
  ::setsid();
  const int input_fd = stdin_fd >= 0 ? stdin_fd : ::open("/dev/null", O_RDONLY);
  if (input_fd < 0 || ::dup2(input_fd, STDIN_FILENO) < 0 || ::dup2(stdout_fd, STDOUT_FILENO) < 0 ||
      ::dup2(stderr_fd, STDERR_FILENO) < 0) {
    report(stderr_fd, fmt::format("setting up stdio failed: {}", strerror(errno)));
    ::_exit(126);
  }
  ::close_range(3, ~0U, 0);

  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);

  const rlimit no_core{0, 0};
  ::setrlimit(RLIMIT_CORE, &no_core);
  if (setup.max_processes > 0) {
    const rlimit processes{setup.max_processes, setup.max_processes};
    ::setrlimit(RLIMIT_NPROC, &processes);
  }
  if (auto offered = offer_to_oom_killer(); !offered) {
    report(STDERR_FILENO, offered.error().message);
    ::_exit(126);
  }
  // Switching every id away from 0 clears all capabilities. A command of the host's own that
  // runs as root (a package install) stays uid 0 and drops them itself; with the bounding set
  // empty, its execve gives it none back.
  const uid_t user = request.as_root ? 0 : setup.user_id;
  const gid_t group = request.as_root ? 0 : setup.group_id;
  if (::setgroups(0, nullptr) != 0 || ::setresgid(group, group, group) != 0 ||
      ::setresuid(user, user, user) != 0 || (request.as_root && !drop_all_capabilities())) {
    report(STDERR_FILENO, fmt::format("switching to the sandbox {} failed: {}",
                                      request.as_root ? "root" : "user", strerror(errno)));
    ::_exit(126);
  }
  const std::string& cwd = request.cwd ? *request.cwd : setup.home;
  if (::chdir(cwd.c_str()) != 0) {
    report(STDERR_FILENO, fmt::format("cannot change to directory '{}': {}", cwd, strerror(errno)));
    ::_exit(126);
  }

  std::vector<std::string> argv_strings = request.argv;
  std::vector<std::string> env_strings = request.env;
  std::vector<char*> argv;
  for (auto& arg : argv_strings)
    argv.push_back(arg.data());
  argv.push_back(nullptr);
  std::vector<char*> env;
  for (auto& entry : env_strings)
    env.push_back(entry.data());
  env.push_back(nullptr);
  // execvp searches the PATH of the calling process, so make the command's environment ours.
  environ = env.data();
  ::execvp(argv[0], argv.data());
  const int error = errno;
  report(STDERR_FILENO, fmt::format("cannot run '{}': {}", argv_strings[0], strerror(error)));
  ::_exit(error == ENOENT ? 127 : 126);
}

struct Command {
  int connection = -1;  // -1 once the host has gone away
  int64_t started_ns = 0;
};

class Server {
 public:
  Server(UniqueFd listener, const protocol::Setup& setup)
      : listener_(std::move(listener)), setup_(setup) {}

  [[noreturn]] void run() {
    sigset_t child;
    sigemptyset(&child);
    sigaddset(&child, SIGCHLD);
    signals_.reset(::signalfd(-1, &child, SFD_CLOEXEC | SFD_NONBLOCK));
    epoll_.reset(::epoll_create1(EPOLL_CLOEXEC));
    watch(listener_.get(), EPOLLIN);
    watch(signals_.get(), EPOLLIN);
    epoll_event events[32];
    while (true) {
      int count = ::epoll_wait(epoll_.get(), events, 32, -1);
      for (int i = 0; i < count; ++i) {
        int fd = events[i].data.fd;
        if (fd == listener_.get()) {
          accept_request();
        } else if (fd == signals_.get()) {
          reap();
        } else {
          host_gone(fd);
        }
      }
    }
  }

 private:
  void watch(int fd, uint32_t events) {
    epoll_event event{};
    event.events = events;
    event.data.fd = fd;
    ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &event);
  }

  void accept_request() {
    UniqueFd connection(::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!connection) return;
    // Only the host can reach this socket, but a host that connects and then stalls must not
    // stall init: give up on a request that does not arrive within seconds.
    const timeval patience{5, 0};
    ::setsockopt(connection.get(), SOL_SOCKET, SO_RCVTIMEO, &patience, sizeof patience);
    auto message = protocol::receive(connection.get());
    if (!message) return;
    auto fail = [&](const std::string& text) {
      (void)protocol::send(connection.get(), {{"type", "error"}, {"message", text}});
    };
    auto request = protocol::exec_request_from_json(message->body);
    if (!request) {
      fail(request.error().message);
      return;
    }
    if (message->fds.size() < (request->has_stdin ? 3u : 2u)) {
      fail("malformed exec request: no stdout, stderr and stdin descriptors");
      return;
    }
    const int64_t started = monotonic_ns();
    pid_t pid = ::fork();
    if (pid < 0) {
      fail(fmt::format("cannot start the command: fork failed: {}", strerror(errno)));
      return;
    }
    if (pid == 0) start_command(*request, message->fds, setup_);
    message->fds.clear();  // the command holds its own copies now
    // We only need to hear when the host hangs up: then the command is cancelled.
    watch(connection.get(), EPOLLRDHUP);
    commands_[pid] = Command{connection.get(), started};
    connections_[connection.get()] = pid;
    connection.release();
  }

  void host_gone(int connection) {
    auto found = connections_.find(connection);
    if (found == connections_.end()) return;
    const pid_t pid = found->second;
    ::kill(-pid, SIGKILL);
    ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, connection, nullptr);
    ::close(connection);
    connections_.erase(found);
    commands_[pid].connection = -1;
  }

  void reap() {
    signalfd_siginfo info;
    while (::read(signals_.get(), &info, sizeof info) == sizeof info) {
    }
    int status = 0;
    pid_t pid;
    while ((pid = ::waitpid(-1, &status, WNOHANG)) > 0) {
      auto found = commands_.find(pid);
      if (found == commands_.end()) continue;  // an orphan adopted by init: just reaped
      const Command command = found->second;
      commands_.erase(found);
      if (command.connection < 0) continue;
      (void)protocol::send(
          command.connection,
          {{"type", "exit"}, {"status", status}, {"run_ns", monotonic_ns() - command.started_ns}});
      ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, command.connection, nullptr);
      ::close(command.connection);
      connections_.erase(command.connection);
    }
  }

  UniqueFd listener_;
  UniqueFd signals_;
  UniqueFd epoll_;
  const protocol::Setup& setup_;
  std::unordered_map<pid_t, Command> commands_;
  std::unordered_map<int, pid_t> connections_;
};

}  // namespace

Result<UniqueFd> listen_for_host(const std::string& socket_path) {
  // Bound by its name from its directory: /proc/net/unix inside shows the name it was bound
  // with, and that must not be a host path.
  const std::filesystem::path path(socket_path);
  const std::string name = path.filename().string();
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (name.size() >= sizeof address.sun_path) {
    return make_error(ErrorCode::kInvalidArgument, "control socket name '{}' is too long", name);
  }
  std::memcpy(address.sun_path, name.c_str(), name.size() + 1);
  if (::chdir(path.parent_path().c_str()) != 0) {
    return errno_error("chdir('{}')", path.parent_path().string());
  }
  UniqueFd listener(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!listener) return errno_error("socket(AF_UNIX)");
  ::unlink(name.c_str());
  if (::bind(listener.get(), reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
    return errno_error("bind('{}')", socket_path);
  }
  if (::chmod(name.c_str(), 0600) != 0) return errno_error("chmod('{}')", socket_path);
  if (::listen(listener.get(), 64) != 0) return errno_error("listen('{}')", socket_path);
  return listener;
}

[[noreturn]] void serve(UniqueFd listener, const protocol::Setup& setup) {
  Server(std::move(listener), setup).run();
}

}  // namespace quarry::sandbox::local::init

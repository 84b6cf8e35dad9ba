// The host's side of a sandbox's network proxy.
#include "sandbox/local/network_proxy.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <nlohmann/json.hpp>

#include "common/file_util.h"
#include "common/json.h"
#include "common/unix_socket.h"

namespace quarry::sandbox::local {
namespace {

constexpr auto kStartTimeout = std::chrono::seconds(5);
constexpr auto kAnswerTimeout = std::chrono::seconds(2);
constexpr size_t kMaxAnswer = 64 * 1024;
// The descriptors the proxy is given: 3 its sandbox's network namespace, 4 the ready pipe,
// 5.. its cgroup's cgroup.procs files.
constexpr int kNetnsFd = 3;
constexpr int kReadyFd = 4;
constexpr int kFirstProcsFd = 5;

// Reads from `fd` until `until` or EOF, at most `limit` bytes.
Result<std::string> read_until(int fd, std::chrono::steady_clock::time_point until, char end,
                               size_t limit) {
  std::string text;
  char chunk[512];
  while (text.size() < limit && (text.empty() || text.back() != end)) {
    const auto left =
        std::chrono::ceil<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
    if (left.count() <= 0) return make_error(ErrorCode::kDeadlineExceeded, "no answer in time");
    pollfd poll_fd{fd, POLLIN, 0};
    const int ready = ::poll(&poll_fd, 1, static_cast<int>(left.count()));
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0) return errno_error("poll");
    if (ready == 0) continue;
    const ssize_t got = ::read(fd, chunk, sizeof chunk);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return errno_error("read");
    if (got == 0) break;
    text.append(chunk, static_cast<size_t>(got));
  }
  return text;
}

// The last line the proxy logged: why it stopped.
std::string last_log_line(const std::filesystem::path& log) {
  auto text = read_file(log);
  if (!text || text->empty()) return "it printed nothing";
  std::string_view lines = *text;
  while (!lines.empty() && lines.back() == '\n')
    lines.remove_suffix(1);
  const size_t start = lines.rfind('\n');
  return std::string(start == std::string_view::npos ? lines : lines.substr(start + 1));
}

}  // namespace

Result<void> start_network_proxy(ProxyLaunch launch) {
  UniqueFd netns(
      ::open(fmt::format("/proc/{}/ns/net", launch.init_pid).c_str(), O_RDONLY | O_CLOEXEC));
  if (!netns) return errno_error("open the network namespace of pid {}", launch.init_pid);
  int ready_pipe[2];
  if (::pipe2(ready_pipe, O_CLOEXEC) != 0) return errno_error("pipe");
  UniqueFd ready_read(ready_pipe[0]);
  UniqueFd ready_write(ready_pipe[1]);
  UniqueFd log(::open(launch.log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600));
  if (!log) return errno_error("open '{}'", launch.log.string());

  // Each descriptor is moved above every number the proxy is given first, so that no dup2
  // below overwrites a descriptor a later one still reads from.
  const int first_free = kFirstProcsFd + static_cast<int>(launch.cgroup_procs.size());
  auto above = [&](int fd) -> Result<UniqueFd> {
    UniqueFd moved(::fcntl(fd, F_DUPFD_CLOEXEC, first_free));
    if (!moved) return errno_error("fcntl(F_DUPFD_CLOEXEC)");
    return moved;
  };
  ASSIGN_OR_RETURN(log, above(log.get()));
  ASSIGN_OR_RETURN(netns, above(netns.get()));
  ASSIGN_OR_RETURN(ready_write, above(ready_write.get()));
  for (auto& procs : launch.cgroup_procs) {
    ASSIGN_OR_RETURN(procs, above(procs.get()));
  }

  std::vector<std::string> args = {
      launch.binary.string(),   "--netns",   std::to_string(kNetnsFd),      "--ready",
      std::to_string(kReadyFd), "--control", launch.control_socket.string()};
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, log.get(), 1);
  posix_spawn_file_actions_adddup2(&actions, log.get(), 2);
  posix_spawn_file_actions_adddup2(&actions, netns.get(), kNetnsFd);
  posix_spawn_file_actions_adddup2(&actions, ready_write.get(), kReadyFd);
  int next_fd = kFirstProcsFd;
  for (const auto& procs : launch.cgroup_procs) {
    posix_spawn_file_actions_adddup2(&actions, procs.get(), next_fd);
    args.insert(args.end(), {"--cgroup-procs", std::to_string(next_fd)});
    ++next_fd;
  }
  posix_spawn_file_actions_addclosefrom_np(&actions, next_fd);
  for (const auto& entry : launch.allow)
    args.insert(args.end(), {"--allow", entry});

  // Its own session, no signals blocked or ignored whatever the creator (a server with a
  // signalfd) does with its own.
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  sigset_t none, all;
  sigemptyset(&none);
  sigfillset(&all);
  posix_spawnattr_setsigmask(&attributes, &none);
  posix_spawnattr_setsigdefault(&attributes, &all);
  posix_spawnattr_setflags(&attributes,
                           POSIX_SPAWN_SETSID | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);

  std::vector<char*> argv;
  for (auto& arg : args)
    argv.push_back(arg.data());
  argv.push_back(nullptr);
  char* envp[] = {const_cast<char*>("TZ=UTC"), nullptr};
  pid_t pid = 0;
  const int spawned =
      ::posix_spawn(&pid, launch.binary.c_str(), &actions, &attributes, argv.data(), envp);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attributes);
  if (spawned != 0) {
    errno = spawned;
    return errno_error("starting '{}'", launch.binary.string());
  }
  ready_write.reset();
  // It forks once it listens and its first process exits, so nothing is left for us to reap.
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  auto answer =
      read_until(ready_read.get(), std::chrono::steady_clock::now() + kStartTimeout, '\n', 64);
  if (!answer || *answer != "ready\n") {
    return make_error(ErrorCode::kInternal,
                      "the sandbox's network proxy did not start: {} (see {})",
                      last_log_line(launch.log), launch.log.string());
  }
  return {};
}

Result<NetworkActivity> network_activity(const std::filesystem::path& control_socket,
                                         uint64_t since) {
  auto fail = [&](std::string_view why) {
    return make_error(ErrorCode::kUnavailable, "the sandbox's network proxy {} ({})", why,
                      control_socket.string());
  };
  auto connection = connect_unix(control_socket);
  if (!connection) return fail(fmt::format("does not answer: {}", connection.error().message));
  // A command keeps kMaxDenialsKept of its refusals: the proxy sends no more, so the answer
  // stays within kMaxAnswer whatever the sandbox asked it for (a denial is under 2 KB).
  const std::string question =
      nlohmann::json{{"since", since}, {"max", kMaxDenialsKept}}.dump() + "\n";
  if (::send(connection->get(), question.data(), question.size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(question.size())) {
    return fail("took no question");
  }
  auto answer = read_until(connection->get(), std::chrono::steady_clock::now() + kAnswerTimeout,
                           '\n', kMaxAnswer);
  if (!answer) return fail(fmt::format("gave no answer: {}", answer.error().message));
  if (answer->empty() || answer->back() != '\n') {
    return fail(fmt::format("gave an answer cut short or longer than {} bytes", kMaxAnswer));
  }
  auto json = parse_json_or_discarded(*answer);
  try {
    NetworkActivity activity;
    json.at("allowed").get_to(activity.allowed);
    json.at("denied").get_to(activity.denied);
    json.at("seq").get_to(activity.seq);
    for (const auto& denial : json.at("denials")) {
      activity.denials.push_back({denial.at("host").get<std::string>(),
                                  denial.at("port").get<uint16_t>(),
                                  denial.at("reason").get<std::string>()});
    }
    return activity;
  } catch (const nlohmann::json::exception&) {
    return fail("answered something else than its counts");
  }
}

void add_network_denials(const std::filesystem::path& control_socket, const NetworkActivity& before,
                         ExecResult& result) {
  auto after = network_activity(control_socket, before.seq);
  if (!after) {
    spdlog::warn("{}", after.error().message);
    return;
  }
  result.denied_connections = after->denied - before.denied;
  for (auto& denial : after->denials) {
    if (result.denials.size() >= kMaxDenialsKept) break;
    result.denials.push_back(std::move(denial));
  }
}

}  // namespace quarry::sandbox::local

#include "server_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <charconv>

#include "common/unique_fd.h"

extern char** environ;

namespace quarry::testing {
namespace {

// Reads the server's first line ("listening 127.0.0.1:43521") within `timeout`.
Result<std::string> first_line(int fd, std::chrono::milliseconds timeout) {
  std::string line;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      return make_error(ErrorCode::kDeadlineExceeded,
                        "scripted_model_server did not say it listens within {} ms",
                        timeout.count());
    }
    pollfd watch{.fd = fd, .events = POLLIN, .revents = 0};
    if (::poll(&watch, 1, static_cast<int>(left.count())) <= 0) continue;
    char c;
    const ssize_t n = ::read(fd, &c, 1);
    if (n == 0) {
      return make_error(ErrorCode::kUnavailable,
                        "scripted_model_server exited before listening (its stderr says why)");
    }
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno_error("read(scripted_model_server's stdout)");
    }
    if (c == '\n') return line;
    line.push_back(c);
  }
}

}  // namespace

Result<std::unique_ptr<ScriptedModelServer>> ScriptedModelServer::start(
    const ScriptedModelOptions& options) {
  std::vector<std::string> args = {QUARRY_SCRIPTED_MODEL_SERVER, "--port", "0"};
  auto add = [&](const char* flag, const std::string& value) {
    if (value.empty()) return;
    args.push_back(flag);
    args.push_back(value);
  };
  add("--scenario", options.scenario.string());
  add("--scenario-dir", options.scenario_dir.string());
  add("--api-key", options.api_key);
  add("--record", options.record.string());
  add("--tls-cert", options.tls_cert.string());
  add("--tls-key", options.tls_key.string());
  args.insert(args.end(), options.extra_args.begin(), options.extra_args.end());
  std::vector<char*> argv;
  for (auto& arg : args)
    argv.push_back(arg.data());
  argv.push_back(nullptr);

  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return errno_error("pipe2");
  UniqueFd read_end(fds[0]);
  UniqueFd write_end(fds[1]);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, write_end.get(), STDOUT_FILENO);
  pid_t pid = -1;
  const int spawned = ::posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (spawned != 0) {
    errno = spawned;
    return errno_error("posix_spawn({})", argv[0]);
  }
  write_end.reset();
  std::unique_ptr<ScriptedModelServer> server(
      new ScriptedModelServer(pid, 0, !options.tls_cert.empty()));
  ASSIGN_OR_RETURN(auto line, first_line(read_end.get(), std::chrono::seconds(10)));
  constexpr std::string_view kPrefix = "listening 127.0.0.1:";
  unsigned port = 0;
  if (!line.starts_with(kPrefix) ||
      std::from_chars(line.data() + kPrefix.size(), line.data() + line.size(), port).ec !=
          std::errc()) {
    return make_error(ErrorCode::kInternal, "scripted_model_server said '{}', not '{}PORT'", line,
                      kPrefix);
  }
  server->port_ = static_cast<uint16_t>(port);
  return server;
}

ScriptedModelServer::~ScriptedModelServer() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGTERM);
  ::waitpid(pid_, nullptr, 0);
}

std::string ScriptedModelServer::base_url() const {
  return fmt::format("{}://127.0.0.1:{}/v1", tls_ ? "https" : "http", port_);
}

}  // namespace quarry::testing

#include "common/command.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <spdlog/spdlog.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>

#include "common/unique_fd.h"

extern char** environ;

namespace quarry {
namespace {

constexpr size_t kKeptOutput = 64 * 1024;

}  // namespace

std::string tail_lines(std::string_view output, size_t lines) {
  size_t end = output.size();
  if (end > 0 && output[end - 1] == '\n') --end;
  size_t start = end;
  while (lines > 0 && start > 0) {
    size_t newline = output.rfind('\n', start - 1);
    if (newline == std::string_view::npos) return std::string(output.substr(0, end));
    start = newline;
    --lines;
  }
  return std::string(output.substr(start == 0 ? 0 : start + 1, end - (start == 0 ? 0 : start + 1)));
}

std::optional<std::filesystem::path> find_program(std::string_view program) {
  if (program.find('/') != std::string_view::npos) return std::filesystem::path(program);
  const char* path = std::getenv("PATH");
  std::string_view dirs =
      path ? path : "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
  while (!dirs.empty()) {
    auto colon = dirs.find(':');
    std::filesystem::path candidate(dirs.substr(0, colon));
    candidate /= program;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
    if (colon == std::string_view::npos) break;
    dirs.remove_prefix(colon + 1);
  }
  return std::nullopt;
}

Result<CommandOutput> run_command(const std::vector<std::string>& argv,
                                  const CommandOptions& options) {
  if (argv.empty()) return make_error(ErrorCode::kInvalidArgument, "run_command: empty argv");
  spdlog::debug("running {}", fmt::join(argv, " "));
  auto program = find_program(argv[0]);
  if (!program) {
    return make_error(ErrorCode::kFailedPrecondition,
                      "'{}' is not installed (not found in PATH); run scripts/setup", argv[0]);
  }

  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0) return errno_error("pipe");
  UniqueFd read_end(pipe_fds[0]);
  UniqueFd write_end(pipe_fds[1]);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, write_end.get(), STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, write_end.get(), STDERR_FILENO);
  if (!options.working_directory.empty()) {
    posix_spawn_file_actions_addchdir_np(&actions, options.working_directory.c_str());
  }

  std::vector<char*> args;
  for (const auto& arg : argv)
    args.push_back(const_cast<char*>(arg.c_str()));
  args.push_back(nullptr);
  std::vector<std::string> env_strings;
  std::vector<char*> env;
  char** envp = environ;
  if (options.environment) {
    for (const auto& [key, value] : *options.environment)
      env_strings.push_back(key + "=" + value);
    for (auto& entry : env_strings)
      env.push_back(entry.data());
    env.push_back(nullptr);
    envp = env.data();
  }

  // A command that can be cancelled runs in a process group of its own, killed whole: argv[0]
  // may be a wrapper (pyenv's python3 is a script that starts the real one). Otherwise it stays
  // in ours, where the terminal's Ctrl-C reaches it with us.
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  if (options.cancel_fd >= 0) {
    posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETPGROUP);
    posix_spawnattr_setpgroup(&attributes, 0);
  }
  pid_t pid = 0;
  int spawn_error = ::posix_spawn(&pid, program->c_str(), &actions, &attributes, args.data(), envp);
  posix_spawnattr_destroy(&attributes);
  posix_spawn_file_actions_destroy(&actions);
  write_end.reset();
  if (spawn_error != 0) {
    errno = spawn_error;
    return errno_error("starting '{}'", program->string());
  }

  const auto name = [&] {
    return options.name.empty() ? fmt::format("{}", fmt::join(argv, " ")) : options.name;
  };
  CommandOutput result;
  std::string pending;
  char buffer[4096];
  while (true) {
    pollfd polls[2] = {{read_end.get(), POLLIN, 0}, {options.cancel_fd, POLLIN, 0}};
    if (::poll(polls, options.cancel_fd >= 0 ? 2 : 1, -1) < 0) {
      if (errno == EINTR) continue;
      return errno_error("poll");
    }
    if (polls[1].revents != 0) {
      ::kill(-pid, SIGKILL);
      while (::waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
      }
      return make_error(ErrorCode::kCancelled, "'{}' was stopped: cancelled", name());
    }
    ssize_t n = ::read(read_end.get(), buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    result.output.append(buffer, static_cast<size_t>(n));
    if (result.output.size() > 2 * kKeptOutput)
      result.output.erase(0, result.output.size() - kKeptOutput);
    if (options.on_line) {
      pending.append(buffer, static_cast<size_t>(n));
      size_t newline;
      while ((newline = pending.find_first_of("\r\n")) != std::string::npos) {
        if (newline > 0) options.on_line(std::string_view(pending).substr(0, newline));
        pending.erase(0, newline + 1);
      }
    }
  }
  if (options.on_line && !pending.empty()) options.on_line(pending);

  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return errno_error("waitpid for '{}'", argv[0]);
  }
  if (WIFSIGNALED(status)) {
    return make_error(ErrorCode::kInternal, "'{}' was killed by signal {}; its last output:\n{}",
                      name(), WTERMSIG(status), tail_lines(result.output, 20));
  }
  result.exit_code = WEXITSTATUS(status);
  if (result.exit_code != 0) {
    return make_error(ErrorCode::kInternal, "'{}' exited with status {}; its last output:\n{}",
                      name(), result.exit_code, tail_lines(result.output, 20));
  }
  return result;
}

}  // namespace quarry

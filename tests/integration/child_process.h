// A program a test starts (a quarry server, `quarry ask`, a stand-in server): its stdout read
// line by line, its stderr into a file or inherited; killed when the test is done with it.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace quarry::testing {

class ChildProcess {
 public:
  // Starts argv[0] (a path) with our environment; `stderr_file` empty: stderr is ours.
  explicit ChildProcess(const std::vector<std::string>& argv,
                        const std::filesystem::path& stderr_file = {});
  ~ChildProcess();  // SIGKILL and wait, if it still runs
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  bool started() const { return pid_ > 0; }
  pid_t pid() const { return pid_; }
  // The next line of its stdout within `timeout`, without the newline; nullopt when its stdout
  // ended or the time ran out.
  std::optional<std::string> line(std::chrono::milliseconds timeout = std::chrono::seconds(60));
  // The first line that contains `text`, within `timeout`.
  std::optional<std::string> line_with(
      std::string_view text, std::chrono::milliseconds timeout = std::chrono::seconds(60));
  // All it prints until its stdout ends.
  std::string rest();
  // Sends `signal` and waits; returns the wait status.
  int stop(int signal);
  int wait();

 private:
  pid_t pid_ = -1;
  int out_ = -1;
  std::string pending_;
};

}  // namespace quarry::testing

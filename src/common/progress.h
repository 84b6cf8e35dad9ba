// Progress of a long operation (image build, seeding): a redrawn status line on a terminal,
// plain log lines otherwise.
#pragma once

#include <chrono>
#include <string>
#include <string_view>

namespace quarry {

class Progress {
 public:
  // `task` names the operation ("image build"); `steps` is the number of stages, 0 if unknown.
  Progress(std::string task, int steps);
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // Starts the next stage.
  void step(std::string_view description);
  // Detail within the current stage (e.g. a line printed by a tool). On a terminal it replaces
  // the status line; otherwise it is logged at debug level so plain logs stay readable.
  void detail(std::string_view text);
  // Ends the operation with a summary line.
  void finish(std::string_view summary);

 private:
  void redraw(std::string_view text);

  std::string task_;
  int steps_;
  int current_ = 0;
  bool terminal_;
  bool finished_ = false;
  std::chrono::steady_clock::time_point started_;
  std::chrono::steady_clock::time_point last_redraw_{};
};

}  // namespace quarry

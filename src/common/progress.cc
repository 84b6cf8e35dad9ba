#include "common/progress.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstdio>

namespace quarry {

Progress::Progress(std::string task, int steps)
    : task_(std::move(task)),
      steps_(steps),
      terminal_(::isatty(STDERR_FILENO) == 1),
      started_(std::chrono::steady_clock::now()) {}

Progress::~Progress() {
  if (terminal_ && !finished_) std::fputs("\n", stderr);
}

void Progress::step(std::string_view description) {
  ++current_;
  std::string line = steps_ > 0 ? fmt::format("{} [{}/{}] {}", task_, current_, steps_, description)
                                : fmt::format("{}: {}", task_, description);
  if (terminal_) {
    redraw(line);
  } else {
    spdlog::info("{}", line);
  }
}

void Progress::detail(std::string_view text) {
  if (!terminal_) {
    spdlog::debug("{}: {}", task_, text);
    return;
  }
  // Redrawing on every line of a chatty tool would flood a slow terminal; 10 Hz is plenty.
  auto now = std::chrono::steady_clock::now();
  if (now - last_redraw_ < std::chrono::milliseconds(100)) return;
  last_redraw_ = now;
  redraw(fmt::format("{} [{}/{}] {}", task_, current_, steps_, text));
}

void Progress::finish(std::string_view summary) {
  finished_ = true;
  auto seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
  std::string line = fmt::format("{}: {} ({:.1f}s)", task_, summary, seconds);
  if (terminal_) {
    redraw(line);
    std::fputs("\n", stderr);
  } else {
    spdlog::info("{}", line);
  }
}

void Progress::redraw(std::string_view text) {
  // Keep to one terminal line: cut long text rather than wrap.
  constexpr size_t kWidth = 100;
  std::string shown(text.substr(0, kWidth));
  std::fprintf(stderr, "\r\033[K%s", shown.c_str());
  std::fflush(stderr);
}

}  // namespace quarry

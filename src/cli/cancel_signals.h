// Ctrl-C for long commands: while one of these lives, SIGINT, SIGTERM and SIGHUP become
// readable on a signalfd instead of killing the process, so a cancelled command can clean up
// (kill what it started, destroy a sandbox it made, record the end of a turn).
#pragma once

#include <signal.h>
#include <sys/signalfd.h>

#include "common/unique_fd.h"

namespace quarry::cli {

class CancelSignals {
 public:
  CancelSignals() {
    sigset_t signals;
    sigemptyset(&signals);
    for (int signal : {SIGINT, SIGTERM, SIGHUP})
      sigaddset(&signals, signal);
    ::sigprocmask(SIG_BLOCK, &signals, &old_);
    fd_.reset(::signalfd(-1, &signals, SFD_CLOEXEC | SFD_NONBLOCK));
  }
  ~CancelSignals() { ::sigprocmask(SIG_SETMASK, &old_, nullptr); }
  CancelSignals(const CancelSignals&) = delete;
  CancelSignals& operator=(const CancelSignals&) = delete;

  // Readable once a signal arrived; pass it as a cancel_fd.
  int fd() const { return fd_.get(); }

 private:
  sigset_t old_;
  UniqueFd fd_;
};

// Exit status after a cancelled command, as a shell reports SIGINT.
inline constexpr int kCancelledExit = 130;

}  // namespace quarry::cli

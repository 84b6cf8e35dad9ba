#include "sandbox/local/local_process.h"

#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <thread>

#include "sandbox/local/network_proxy.h"
#include "sandbox/local/protocol.h"
#include "sandbox/metering.h"

namespace quarry::sandbox::local {
namespace {

using Clock = std::chrono::steady_clock;

// A frame larger than this is not an answer but a process gone wrong.
constexpr size_t kMaxFrame = 16 << 20;
// How long a frame may take to go out, and init's exit report to come in once begun.
constexpr auto kWriteTimeout = std::chrono::seconds(5);
constexpr auto kRestOfMessage = std::chrono::seconds(5);
// After the process ended (or was killed), how long its output may take to drain.
constexpr auto kDrain = std::chrono::seconds(10);

double milliseconds(Clock::duration duration) {
  return std::chrono::duration<double, std::milli>(duration).count();
}

int poll_timeout(Clock::time_point now, std::optional<Clock::time_point> until) {
  if (!until) return -1;
  return static_cast<int>(
      std::max<int64_t>(std::chrono::ceil<std::chrono::milliseconds>(*until - now).count(), 0));
}

}  // namespace

void Capture::read(char* buffer, size_t size, uint64_t limit,
                   const std::function<void(OutputStream, std::string_view)>& on_output,
                   bool& truncated) {
  const ssize_t n = ::read(fd, buffer, size);
  if (n < 0 && errno == EINTR) return;
  if (n <= 0) {
    open = false;
    return;
  }
  const std::string_view chunk(buffer, static_cast<size_t>(n));
  if (on_output) on_output(stream, chunk);
  const size_t room = limit > text->size() ? limit - text->size() : 0;
  if (chunk.size() > room) truncated = true;
  text->append(chunk.substr(0, room));
}

LocalProcess::LocalProcess(CgroupDriver& cgroups, Parts parts)
    : cgroups_(cgroups), parts_(std::move(parts)) {}

LocalProcess::~LocalProcess() {
  (void)cgroups_.remove_exec(parts_.sandbox, parts_.exec);
}

bool LocalProcess::alive() {
  if (ended_) return false;
  pollfd connection{parts_.connection.get(), POLLIN, 0};
  if (::poll(&connection, 1, 0) > 0) read_exit();
  return !ended_;
}

void LocalProcess::read_exit() {
  auto message = protocol::receive(parts_.connection.get(), Clock::now() + kRestOfMessage);
  ended_ = true;
  if (!message) return;  // the connection closed: the sandbox (its init) is gone
  auto reply = protocol::parse_reply(message->body);
  if (reply && reply->type == "exit") status_ = reply->status;
}

Result<void> LocalProcess::write_frame(std::string_view message) {
  const uint32_t length = static_cast<uint32_t>(message.size());
  std::string frame(4, '\0');
  for (int byte = 0; byte < 4; ++byte)
    frame[static_cast<size_t>(byte)] = static_cast<char>((length >> (8 * byte)) & 0xff);
  frame.append(message);
  const auto deadline = Clock::now() + kWriteTimeout;
  std::string_view rest = frame;
  while (!rest.empty()) {
    pollfd channel{parts_.channel.get(), POLLOUT, 0};
    if (::poll(&channel, 1, poll_timeout(Clock::now(), deadline)) == 0) {
      return make_error(ErrorCode::kDeadlineExceeded, "the process did not read its input for {} s",
                        kWriteTimeout.count());
    }
    const ssize_t sent = ::send(parts_.channel.get(), rest.data(), rest.size(), MSG_NOSIGNAL);
    if (sent < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      if (errno == EPIPE || errno == ECONNRESET) {
        return make_error(ErrorCode::kUnavailable, "the process has stopped reading its input");
      }
      return errno_error("writing to the process");
    }
    rest.remove_prefix(static_cast<size_t>(sent));
  }
  return {};
}

Result<void> LocalProcess::read_channel(std::optional<std::string>& frame) {
  char buffer[64 * 1024];
  const ssize_t n = ::recv(parts_.channel.get(), buffer, sizeof buffer, MSG_DONTWAIT);
  if (n < 0) {
    if (errno == EINTR || errno == EAGAIN) return {};
    return errno_error("reading from the process");
  }
  if (n == 0) return {};  // it closed its end: its exit report follows
  pending_.append(buffer, static_cast<size_t>(n));
  if (pending_.size() < 4) return {};
  uint32_t length = 0;
  for (int byte = 3; byte >= 0; --byte)
    length = (length << 8) | static_cast<unsigned char>(pending_[static_cast<size_t>(byte)]);
  if (length > kMaxFrame) {
    return make_error(ErrorCode::kInternal, "the process answered with a frame of {} bytes",
                      length);
  }
  if (pending_.size() < 4 + size_t{length}) return {};
  frame = pending_.substr(4, length);
  pending_.erase(0, 4 + size_t{length});
  return {};
}

void LocalProcess::kill_leftovers() {
  for (int round = 0; round < 5; ++round) {
    auto pids = cgroups_.exec_processes(parts_.sandbox, parts_.exec);
    if (!pids) return;
    if (leader_ == 0) {
      if (pids->size() == 1) leader_ = pids->front();
      return;
    }
    bool others = false;
    for (pid_t pid : *pids) {
      if (pid != leader_) {
        ::kill(pid, SIGKILL);
        others = true;
      }
    }
    if (!others) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

Result<StepResult> LocalProcess::step(const StepRequest& request) {
  const auto call_start = Clock::now();
  if (!alive()) {
    return make_error(ErrorCode::kFailedPrecondition, "the process has ended; start a new one");
  }
  StepResult step;
  ExecResult& result = step.exec;
  result.memory_limit_bytes = parts_.memory_limit_bytes;
  // What an earlier step left on the channel is not this step's answer.
  pending_.clear();
  for (std::optional<std::string> stale; read_channel(stale) && stale; stale.reset()) {
  }
  pending_.clear();

  auto peak = cgroups_.reset_peak(parts_.sandbox, parts_.exec);
  if (!peak) {
    if (peak.error().code != ErrorCode::kFailedPrecondition) return std::unexpected(peak.error());
    step.peak_since_start = true;
  }
  ASSIGN_OR_RETURN(const auto before, cgroups_.exec_counters(parts_.sandbox, parts_.exec));
  std::optional<NetworkActivity> network_before;
  if (!parts_.network_control.empty()) {
    auto counted = network_activity(parts_.network_control, UINT64_MAX);
    if (counted) network_before = std::move(*counted);
  }
  // Taken before the write: once the request is out, the process may answer before this thread
  // runs again.
  const auto sent = Clock::now();
  RETURN_IF_ERROR(write_frame(request.message));
  Clock::time_point answered = sent;

  Capture captures[] = {{parts_.stdout_read.get(), OutputStream::kStdout, &result.stdout_text},
                        {parts_.stderr_read.get(), OutputStream::kStderr, &result.stderr_text}};
  const auto deadline = sent + request.timeout;
  std::optional<Clock::time_point> kill_at;  // after an interrupt: the grace's end
  std::optional<Clock::time_point> give_up;  // once killed or ended: the output's last chance
  bool killed = false;
  const auto kill = [&] {
    (void)cgroups_.kill_exec(parts_.sandbox, parts_.exec);
    killed = true;
    kill_at.reset();
    give_up = Clock::now() + kDrain;
  };
  const auto interrupt = [&](std::chrono::milliseconds grace) {
    if (request.interrupt.empty() || !write_frame(request.interrupt)) {
      kill();
    } else {
      kill_at = Clock::now() + grace;
    }
  };
  char buffer[64 * 1024];
  while (!step.reply && (!ended_ || captures[0].open || captures[1].open)) {
    const auto now = Clock::now();
    if (ended_ && !give_up) give_up = now + kDrain;
    if (give_up && now >= *give_up) {
      return make_error(ErrorCode::kInternal,
                        "sandbox {}: the process did not go away after it was killed or ended",
                        parts_.sandbox);
    }
    if (!ended_ && !result.timed_out && !step.cancelled && now >= deadline) {
      result.timed_out = true;
      interrupt(request.grace);
    }
    if (kill_at && now >= *kill_at) kill();

    pollfd polls[5];
    int count = 0;
    for (const auto& capture : captures) {
      if (capture.open) polls[count++] = {capture.fd, POLLIN, 0};
    }
    if (!ended_) {
      polls[count++] = {parts_.channel.get(), POLLIN, 0};
      polls[count++] = {parts_.connection.get(), POLLIN, 0};
      if (request.cancel_fd >= 0 && !step.cancelled) {
        polls[count++] = {request.cancel_fd, POLLIN, 0};
      }
    }
    // Wake for the next thing that is due: the timeout, the grace's end, giving up.
    std::optional<Clock::time_point> until = give_up;
    if (kill_at) {
      until = kill_at;
    } else if (!result.timed_out && !step.cancelled && !killed) {
      until = deadline;
    }
    const int ready = ::poll(polls, static_cast<nfds_t>(count), poll_timeout(now, until));
    if (ready < 0) {
      if (errno == EINTR) continue;
      return errno_error("poll");
    }
    for (int i = 0; i < count; ++i) {
      if (polls[i].revents == 0) continue;
      const int fd = polls[i].fd;
      if (fd == request.cancel_fd) {
        step.cancelled = true;
        interrupt(request.cancel_grace);
      } else if (fd == parts_.channel.get()) {
        RETURN_IF_ERROR(read_channel(step.reply));
        if (step.reply) answered = Clock::now();
      } else if (fd == parts_.connection.get()) {
        read_exit();
        answered = Clock::now();
      } else {
        for (auto& capture : captures) {
          if (capture.fd == fd) {
            capture.read(buffer, sizeof buffer, request.output_limit, request.on_output,
                         result.truncated);
          }
        }
      }
    }
  }
  // Output written before the answer is in the pipes by now: take it.
  for (bool more = true; more;) {
    more = false;
    for (auto& capture : captures) {
      pollfd readable{capture.fd, POLLIN, 0};
      if (capture.open && ::poll(&readable, 1, 0) > 0) {
        capture.read(buffer, sizeof buffer, request.output_limit, request.on_output,
                     result.truncated);
        more = true;
      }
    }
  }
  if (ended_ && !status_ && !killed) {
    return make_error(ErrorCode::kUnavailable, "sandbox {} stopped while the process ran",
                      parts_.sandbox);
  }
  if (!ended_ && !killed) kill_leftovers();

  ASSIGN_OR_RETURN(const auto after, cgroups_.exec_counters(parts_.sandbox, parts_.exec));
  result.cpu_ms = static_cast<double>(after.cpu_usage_ns - before.cpu_usage_ns) / 1e6;
  result.oom = after.oom_kills > before.oom_kills;
  result.peak_memory_bytes = after.peak_memory_bytes;
  if (peak) {
    if (auto since = cgroup_files::read_number_at(peak->get())) result.peak_memory_bytes = *since;
  }
  if (ended_) {
    step.exited = true;
    // Killed before init could report it: as SIGKILL's status would say.
    set_exit_status(result, status_.value_or(killed ? SIGKILL : 0));
  } else if (killed) {
    // Killed, its report not in yet: it is on its way.
    read_exit();
    step.exited = true;
    set_exit_status(result, SIGKILL);
  }
  result.run_ms = milliseconds(answered - sent);
  if (network_before) add_network_denials(parts_.network_control, *network_before, result);
  describe(result, request.timeout);
  result.overhead_ms = std::max(0.0, milliseconds(Clock::now() - call_start) - result.run_ms);
  return step;
}

}  // namespace quarry::sandbox::local

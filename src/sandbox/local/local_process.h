// A local sandbox's long-running command (sandbox::Process): started by init like an exec, in
// an exec cgroup of its own, with a unix socket as its stdin that steps are written to and
// answered on. Each step is metered from that cgroup: CPU time and OOM kills as differences,
// peak memory reset before the step.
#pragma once

#include <filesystem>
#include <functional>
#include <optional>
#include <string>

#include "common/unique_fd.h"
#include "sandbox/local/cgroup.h"
#include "sandbox/provider.h"

namespace quarry::sandbox::local {

// Output of one stream of a running command: kept up to a limit, all of it passed on.
struct Capture {
  int fd;
  OutputStream stream;
  std::string* text;
  bool open = true;
  // Reads what the stream has (one read); closes it at EOF. Sets `truncated` when the text
  // would pass `limit`.
  void read(char* buffer, size_t size, uint64_t limit,
            const std::function<void(OutputStream, std::string_view)>& on_output, bool& truncated);
};

class LocalProcess final : public Process {
 public:
  struct Parts {
    std::string sandbox;
    std::string exec;     // its exec cgroup
    UniqueFd connection;  // to init: its exit report comes on it
    UniqueFd channel;     // the command's stdin
    UniqueFd stdout_read;
    UniqueFd stderr_read;
    uint64_t memory_limit_bytes = 0;
    // The sandbox's network proxy, asked what each step's connections were refused (empty:
    // the sandbox has none).
    std::filesystem::path network_control;
  };
  LocalProcess(CgroupDriver& cgroups, Parts parts);
  ~LocalProcess() override;

  Result<StepResult> step(const StepRequest& request) override;
  bool alive() override;
  const std::string& id() const override { return parts_.exec; }

 private:
  Result<void> write_frame(std::string_view message);
  // Takes what the channel has; a whole frame, once there, into `frame`.
  Result<void> read_channel(std::optional<std::string>& frame);
  // init's report that the command ended (or its connection closing: the sandbox is gone).
  void read_exit();
  // Kills what a step left running (its children): every process of the cgroup but the
  // command itself, which is known once its first step is answered (it has no children yet).
  void kill_leftovers();

  CgroupDriver& cgroups_;
  Parts parts_;
  std::string pending_;  // bytes of a frame not all there yet
  bool ended_ = false;
  pid_t leader_ = 0;           // the command's host pid
  std::optional<int> status_;  // the wait status init reported
};

}  // namespace quarry::sandbox::local

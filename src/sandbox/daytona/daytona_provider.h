// DaytonaProvider: sandboxes on a remote engine that speaks Daytona's API (Daytona itself, or
// another quarry's /daytona). quarry makes, uses and removes them as it does its local ones:
// each is made with a label of its own, so that one whose create failed half-way (an answer
// lost, a sandbox stuck in `creating`, a build that failed) is found and removed, never leaked;
// delete waits until the sandbox is gone. Every command runs under a small probe in the sandbox
// (probe.py) that measures what Daytona does not report: CPU time, peak memory and OOM kills
// (from the sandbox's cgroup files, else the kernel's accounting of the command), with its exit
// status and its stdout and stderr apart; quarry measures the run time the probe saw against
// the whole call for the overhead.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "config/config.h"
#include "sandbox/daytona/daytona_client.h"
#include "sandbox/provider.h"

namespace quarry::sandbox::daytona {

// The label quarry gives each sandbox it creates, unique to that create: the handle to find a
// sandbox whose create answer never came.
inline constexpr std::string_view kCreateLabel = "quarry.create";

class DaytonaProvider final : public SandboxProvider {
 public:
  // The API key is read from the environment variable the configuration names.
  static Result<std::unique_ptr<DaytonaProvider>> open(const SandboxConfig& config);
  // With the key given (tests, and accounts with keys of their own).
  static Result<std::unique_ptr<DaytonaProvider>> open(const SandboxConfig& config,
                                                       std::string api_key);

  Result<SandboxInfo> create(const SandboxSpec& spec) override;
  Result<void> prepare(std::string_view id, const PrepareSpec& spec) override;
  Result<ExecResult> exec(std::string_view id, const ExecRequest& request) override;
  Result<int> stop_commands(std::string_view id) override;
  Result<void> write_file(std::string_view id, std::string_view path, std::istream& content,
                          int cancel_fd) override;
  Result<uint64_t> read_file(std::string_view id, std::string_view path, std::ostream& out,
                             uint64_t max_bytes, int cancel_fd) override;
  Result<bool> is_directory(std::string_view id, std::string_view path) override;
  Result<std::vector<FileInfo>> list_files(std::string_view id,
                                           std::string_view directory) override;
  Result<void> destroy(std::string_view id) override;
  Result<bool> is_alive(std::string_view id) override;
  Result<std::vector<SandboxInfo>> find(const Labels& labels) override;

 private:
  DaytonaProvider(SandboxConfig config, DaytonaClient client);
  // The toolbox URL of sandbox `id` (from its Sandbox object; kept once known).
  Result<Url> toolbox(std::string_view id);
  // Deletes a sandbox that create is giving up on (a warning, or information if the create was
  // cancelled); says so in the log if that fails too.
  void discard(std::string_view id, const Error& why);
  // Polls the sandbox until it is `started`; fails on error / build_failed or the deadline, and
  // with kCancelled once `cancel_fd` (-1: none) is readable.
  Result<nlohmann::json> wait_started(std::string_view id, int cancel_fd);

  SandboxConfig config_;
  DaytonaClient client_;
  std::mutex mutex_;
  std::map<std::string, Url, std::less<>> toolboxes_;
};

// The API key in environment variable `variable`; the error says to export it, or to name
// another variable in `named_in` (the configuration key that named this one), and which of
// several accounts it is for.
Result<std::string> api_key_from(const std::string& variable, std::string_view named_in,
                                 std::string_view account = {});

// The Sandbox object as quarry's SandboxInfo (labels, resources in whole cores and GiB, state,
// created time, network).
SandboxInfo info_from(const nlohmann::json& sandbox);

// The probe's report, parsed from a command's output: the command's own output and status and
// what the probe measured; kInternal when the output holds no report (the probe did not run:
// the message says what the sandbox printed instead).
Result<ExecResult> parse_probe_report(std::string_view output);

}  // namespace quarry::sandbox::daytona

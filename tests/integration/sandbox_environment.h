// A real local provider for integration tests: its own state directory (so tests never touch
// the host's sandboxes), the shared image cache, and the freshly built quarry-init.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>

#include "sandbox/local/local_provider.h"

namespace quarry::testing {

class SandboxEnvironment : public ::testing::Environment {
 public:
  void SetUp() override;
  void TearDown() override;

  static SandboxEnvironment& get();
  sandbox::local::LocalProvider& provider() { return *provider_; }
  const Config& config() const { return config_; }
  const std::filesystem::path& state_dir() const { return state_dir_; }
  std::filesystem::path cache_dir() const;
  std::filesystem::path quarry_binary() const;
  std::filesystem::path init_binary() const;
  std::filesystem::path proxy_binary() const;
  // A history database of the running test's own, not there yet: <state>/history-<test>.db.
  std::filesystem::path fresh_history_path() const;

 private:
  Config config_;
  std::filesystem::path state_dir_;
  std::unique_ptr<sandbox::local::LocalProvider> provider_;
};

// Runs argv in the sandbox with the defaults most tests want.
Result<sandbox::ExecResult> run(std::string_view id, std::vector<std::string> argv,
                                std::chrono::milliseconds timeout = std::chrono::seconds(60));
Result<sandbox::ExecResult> python(std::string_view id, const std::string& code,
                                   std::chrono::milliseconds timeout = std::chrono::seconds(60));

// A sandbox that is destroyed when the test ends.
class ScopedSandbox {
 public:
  explicit ScopedSandbox(sandbox::SandboxSpec spec = default_spec());
  ~ScopedSandbox();
  const std::string& id() const { return id_; }
  static sandbox::SandboxSpec default_spec();

 private:
  std::string id_;
};

// Host pids whose cgroup (in any hierarchy) is under quarry/<id>, read from /proc; zombies
// (dead, not yet reaped by the sandbox's init) are not counted.
std::vector<pid_t> host_processes_of(std::string_view id);

// The command lines of the sandbox's host processes, read again every 50 ms until `settled`
// holds of them or `timeout` passes; the last reading either way. For what changes a moment
// after its cause, as a command its caller left, killed by the sandbox's init.
std::vector<std::string> command_lines_when(
    std::string_view id, const std::function<bool(const std::vector<std::string>&)>& settled,
    std::chrono::milliseconds timeout = std::chrono::seconds(10));

// The sandbox's cgroup directories (quarry/<id>) in every cgroup hierarchy of the host, v1 or v2.
std::vector<std::filesystem::path> cgroups_of(std::string_view id);

// SIGKILLs sandbox `id`'s init behind its provider's back, as an operator or the kernel might,
// and returns once it has exited (reaped if it was this process's child).
void kill_init_of(std::string_view id);

// Reaps sandbox inits re-parented to this process (a subreaper) after their creator died and
// another process destroyed them.
void reap_orphaned_inits();

}  // namespace quarry::testing

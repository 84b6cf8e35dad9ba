// The local provider: sandboxes made of Linux namespaces, cgroups, an overlay root and seccomp,
// each run by its own quarry-init. See docs/architecture.md for the picture.
#pragma once

#include <atomic>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>

#include "sandbox/local/cgroup.h"
#include "sandbox/local/image.h"
#include "sandbox/local/network_proxy.h"
#include "sandbox/local/state.h"
#include "sandbox/local/volume.h"
#include "sandbox/provider.h"

namespace quarry::sandbox::local {

struct LocalProviderOptions {
  std::filesystem::path state_dir;
  std::filesystem::path cache_dir;
  // quarry-init; empty means the one installed beside the running executable.
  std::filesystem::path init_binary;
  // How far the sandboxes' limits together may exceed the host (capacity.overcommit).
  CapacityConfig::Overcommit overcommit;
  // quarry-proxy, for sandboxes with network mode allowlist; empty: beside quarry, like init.
  std::filesystem::path proxy_binary;
};

class LocalProvider final : public SandboxProvider {
 public:
  static Result<std::unique_ptr<LocalProvider>> open(const SandboxConfig& config,
                                                     LocalProviderOptions options);

  Result<Runtime> runtime() override;
  Result<SandboxInfo> create(const SandboxSpec& spec) override;
  Result<void> prepare(std::string_view id, const PrepareSpec& spec) override;
  Result<ExecResult> exec(std::string_view id, const ExecRequest& request) override;
  Result<std::unique_ptr<Process>> start(std::string_view id, const ExecRequest& request) override;
  Result<int> stop_commands(std::string_view id) override;
  Result<void> write_file(std::string_view id, std::string_view path,
                          std::istream& content) override;
  Result<uint64_t> read_file(std::string_view id, std::string_view path, std::ostream& out,
                             uint64_t max_bytes) override;
  Result<std::vector<FileInfo>> list_files(std::string_view id,
                                           std::string_view directory) override;
  Result<void> destroy(std::string_view id) override;
  Result<bool> is_alive(std::string_view id) override;
  Result<std::vector<SandboxInfo>> find(const Labels& labels) override;

  std::string_view cgroup_version() const { return cgroups_->version(); }
  // What the network proxy of a sandbox with an allowlist counted since it started
  // (kFailedPrecondition for a sandbox without network).
  Result<NetworkActivity> network_activity(std::string_view id) const;
  // Memory charged to the sandbox's cgroup now.
  Result<uint64_t> memory_usage(std::string_view id) const { return cgroups_->memory_usage(id); }

 private:
  LocalProvider(SandboxConfig config, LocalProviderOptions options,
                std::unique_ptr<CgroupDriver> cgroups);

  // A sandbox whose init is alive, with a pidfd that pins it.
  struct Running {
    SandboxRecord record;
    UniqueFd pidfd;
  };
  Result<Running> running(std::string_view id) const;
  Result<const SandboxVolume*> volume();
  // One attempt of create(): kAborted when a host process turned out to run with ids of the
  // range it claimed (everything made is taken apart again).
  struct Admission;
  Result<SandboxInfo> start(const SandboxSpec& spec, const Image& image,
                            const SandboxVolume& volume, Admission& admission);
  std::vector<std::string> environment(const ExecRequest& request,
                                       const NetworkPolicy& network) const;
  std::filesystem::path proxy_socket(std::string_view id) const {
    return state_.sandbox_dir(id) / "proxy.sock";
  }
  // A command started by init in an exec cgroup of its own, with pipes for its output (and,
  // `with_stdin`, a socket as its stdin); the cgroup is removed with this unless handed on.
  struct Launched {
    CgroupDriver& cgroups;
    std::string sandbox;
    std::string exec;
    bool owns_cgroup = false;
    uint64_t memory_limit_bytes = 0;
    UniqueFd connection;
    UniqueFd stdout_read;
    UniqueFd stderr_read;
    UniqueFd channel;
    // The sandbox's network proxy and its counts as the command started (none: no proxy).
    std::filesystem::path network_control;
    NetworkActivity network_before;
    Launched(CgroupDriver& driver, std::string sandbox_id, std::string exec_name)
        : cgroups(driver), sandbox(std::move(sandbox_id)), exec(std::move(exec_name)) {}
    Launched(Launched&& other) noexcept
        : cgroups(other.cgroups),
          sandbox(std::move(other.sandbox)),
          exec(std::move(other.exec)),
          owns_cgroup(std::exchange(other.owns_cgroup, false)),
          memory_limit_bytes(other.memory_limit_bytes),
          connection(std::move(other.connection)),
          stdout_read(std::move(other.stdout_read)),
          stderr_read(std::move(other.stderr_read)),
          channel(std::move(other.channel)),
          network_control(std::move(other.network_control)),
          network_before(std::move(other.network_before)) {}
    ~Launched();
  };
  Result<Launched> launch(std::string_view id, const ExecRequest& request, bool with_stdin);
  // Admits a new sandbox's limits against the host (memory and CPU, admit_to_host) and the
  // volume (disk, SandboxVolume::admit), counting every recorded sandbox and those being
  // created. The returned guard keeps the limits counted while the sandbox is created; once
  // it has a record those count instead (never both).
  Result<std::unique_ptr<Admission>> admit(const SandboxVolume& volume,
                                           const ResourceLimits& resources);

  SandboxConfig config_;
  LocalProviderOptions options_;
  StateStore state_;
  ImageStore images_;
  std::unique_ptr<CgroupDriver> cgroups_;
  std::mutex volume_mutex_;
  std::optional<SandboxVolume> volume_;
  // Sandboxes being created in this process, counted by admission as if they were recorded
  // until their record exists (guarded by volume_mutex_): their limits, and their id once known.
  struct InFlight {
    ResourceLimits limits;
    std::string id;
  };
  std::map<uint64_t, InFlight> admitting_;
  uint64_t next_admission_ = 0;
  std::atomic<uint64_t> exec_counter_{0};
};

// Checks label keys and values: short, printable, no '=' or ',' in keys.
Result<void> validate_labels(const Labels& labels);

// What the host has for sandboxes' limits: its memory less a reserve for itself (a tenth, at
// least 1 GiB) and its online cores, each times its overcommit factor.
struct HostCapacity {
  uint64_t memory_bytes = 0;
  uint64_t reserve_bytes = 0;
  double cpus = 0;
};
Result<HostCapacity> host_capacity();
// Whether a sandbox with `wanted` limits fits beside those `committed` to others already;
// kResourceExhausted naming the figures and what to change when not.
Result<void> admit_to_host(const HostCapacity& host, const CapacityConfig::Overcommit& overcommit,
                           const ResourceLimits& committed, const ResourceLimits& wanted);

}  // namespace quarry::sandbox::local

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
#include "sandbox/local/snapshot.h"
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
  Result<void> stop_process(std::string_view id, std::string_view process) override;
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

  // Snapshots (snapshot.h). Freezes sandbox `id`'s writable layer as snapshot `name`, which new
  // sandboxes can start from (SandboxSpec::snapshot). Refused (kFailedPrecondition) while
  // commands run in the sandbox, as a file they are writing could be frozen half written,
  // unless `stop_commands`, which stops them first.
  Result<SnapshotInfo> snapshot(std::string_view id, std::string_view name, bool stop_commands);
  Result<std::vector<SnapshotInfo>> snapshots();
  // Deletes a snapshot; refused (kFailedPrecondition) while a sandbox or a snapshot uses it.
  Result<void> remove_snapshot(std::string_view name);
  // Deletes the snapshots that no sandbox has used for longer than sandbox.snapshots keeps them
  // (also done by create, at most once a minute) and returns their names. Without `wait`, does
  // nothing while another process holds the snapshots.
  Result<std::vector<std::string>> collect_snapshots(bool wait = true);

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
  // What a new sandbox starts from above the image: a snapshot's frozen layers (top first),
  // found under the snapshots' shared lock, which is held until the sandbox's record names them.
  struct Layers {
    UniqueFd lock;
    std::vector<SnapshotRecord> chain;
    std::string base;  // the snapshot asked for
    std::vector<std::string> packages;
    std::string package_snapshot;  // the name of the packages' snapshot on `base`
    bool has_packages = false;     // `chain` is that snapshot's
  };
  Result<Layers> starting_layers(const SandboxSpec& spec, const Image& image);
  // One attempt of create(): kAborted when a host process turned out to run with ids of the
  // range it claimed (everything made is taken apart again).
  struct Admission;
  Result<SandboxInfo> start(const SandboxSpec& spec, const Image& image, const Layers& layers,
                            const SandboxVolume& volume, Admission& admission);
  // Installs `layers.packages` into a new sandbox (resolved once per set and image into a lock
  // in <cache>/package-locks, wheels fetched on the host) and freezes it as their snapshot.
  // kCancelled, what it ran stopped, once `cancel_fd` is readable.
  Result<void> install_packages(std::string_view id, const ImageDefinition& definition,
                                const Image& image, const Layers& layers, int cancel_fd);
  // Freezes the sandbox of `sandbox` as snapshot `name` (kAlreadyExists if the name is taken).
  Result<SnapshotRecord> freeze(const SandboxRecord& sandbox, std::string_view name,
                                std::vector<std::string> packages, std::string lock);
  SnapshotUsers users_of(std::string_view snapshot, const std::vector<SandboxRecord>& sandboxes,
                         const std::vector<SnapshotRecord>& snapshots) const;
  // remove_abandoned() and collect_snapshots(false), unless this was done less than a minute ago
  // (by any process).
  void collect_now_and_then();
  // Destroys what creates cut short left (a sandbox directory that never got its record, a
  // minute on): no process can finish such a create any more, and a server that was killed in
  // one would leave it for good.
  void remove_abandoned();
  // exec, as the sandbox user or (for what the host installs) as the sandbox's root.
  Result<ExecResult> execute(std::string_view id, const ExecRequest& request, bool as_root);
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
  Result<Launched> launch(std::string_view id, const ExecRequest& request, bool with_stdin,
                          bool as_root = false);
  // Admits a new sandbox's limits against the host (memory and CPU, admit_to_host) and the
  // volume (disk, SandboxVolume::admit), counting every recorded sandbox and those being
  // created, in any process (StateStore::admitting). The returned guard keeps the limits
  // counted while the sandbox is created; once it has a record that counts instead.
  Result<std::unique_ptr<Admission>> admit(const SandboxVolume& volume,
                                           const ResourceLimits& resources);

  SandboxConfig config_;
  LocalProviderOptions options_;
  StateStore state_;
  HostIds host_ids_;
  SnapshotStore snapshots_;
  ImageStore images_;
  std::unique_ptr<CgroupDriver> cgroups_;
  std::mutex volume_mutex_;
  std::optional<SandboxVolume> volume_;
  // Exec cgroups are named exec-<prefix>-<n>: the pid, and random bits for a process of the same
  // pid in another pid namespace sharing the state directory. The names outlive the process
  // (a kernel's is recorded in the history), so no two processes may make the same.
  const std::string exec_prefix_;
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

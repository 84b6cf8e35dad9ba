#include "sandbox/local/local_provider.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysinfo.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <future>
#include <set>
#include <sstream>
#include <thread>

#include "common/command.h"
#include "common/file_util.h"
#include "common/progress.h"
#include "common/random_id.h"
#include "common/unix_socket.h"
#include "config/allowlist.h"
#include "sandbox/local/files.h"
#include "sandbox/local/idmap.h"
#include "sandbox/local/local_process.h"
#include "sandbox/local/network_proxy.h"
#include "sandbox/local/packages.h"
#include "sandbox/local/protocol.h"
#include "sandbox/local/seccomp_program.h"
#include "sandbox/local/spawn.h"
#include "sandbox/metering.h"

namespace quarry::sandbox::local {
namespace {

using Clock = std::chrono::steady_clock;

// The limits a sandbox's cgroups, and each exec's, carry.
CgroupLimits cgroup_limits(const ResourceLimits& resources) {
  return {resources.memory_bytes, resources.cpus, resources.pids, {}};
}

// The sandbox's own cgroup also throttles its reads and writes on each device of the volume.
CgroupLimits sandbox_cgroup_limits(const ResourceLimits& resources, const SandboxVolume& volume,
                                   const LocalProviderConfig::DiskIo& io) {
  CgroupLimits limits = cgroup_limits(resources);
  for (dev_t device : volume.devices()) {
    limits.io.push_back({device, io.read_bytes, io.write_bytes, io.iops, io.iops});
  }
  return limits;
}

constexpr auto kSetupTimeout = std::chrono::seconds(10);
// A sandbox directory still without a record this long after it last changed was left by a
// create that was cut short: its creator saves the record within a setup timeout.
constexpr auto kAbandonedAfter = std::chrono::minutes(1);

// An admission ticket counts while its create runs, which saves the record within a few setup
// timeouts; one older than this was left by a process whose pid another has since.
constexpr auto kTicketsLast = std::chrono::minutes(10);

static_assert(kMaxFrozenLayers + 1 <= protocol::kMaxFds,
              "the setup message carries a tree for each frozen layer and the image");

double milliseconds_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

// Waits for one message of `type` from init, giving up after `timeout`.
Result<void> expect_within(int socket, std::string_view type, std::chrono::milliseconds timeout) {
  ASSIGN_OR_RETURN(auto message,
                   with_context(protocol::receive(socket, Clock::now() + timeout),
                                fmt::format("waiting {} ms for '{}'", timeout.count(), type)));
  ASSIGN_OR_RETURN(auto reply, protocol::parse_reply(message.body));
  if (reply.type == type) return {};
  if (reply.type == "error") return make_error(ErrorCode::kInternal, "{}", reply.message);
  return make_error(ErrorCode::kInternal, "expected '{}' from quarry-init, got '{}'", type,
                    reply.type);
}

// How long the rest of a message from init may take once its first byte is in: it is sent
// with one write, so only a broken (or hostile) init makes this wait.
constexpr auto kRestOfMessage = std::chrono::seconds(5);

Result<UniqueFd> connect_to(const std::filesystem::path& socket_path) {
  auto connected = connect_unix(socket_path);
  if (!connected && connected.error().code == ErrorCode::kUnavailable) {
    return make_error(ErrorCode::kUnavailable, "the sandbox does not answer ({})",
                      connected.error().message);
  }
  return connected;
}

SandboxInfo info_of(const SandboxRecord& record, bool alive) {
  return SandboxInfo{record.id,         record.labels,
                     record.resources,  alive ? SandboxState::kRunning : SandboxState::kStopped,
                     record.created_at, record.network,
                     record.snapshot,   record.packages};
}

// The policy as the proxy takes it: canonical entries, at least one for an allowlist.
Result<NetworkPolicy> checked_network(const NetworkPolicy& network) {
  NetworkPolicy checked{network.mode, {}};
  if (network.mode == NetworkMode::kNone) {
    if (!network.allow.empty()) {
      return make_error(ErrorCode::kInvalidArgument,
                        "network mode 'none' takes no allow list (use mode 'allowlist')");
    }
    return checked;
  }
  if (network.allow.empty()) {
    return make_error(ErrorCode::kInvalidArgument,
                      "network mode 'allowlist' needs at least one domain to allow");
  }
  for (const auto& entry : network.allow) {
    ASSIGN_OR_RETURN(auto canonical, parse_allow_entry(entry));
    checked.allow.push_back(std::move(canonical));
  }
  return checked;
}

// quarry-init or quarry-proxy: beside the running executable, or where an installation keeps
// them.
std::filesystem::path helper_binary(const std::filesystem::path& self, std::string_view name) {
  if (self.empty()) return name;
  for (const auto& candidate :
       {self.parent_path() / name, self.parent_path() / "../libexec/quarry" / name}) {
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return self.parent_path() / name;
}

}  // namespace

Result<HostCapacity> host_capacity() {
  struct sysinfo info {};
  if (::sysinfo(&info) != 0) return errno_error("sysinfo");
  HostCapacity host;
  host.memory_bytes = static_cast<uint64_t>(info.totalram) * info.mem_unit;
  host.reserve_bytes = std::max<uint64_t>(host.memory_bytes / 10, kGiB);
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  host.cpus = ::sched_getaffinity(0, sizeof(cpus), &cpus) == 0
                  ? CPU_COUNT(&cpus)
                  : static_cast<double>(::sysconf(_SC_NPROCESSORS_ONLN));
  return host;
}

Result<void> admit_to_host(const HostCapacity& host, const CapacityConfig::Overcommit& overcommit,
                           const ResourceLimits& committed, const ResourceLimits& wanted) {
  const uint64_t usable =
      host.memory_bytes > host.reserve_bytes ? host.memory_bytes - host.reserve_bytes : 0;
  const auto memory = static_cast<uint64_t>(static_cast<double>(usable) * overcommit.memory);
  if (committed.memory_bytes + wanted.memory_bytes > memory) {
    return make_error(
        ErrorCode::kResourceExhausted,
        "a sandbox with {} of memory does not fit: the sandboxes here may use {} together, and "
        "this host has {} for them ({} less {} kept for the host, times "
        "capacity.overcommit.memory {}); lower sandbox.resources.memory, remove sandboxes that "
        "are not needed (quarry sandbox ls) or raise capacity.overcommit.memory",
        format_size(wanted.memory_bytes), format_size(committed.memory_bytes), format_size(memory),
        format_size(host.memory_bytes), format_size(host.reserve_bytes), overcommit.memory);
  }
  const double cpus = host.cpus * overcommit.cpu;
  // A little slack for the sums of fractions (0.1 + 0.2 ...).
  if (committed.cpus + wanted.cpus > cpus + 1e-9) {
    return make_error(
        ErrorCode::kResourceExhausted,
        "a sandbox with a CPU limit of {:g} does not fit: the sandboxes here may use {:g} CPUs "
        "together, and this host has {:g} for them ({:g} cores times capacity.overcommit.cpu "
        "{:g}); lower "
        "sandbox.resources.cpus, remove sandboxes that are not needed (quarry sandbox ls) or "
        "raise capacity.overcommit.cpu",
        wanted.cpus, committed.cpus, cpus, host.cpus, overcommit.cpu);
  }
  return {};
}

Result<void> validate_labels(const Labels& labels) {
  for (const auto& [key, value] : labels) {
    if (key.empty() || key.size() > 63) {
      return make_error(ErrorCode::kInvalidArgument,
                        "label key '{}' must be 1 to 63 characters long", key);
    }
    for (char c : key) {
      if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.' ||
            c == '/')) {
        return make_error(ErrorCode::kInvalidArgument,
                          "label key '{}' may only have letters, digits, '-', '_', '.' and '/'",
                          key);
      }
    }
    if (value.size() > 255) {
      return make_error(ErrorCode::kInvalidArgument, "the value of label '{}' is over 255 bytes",
                        key);
    }
    for (char c : value) {
      if (static_cast<unsigned char>(c) < 0x20) {
        return make_error(ErrorCode::kInvalidArgument,
                          "the value of label '{}' has a control character", key);
      }
    }
  }
  return {};
}

LocalProvider::LocalProvider(SandboxConfig config, LocalProviderOptions options,
                             std::unique_ptr<CgroupDriver> cgroups)
    : config_(std::move(config)),
      options_(std::move(options)),
      state_(options_.state_dir),
      snapshots_(options_.state_dir / "sandboxes"),
      images_(options_.cache_dir),
      cgroups_(std::move(cgroups)),
      exec_prefix_(fmt::format("{}.{:06x}", ::getpid(), random_bits() & 0xffffff)) {}

Result<std::unique_ptr<LocalProvider>> LocalProvider::open(const SandboxConfig& config,
                                                           LocalProviderOptions options) {
  if (::geteuid() != 0) {
    return make_error(ErrorCode::kPermissionDenied,
                      "the local sandbox provider needs root (it sets up namespaces, cgroups and "
                      "mounts); run quarry as root");
  }
  const auto self = this_executable();
  if (options.init_binary.empty()) options.init_binary = helper_binary(self, "quarry-init");
  if (options.proxy_binary.empty()) options.proxy_binary = helper_binary(self, "quarry-proxy");
  if (::access(options.init_binary.c_str(), X_OK) != 0) {
    return make_error(ErrorCode::kFailedPrecondition,
                      "quarry-init was not found at '{}'; build it (scripts/setup) or install it "
                      "beside quarry",
                      options.init_binary.string());
  }
  ASSIGN_OR_RETURN(auto mounts, read_cgroup_mounts());
  ASSIGN_OR_RETURN(auto cgroups, make_cgroup_driver(mounts));
  const auto optional = cgroups->optional_controllers();
  spdlog::debug("cgroup {} with memory, cpu, pids{}{}", cgroups->version(),
                optional.empty() ? "" : ", ", fmt::join(optional, ", "));
  if (std::none_of(optional.begin(), optional.end(),
                   [](const auto& name) { return name == "io" || name == "blkio"; })) {
    spdlog::info(
        "no io (cgroup v2) or blkio (v1) controller: sandboxes' disk reads and writes "
        "are not throttled (sandbox.local.disk_io)");
  }
  if (config.local.favordynmods) {
    auto tuned = favor_dynamic_modifications(mounts);
    if (!tuned) {
      spdlog::warn(
          "{}; starting a sandbox or a command may wait for an RCU grace period "
          "(several ms) each time (set sandbox.local.favordynmods: false to stop trying)",
          tuned.error().message);
    } else if (!*tuned) {
      spdlog::info(
          "no cgroup2 mount to set favordynmods on; moving processes between cgroups "
          "may wait for an RCU grace period (several ms)");
    }
  }
  RETURN_IF_ERROR(make_directories(options.state_dir, 0755));
  return std::unique_ptr<LocalProvider>(
      new LocalProvider(config, std::move(options), std::move(cgroups)));
}

Result<const SandboxVolume*> LocalProvider::volume() {
  std::lock_guard lock(volume_mutex_);
  if (!volume_) {
    ASSIGN_OR_RETURN(auto opened,
                     SandboxVolume::open(options_.state_dir, config_.local.volume_bytes));
    volume_.emplace(std::move(opened));
  }
  return &*volume_;
}

namespace {

// The memory, CPU and disk of `limits` added to `total` (what admission counts).
void add(ResourceLimits& total, const ResourceLimits& limits) {
  total.memory_bytes += limits.memory_bytes;
  total.cpus += limits.cpus;
  total.disk_bytes += limits.disk_bytes;
}

}  // namespace

struct LocalProvider::Admission {
  const StateStore& state;
  std::string ticket;
  // The sandbox's id, once drawn: its record, when there is one, counts it from then on.
  void name(const std::string& id) { ticket = state.name_ticket(ticket, id); }
  ~Admission() { state.remove_ticket(ticket); }
};

Result<std::unique_ptr<LocalProvider::Admission>> LocalProvider::admit(
    const SandboxVolume& volume, const ResourceLimits& resources) {
  ASSIGN_OR_RETURN(auto host, host_capacity());
  // Under the lock no other admission, in this process or another, counts or adds a ticket:
  // of two creates at once, the second counts the first.
  ASSIGN_OR_RETURN(UniqueFd lock, state_.lock_admissions());
  ASSIGN_OR_RETURN(auto admitting, state_.admitting(kTicketsLast));
  ASSIGN_OR_RETURN(auto records, state_.list());
  ResourceLimits committed{.cpus = 0, .memory_bytes = 0, .disk_bytes = 0, .pids = 0};
  std::set<std::string> recorded;
  for (const auto& record : records) {
    add(committed, record.resources);
    recorded.insert(record.id);
  }
  for (const auto& ticket : admitting) {
    if (!recorded.contains(ticket.sandbox_id)) add(committed, ticket.limits);
  }
  RETURN_IF_ERROR(admit_to_host(host, options_.overcommit, committed, resources));
  RETURN_IF_ERROR(
      volume.admit(committed.disk_bytes, resources.disk_bytes, options_.overcommit.disk));
  ASSIGN_OR_RETURN(auto ticket, state_.add_ticket(resources));
  return std::unique_ptr<Admission>(new Admission{state_, std::move(ticket)});
}

Result<Runtime> LocalProvider::runtime() {
  ASSIGN_OR_RETURN(auto definition, default_image_definition(config_));
  ASSIGN_OR_RETURN(auto image, images_.find(definition));
  Runtime runtime{
      image.manifest.value("python_version", ""), {}, installed_python_packages(image.manifest)};
  for (const auto& requirement : config_.packages) {
    const std::string name = requirement_name(requirement);
    auto found = runtime.installed.find(name);
    runtime.requested.emplace_back(name, found == runtime.installed.end() ? "" : found->second);
  }
  return runtime;
}

Result<SandboxInfo> LocalProvider::create(const SandboxSpec& spec) {
  RETURN_IF_ERROR(validate_resources(spec.resources));
  RETURN_IF_ERROR(validate_labels(spec.labels));
  RETURN_IF_ERROR(checked_network(spec.network));
  if (spec.network.mode == NetworkMode::kAllowlist &&
      ::access(options_.proxy_binary.c_str(), X_OK) != 0) {
    return make_error(ErrorCode::kFailedPrecondition,
                      "quarry-proxy, which a sandbox with network mode 'allowlist' needs, was not "
                      "found at '{}'; build it (scripts/build) or install it beside quarry",
                      options_.proxy_binary.string());
  }
  ASSIGN_OR_RETURN(auto definition, default_image_definition(config_));
  ASSIGN_OR_RETURN(auto image, images_.find(definition));
  ASSIGN_OR_RETURN(const SandboxVolume* volume, this->volume());
  collect_now_and_then();
  ASSIGN_OR_RETURN(Layers layers, starting_layers(spec, image));
  ASSIGN_OR_RETURN(auto admission, admit(*volume, spec.resources));
  Result<SandboxInfo> started;
  for (int attempt = 0;; ++attempt) {
    started = start(spec, image, layers, *volume, *admission);
    if (started || started.error().code != ErrorCode::kAborted || attempt >= 8) break;
    spdlog::debug("{}; starting again with other ids", started.error().message);
  }
  if (started && !layers.chain.empty()) {
    snapshots_.touch(layers.chain.front(), std::chrono::system_clock::now());
  }
  // The sandbox's record names its snapshot now (or there is no sandbox): it is safe to delete
  // unused ones again.
  layers.lock.reset();
  if (!started) return started;
  if (!layers.packages.empty() && !layers.has_packages) {
    if (auto installed = install_packages(started->id, definition, image, layers, spec.cancel_fd);
        !installed) {
      (void)destroy(started->id);
      return std::unexpected(installed.error().with_context(
          fmt::format("installing {} into a new sandbox", fmt::join(layers.packages, " "))));
    }
  }
  return started;
}

Result<LocalProvider::Layers> LocalProvider::starting_layers(const SandboxSpec& spec,
                                                             const Image& image) {
  Layers layers;
  ASSIGN_OR_RETURN(layers.packages, canonical_requirements(spec.packages));
  layers.base = spec.snapshot;
  if (layers.base.empty() && layers.packages.empty()) return layers;
  ASSIGN_OR_RETURN(layers.lock, snapshots_.lock(/*exclusive=*/false));
  if (!layers.base.empty()) {
    ASSIGN_OR_RETURN(layers.chain, snapshots_.chain(layers.base));
    const SnapshotRecord& base = layers.chain.front();
    if (base.image != image.hash) {
      return make_error(ErrorCode::kFailedPrecondition,
                        "snapshot '{}' was made on image {}, but this configuration's image is {} "
                        "(its packages or their lock changed since): start from a snapshot of "
                        "the current image (quarry snapshot ls shows each one's), or use the "
                        "configuration the snapshot was made with",
                        base.name, base.image, image.hash);
    }
  }
  if (!layers.packages.empty()) {
    layers.package_snapshot = package_snapshot_name(
        image.hash, layers.chain.empty() ? "" : layers.chain.front().id, layers.packages);
    if (auto found = snapshots_.chain(layers.package_snapshot)) {
      layers.chain = std::move(*found);
      layers.has_packages = true;
    } else if (found.error().code != ErrorCode::kNotFound) {
      spdlog::warn("{}; installing the packages again", found.error().message);
    }
  }
  return layers;
}

Result<SandboxInfo> LocalProvider::start(const SandboxSpec& spec, const Image& image,
                                         const Layers& layers, const SandboxVolume& volume,
                                         Admission& admission) {
  // The sandbox's subvolume holds everything it has on disk, so it is made first; a random id
  // that is already taken is simply drawn again.
  // It gets a host id range of its own, so no two sandboxes share a host uid.
  std::string id;
  uint32_t id_base = 0;
  std::optional<SandboxDirectory> directory;
  for (int attempt = 0; !directory; ++attempt) {
    id = random_id();
    ASSIGN_OR_RETURN(id_base, state_.claim_id_range(id));
    auto made = volume.create(id, spec.resources.disk_bytes, id_base);
    if (made) {
      directory = std::move(*made);
      admission.name(id);
      continue;
    }
    state_.release_id_range(id_base);
    if (made.error().code != ErrorCode::kAlreadyExists || attempt >= 8) {
      return std::unexpected(made.error());
    }
  }
  // Whether a host process runs with ids of the range (HostIds: /proc, read at most once a
  // second) and the image as the range sees it (an idmapped mount) are found on another thread
  // meanwhile: they take about as long as the cgroups and init that are made here.
  // A snapshot's frozen layers have the ids of the sandbox each was frozen from; their trees are
  // made on a thread of their own, beside the image's.
  struct IdRange {
    bool in_use = false;
    Result<UniqueFd> image_tree;
  };
  auto id_range = std::async(std::launch::async, [this, &image, id_base] {
    return IdRange{host_ids_.in_use(id_base, kSandboxIdCount),
                   idmapped_tree(image.rootfs, kSandboxIdBase, id_base, kSandboxIdCount)};
  });
  std::future<std::vector<Result<UniqueFd>>> frozen_trees;
  if (!layers.chain.empty()) {
    frozen_trees = std::async(std::launch::async, [this, &layers, id_base] {
      std::vector<Result<UniqueFd>> trees;
      for (const auto& layer : layers.chain) {
        trees.push_back(
            idmapped_tree(snapshots_.upper(layer.name), layer.id_base, id_base, kSandboxIdCount));
      }
      return trees;
    });
  }

  SandboxRecord record;
  record.id = id;
  record.labels = spec.labels;
  record.resources = spec.resources;
  record.image = image.hash;
  record.snapshot = layers.chain.empty() ? "" : layers.chain.front().name;
  record.packages = layers.packages;
  record.created_at = std::chrono::system_clock::now();
  record.qgroup = directory->qgroup;
  record.id_base = id_base;
  ASSIGN_OR_RETURN(record.network, checked_network(spec.network));

  // Undo everything on failure; destroy() knows how to take apart a partial sandbox.
  bool created = false;
  struct Rollback {
    LocalProvider* provider;
    const std::string& id;
    const bool& created;
    ~Rollback() {
      if (!created) (void)provider->destroy(id);
    }
  } rollback{this, id, created};
  // The cgroups are made on a thread of their own while init is spawned here (the namespaces
  // cost the clone about a millisecond): init waits for its setup, which it is sent only once
  // it is in them. Declared after the rollback, the thread is joined before any undoing.
  auto cgroups_made = std::async(std::launch::async, [this, &id, &spec, &volume] {
    return cgroups_->create_sandbox(
        id, sandbox_cgroup_limits(spec.resources, volume, config_.local.disk_io));
  });

  auto sandbox_dir = state_.sandbox_dir(id);
  auto root_dir = sandbox_dir / "root";
  if (::mkdir(root_dir.c_str(), 0755) != 0) return errno_error("mkdir '{}'", root_dir.string());
  UniqueFd log(
      ::open((sandbox_dir / "init.log").c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600));
  if (!log) return errno_error("open '{}'", (sandbox_dir / "init.log").string());

  ASSIGN_OR_RETURN(InitProcess init, spawn_init(options_.init_binary, log.get()));
  record.init_pid = init.pid;
  // Until the record names init, destroy() cannot find it: if saving fails, init is killed and
  // reaped here, not left waiting for a setup that never comes (and then a zombie).
  auto saved = [&]() -> Result<void> {
    ASSIGN_OR_RETURN(record.init_start_time, process_start_time(init.pid));
    return state_.save(record);
  }();
  if (!saved) {
    (void)kill_and_reap(init.pidfd.get());
    return std::unexpected(saved.error());
  }
  // From here the record names init: the rollback's destroy() kills and reaps it.
  RETURN_IF_ERROR(cgroups_made.get());
  RETURN_IF_ERROR(cgroups_->enter_sandbox(id, init.pid));

  protocol::Setup setup;
  setup.root_dir = root_dir.string();
  setup.lower_dir = image.rootfs.string();
  for (const auto& layer : layers.chain)
    setup.frozen_dirs.push_back(snapshots_.upper(layer.name).string());
  setup.upper_dir = directory->upper.string();
  setup.work_dir = directory->work.string();
  setup.control_socket = state_.control_socket(id).string();
  setup.hostname = "sandbox-" + id;
  setup.user_id = kSandboxUser;
  setup.group_id = kSandboxUser;
  setup.host_id_base = id_base;
  setup.home = fmt::format("/home/{}", kSandboxUserName);
  setup.directories = {config_.data_dir, config_.output_dir};
  const auto seccomp = seccomp_program();
  setup.seccomp_filter.assign(seccomp.begin(), seccomp.end());
  setup.max_processes = spec.resources.pids;
  setup.cgroup_mounts = cgroups_->sandbox_mounts();
  const std::string starting =
      fmt::format("starting sandbox {} (see {})", id, (sandbox_dir / "init.log").string());
  // The image and the frozen layers as this sandbox's ids see them: init attaches the trees as
  // its overlay's lower layers.
  auto [ids_in_use, image_tree] = id_range.get();
  auto trees = frozen_trees.valid() ? frozen_trees.get() : std::vector<Result<UniqueFd>>{};
  if (ids_in_use) {
    return make_error(ErrorCode::kAborted, "a host process runs with ids {}..{}", id_base,
                      id_base + kSandboxIdCount - 1);
  }
  trees.push_back(std::move(image_tree));
  std::vector<UniqueFd> layer_trees;
  std::vector<int> tree_fds;
  for (auto& tree : trees) {
    ASSIGN_OR_RETURN(layer_trees.emplace_back(), std::move(tree));
    tree_fds.push_back(layer_trees.back().get());
  }
  RETURN_IF_ERROR(protocol::send(init.channel.get(), protocol::to_json(setup), tree_fds));
  layer_trees.clear();
  RETURN_IF_ERROR(
      with_context(expect_within(init.channel.get(), "userns", kSetupTimeout), starting));
  // Inside ids 0..65535 are the sandbox's own host range; nothing maps to a real user.
  const std::string map = fmt::format("0 {} {}\n", id_base, kSandboxIdCount);
  RETURN_IF_ERROR(write_control_file(fmt::format("/proc/{}/uid_map", init.pid), map));
  RETURN_IF_ERROR(write_control_file(fmt::format("/proc/{}/gid_map", init.pid), map));
  RETURN_IF_ERROR(protocol::send(init.channel.get(), {{"type", "maps_written"}}));
  // While init drops its privileges and loads its filter: nothing it does from here to "ready"
  // depends on its leaf, and no command starts before.
  RETURN_IF_ERROR(cgroups_->enter_init(id, init.pid));
  RETURN_IF_ERROR(
      with_context(expect_within(init.channel.get(), "ready", kSetupTimeout), starting));
  if (record.network.mode == NetworkMode::kAllowlist) {
    // The sandbox's only way out: the proxy listens on its loopback before any command runs.
    ASSIGN_OR_RETURN(auto procs,
                     cgroups_->create_exec(id, kProxyCgroup, cgroup_limits(spec.resources)));
    RETURN_IF_ERROR(with_context(
        start_network_proxy({options_.proxy_binary, init.pid, std::move(procs), proxy_socket(id),
                             sandbox_dir / "proxy.log", record.network.allow}),
        starting));
  }
  created = true;
  return info_of(record, true);
}

Result<LocalProvider::Running> LocalProvider::running(std::string_view id) const {
  ASSIGN_OR_RETURN(auto record, state_.load(id));
  auto pidfd = open_process(record.init_pid, record.init_start_time);
  if (!pidfd) {
    return make_error(ErrorCode::kUnavailable,
                      "sandbox {} is not running (its init has exited); destroy it and create "
                      "another",
                      id);
  }
  return Running{std::move(record), std::move(*pidfd)};
}

Result<void> LocalProvider::prepare(std::string_view id, const PrepareSpec& spec) {
  ASSIGN_OR_RETURN(auto sandbox, running(id));
  ASSIGN_OR_RETURN(auto files, SandboxFiles::open(sandbox.record.init_pid, sandbox.pidfd.get()));
  const uint32_t owner = sandbox.record.id_base + kSandboxUser;
  for (const auto& directory : spec.directories) {
    ASSIGN_OR_RETURN(auto path, normalize_sandbox_path(directory, "/"));
    RETURN_IF_ERROR(files.make_directories(path, owner, owner));
  }
  return {};
}

std::vector<std::string> LocalProvider::environment(const ExecRequest& request,
                                                    const NetworkPolicy& network) const {
  const std::string home = fmt::format("/home/{}", kSandboxUserName);
  std::map<std::string, std::string> env = {
      {"PATH", fmt::format("{}/bin:/usr/local/bin:/usr/bin:/bin", kVenvDir)},
      {"HOME", home},
      {"USER", std::string(kSandboxUserName)},
      {"LOGNAME", std::string(kSandboxUserName)},
      {"SHELL", "/bin/bash"},
      {"LANG", "C.UTF-8"},
      {"TMPDIR", "/tmp"},
      {"VIRTUAL_ENV", std::string(kVenvDir)},
      {"PYTHONUNBUFFERED", "1"},
      {"MPLBACKEND", "Agg"},
      {"MPLCONFIGDIR", std::string(kMatplotlibDir)},
      {"QUARRY_DATA_DIR", config_.data_dir},
      {"QUARRY_OUTPUT_DIR", config_.output_dir},
  };
  if (network.mode == NetworkMode::kAllowlist) {
    // Every client quarry's image has (pip, requests, urllib, curl) reads one spelling or the
    // other; names resolve at the proxy, as the sandbox has no DNS.
    for (const char* name : {"HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"})
      env[name] = std::string(kProxyUrl);
    env["NO_PROXY"] = env["no_proxy"] = "localhost,127.0.0.1,::1";
  }
  for (const auto& [key, value] : request.env)
    env[key] = value;
  std::vector<std::string> entries;
  for (const auto& [key, value] : env)
    entries.push_back(key + "=" + value);
  return entries;
}

Result<LocalProvider::Launched> LocalProvider::launch(std::string_view id,
                                                      const ExecRequest& request, bool with_stdin,
                                                      bool as_root) {
  if (request.argv.empty() || request.argv[0].empty()) {
    return make_error(ErrorCode::kInvalidArgument, "no command given");
  }
  for (const auto& [key, value] : request.env) {
    if (key.empty() || key.find_first_of("=\0", 0, 2) != std::string::npos ||
        value.find('\0') != std::string::npos) {
      return make_error(ErrorCode::kInvalidArgument, "bad environment variable name '{}'", key);
    }
  }
  std::string cwd = fmt::format("/home/{}", kSandboxUserName);
  if (!request.working_directory.empty()) {
    ASSIGN_OR_RETURN(cwd, normalize_sandbox_path(request.working_directory, cwd));
  }
  ASSIGN_OR_RETURN(auto sandbox, running(id));

  // Each exec gets its own cgroup under the sandbox: its peak memory, OOM kills and CPU time
  // are its own, and killing it on timeout kills everything it started.
  Launched launched{*cgroups_, std::string(id),
                    fmt::format("exec-{}-{}", exec_prefix_, exec_counter_++)};
  launched.memory_limit_bytes = sandbox.record.resources.memory_bytes;
  ASSIGN_OR_RETURN(auto procs, cgroups_->create_exec(id, launched.exec,
                                                     cgroup_limits(sandbox.record.resources)));
  launched.owns_cgroup = true;

  int stdout_pipe[2], stderr_pipe[2];
  if (::pipe2(stdout_pipe, O_CLOEXEC) != 0) return errno_error("pipe");
  launched.stdout_read.reset(stdout_pipe[0]);
  UniqueFd stdout_write(stdout_pipe[1]);
  if (::pipe2(stderr_pipe, O_CLOEXEC) != 0) return errno_error("pipe");
  launched.stderr_read.reset(stderr_pipe[0]);
  UniqueFd stderr_write(stderr_pipe[1]);
  UniqueFd stdin_theirs;
  if (with_stdin) {
    int channel[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, channel) != 0) {
      return errno_error("socketpair");
    }
    launched.channel.reset(channel[0]);
    stdin_theirs.reset(channel[1]);
  }

  if (sandbox.record.network.mode == NetworkMode::kAllowlist) {
    // What the proxy counted so far, so that what it refuses from now on is this command's.
    auto before = local::network_activity(proxy_socket(id), UINT64_MAX);
    if (before) {
      launched.network_control = proxy_socket(id);
      launched.network_before = std::move(*before);
    } else {
      spdlog::warn("sandbox {}: {}", id, before.error().message);
    }
  }
  ASSIGN_OR_RETURN(launched.connection, connect_to(state_.control_socket(id)));
  std::vector<int> fds = {stdout_write.get(), stderr_write.get()};
  if (with_stdin) fds.push_back(stdin_theirs.get());
  for (const auto& fd : procs)
    fds.push_back(fd.get());
  RETURN_IF_ERROR(protocol::send(
      launched.connection.get(),
      protocol::to_json(protocol::ExecRequest{.argv = request.argv,
                                              .env = environment(request, sandbox.record.network),
                                              .cwd = cwd,
                                              .has_stdin = with_stdin,
                                              .as_root = as_root}),
      fds));
  // Only the command holds the write ends now, so EOF means it and its children are done.
  return launched;
}

LocalProvider::Launched::~Launched() {
  if (owns_cgroup) (void)cgroups.remove_exec(sandbox, exec);
}

Result<std::unique_ptr<Process>> LocalProvider::start(std::string_view id,
                                                      const ExecRequest& request) {
  ASSIGN_OR_RETURN(auto launched, launch(id, request, /*with_stdin=*/true));
  launched.owns_cgroup = false;  // the process's now
  return std::make_unique<LocalProcess>(
      *cgroups_,
      LocalProcess::Parts{launched.sandbox, launched.exec, std::move(launched.connection),
                          std::move(launched.channel), std::move(launched.stdout_read),
                          std::move(launched.stderr_read), launched.memory_limit_bytes,
                          launched.network_control});
}

Result<ExecResult> LocalProvider::exec(std::string_view id, const ExecRequest& request) {
  return execute(id, request, /*as_root=*/false);
}

Result<ExecResult> LocalProvider::execute(std::string_view id, const ExecRequest& request,
                                          bool as_root) {
  const auto call_start = Clock::now();
  ASSIGN_OR_RETURN(auto launched, launch(id, request, /*with_stdin=*/false, as_root));
  const std::string& exec_name = launched.exec;
  UniqueFd& connection = launched.connection;
  UniqueFd& stdout_read = launched.stdout_read;
  UniqueFd& stderr_read = launched.stderr_read;

  ExecResult result;
  result.memory_limit_bytes = launched.memory_limit_bytes;
  Capture captures[] = {{stdout_read.get(), OutputStream::kStdout, &result.stdout_text},
                        {stderr_read.get(), OutputStream::kStderr, &result.stderr_text}};
  std::optional<protocol::Reply> exit_message;
  bool connection_open = true;
  const auto deadline = call_start + request.timeout;
  // After the command exits (or is killed) its leftovers are killed and the pipes drained;
  // this bounds how long that may take if something is wedged.
  std::optional<Clock::time_point> drain_deadline;
  char buffer[64 * 1024];

  while (captures[0].open || captures[1].open || (connection_open && !exit_message)) {
    auto now = Clock::now();
    if (!result.timed_out && !exit_message && now >= deadline) {
      result.timed_out = true;
      (void)cgroups_->kill_exec(id, exec_name);
      drain_deadline = now + std::chrono::seconds(10);
    }
    if (drain_deadline && now >= *drain_deadline) {
      return make_error(ErrorCode::kInternal,
                        "sandbox {}: the command's processes did not go away after SIGKILL", id);
    }
    pollfd polls[4];
    int count = 0;
    for (auto& capture : captures) {
      if (capture.open) polls[count++] = {capture.fd, POLLIN, 0};
    }
    if (connection_open && !exit_message) polls[count++] = {connection.get(), POLLIN, 0};
    if (request.cancel_fd >= 0 && !drain_deadline) polls[count++] = {request.cancel_fd, POLLIN, 0};
    auto until = drain_deadline ? *drain_deadline : deadline;
    auto wait_ms = std::chrono::ceil<std::chrono::milliseconds>(until - now).count();
    int ready =
        ::poll(polls, static_cast<nfds_t>(count), static_cast<int>(std::max<int64_t>(wait_ms, 0)));
    if (ready < 0) {
      if (errno == EINTR) continue;
      return errno_error("poll");
    }
    for (int i = 0; i < count; ++i) {
      if (polls[i].revents == 0) continue;
      if (polls[i].fd == request.cancel_fd) {
        (void)cgroups_->kill_exec(id, exec_name);
        return make_error(ErrorCode::kCancelled, "the command was cancelled");
      }
      if (polls[i].fd == connection.get()) {
        auto message = protocol::receive(connection.get(), Clock::now() + kRestOfMessage);
        if (!message) {
          connection_open = false;
          if (!exit_message) {
            (void)cgroups_->kill_exec(id, exec_name);
            if (message.error().code != ErrorCode::kUnavailable) {
              return make_error(ErrorCode::kInternal, "sandbox {}: {}", id,
                                message.error().message);
            }
            return make_error(ErrorCode::kUnavailable,
                              "sandbox {} stopped while the command was running", id);
          }
          continue;
        }
        auto reply = protocol::parse_reply(message->body);
        if (!reply || (reply->type != "exit" && reply->type != "error")) {
          (void)cgroups_->kill_exec(id, exec_name);
          return make_error(ErrorCode::kInternal, "sandbox {}: {}", id,
                            reply
                                ? fmt::format("quarry-init answered '{}' to a command", reply->type)
                                : reply.error().message);
        }
        if (reply->type == "error") {
          return make_error(ErrorCode::kResourceExhausted, "sandbox {}: {}", id, reply->message);
        }
        exit_message = std::move(*reply);
        // The command is gone; whatever it left running in the background goes with it.
        (void)cgroups_->kill_exec(id, exec_name);
        drain_deadline = Clock::now() + std::chrono::seconds(10);
        continue;
      }
      for (auto& capture : captures) {
        if (polls[i].fd == capture.fd) {
          capture.read(buffer, sizeof buffer, request.output_limit, request.on_output,
                       result.truncated);
        }
      }
    }
  }
  if (!exit_message) {
    return make_error(ErrorCode::kUnavailable, "sandbox {} stopped while the command was running",
                      id);
  }

  set_exit_status(result, exit_message->status);
  result.run_ms = static_cast<double>(exit_message->run_ns) / 1e6;
  auto counters = cgroups_->exec_counters(id, exec_name);
  if (counters) {
    result.peak_memory_bytes = counters->peak_memory_bytes;
    result.cpu_ms = static_cast<double>(counters->cpu_usage_ns) / 1e6;
    result.oom = counters->oom_kills > 0;
  }
  if (!launched.network_control.empty()) {
    add_network_denials(launched.network_control, launched.network_before, result);
  }
  describe(result, request.timeout);
  result.overhead_ms = std::max(0.0, milliseconds_since(call_start) - result.run_ms);
  return result;
}

Result<NetworkActivity> LocalProvider::network_activity(std::string_view id) const {
  ASSIGN_OR_RETURN(auto record, state_.load(id));
  if (record.network.mode != NetworkMode::kAllowlist) {
    return make_error(ErrorCode::kFailedPrecondition, "sandbox {} has no network", id);
  }
  return local::network_activity(proxy_socket(id), UINT64_MAX);
}

Result<void> LocalProvider::stop_process(std::string_view id, std::string_view process) {
  // Both named by what the history recorded: only a sandbox of quarry's, and only an exec cgroup
  // of it, is stopped.
  if (!valid_sandbox_id(id)) {
    return make_error(ErrorCode::kNotFound, "no sandbox '{}' (sandbox ids are 12 hex digits)", id);
  }
  const auto execs = cgroups_->execs(id);  // none when the sandbox is gone
  if (std::find(execs.begin(), execs.end(), process) == execs.end()) return {};  // gone
  return cgroups_->remove_exec(id, process);
}

Result<int> LocalProvider::stop_commands(std::string_view id) {
  ASSIGN_OR_RETURN(auto sandbox, running(id));
  int stopped = 0;
  for (const auto& exec : cgroups_->execs(id)) {
    RETURN_IF_ERROR(cgroups_->remove_exec(id, exec));
    ++stopped;
  }
  return stopped;
}

Result<void> LocalProvider::write_file(std::string_view id, std::string_view path,
                                       std::istream& content, int cancel_fd) {
  ASSIGN_OR_RETURN(auto normal,
                   normalize_sandbox_path(path, fmt::format("/home/{}", kSandboxUserName)));
  ASSIGN_OR_RETURN(auto sandbox, running(id));
  ASSIGN_OR_RETURN(auto files, SandboxFiles::open(sandbox.record.init_pid, sandbox.pidfd.get()));
  const uint32_t owner = sandbox.record.id_base + kSandboxUser;
  return files.write(normal, content, owner, owner, cancel_fd);
}

Result<uint64_t> LocalProvider::read_file(std::string_view id, std::string_view path,
                                          std::ostream& out, uint64_t max_bytes, int cancel_fd) {
  ASSIGN_OR_RETURN(auto normal,
                   normalize_sandbox_path(path, fmt::format("/home/{}", kSandboxUserName)));
  ASSIGN_OR_RETURN(auto sandbox, running(id));
  ASSIGN_OR_RETURN(auto files, SandboxFiles::open(sandbox.record.init_pid, sandbox.pidfd.get()));
  return files.read(normal, out, max_bytes, cancel_fd);
}

Result<std::vector<FileInfo>> LocalProvider::list_files(std::string_view id,
                                                        std::string_view directory) {
  ASSIGN_OR_RETURN(auto normal,
                   normalize_sandbox_path(directory, fmt::format("/home/{}", kSandboxUserName)));
  ASSIGN_OR_RETURN(auto sandbox, running(id));
  ASSIGN_OR_RETURN(auto files, SandboxFiles::open(sandbox.record.init_pid, sandbox.pidfd.get()));
  return files.list(normal);
}

Result<bool> LocalProvider::is_directory(std::string_view id, std::string_view path) {
  ASSIGN_OR_RETURN(auto normal,
                   normalize_sandbox_path(path, fmt::format("/home/{}", kSandboxUserName)));
  ASSIGN_OR_RETURN(auto sandbox, running(id));
  ASSIGN_OR_RETURN(auto files, SandboxFiles::open(sandbox.record.init_pid, sandbox.pidfd.get()));
  return files.is_directory(normal);
}

Result<void> LocalProvider::destroy(std::string_view id) {
  if (!valid_sandbox_id(id) || !std::filesystem::exists(state_.sandbox_dir(id))) {
    return make_error(ErrorCode::kNotFound, "no sandbox '{}' (see quarry sandbox ls)", id);
  }
  // A sandbox that failed half way through create has a partial record (or none): take apart
  // whatever exists.
  auto record = state_.load(id);
  if (record && record->init_pid > 0) {
    if (auto pidfd = open_process(record->init_pid, record->init_start_time)) {
      // Killing PID 1 of a pid namespace kills every process in it.
      RETURN_IF_ERROR(with_context(kill_and_reap(pidfd->get()),
                                   fmt::format("killing the init of sandbox {}", id)));
    }
  }
  RETURN_IF_ERROR(cgroups_->remove_sandbox(id));
  // The subvolume takes the record, socket, log and writable layer with it.
  ASSIGN_OR_RETURN(const SandboxVolume* volume, this->volume());
  RETURN_IF_ERROR(volume->remove(id, record ? record->qgroup : 0));
  if (record) state_.release_id_range(record->id_base);
  // A snapshot is unused from when its last sandbox goes (sandbox.snapshots.keep_unused); under
  // the shared lock, so as not to write into one being deleted.
  if (record && !record->snapshot.empty()) {
    if (auto lock = snapshots_.lock(/*exclusive=*/false)) {
      snapshots_.touch(record->snapshot, std::chrono::system_clock::now());
    }
  }
  return {};
}

Result<bool> LocalProvider::is_alive(std::string_view id) {
  ASSIGN_OR_RETURN(auto record, state_.load(id));
  if (open_process(record.init_pid, record.init_start_time)) return true;
  reap_exited(record.init_pid, record.init_start_time);
  return false;
}

Result<std::vector<SandboxInfo>> LocalProvider::find(const Labels& labels) {
  ASSIGN_OR_RETURN(auto records, state_.list());
  std::vector<SandboxInfo> found;
  for (const auto& record : records) {
    bool matches = std::all_of(labels.begin(), labels.end(), [&](const auto& label) {
      auto it = record.labels.find(label.first);
      return it != record.labels.end() && it->second == label.second;
    });
    if (!matches) continue;
    auto pidfd = open_process(record.init_pid, record.init_start_time);
    if (!pidfd) reap_exited(record.init_pid, record.init_start_time);
    found.push_back(info_of(record, pidfd.has_value()));
  }
  // What a create cut short left (its subvolume and cgroups, no record) has no labels: listed
  // as stopped with every sandbox, so that `quarry sandbox ls` shows it and rm removes it.
  if (labels.empty()) {
    for (const auto& [id, changed] : state_.abandoned(kAbandonedAfter)) {
      SandboxInfo info;
      info.id = id;
      info.state = SandboxState::kStopped;
      info.resources = {0, 0, 0, 0};  // no record says what they were
      info.created_at = changed;
      found.push_back(std::move(info));
    }
  }
  return found;
}

namespace {

// How long a package install may take inside the sandbox: pip unpacking and compiling a large
// set (pyarrow alone is some 40 MB of wheel) on a throttled disk.
constexpr auto kInstallTimeout = std::chrono::minutes(10);

// How often create() looks for what to remove (collect_now_and_then), by any process (the
// state's "collected" file's time).
constexpr auto kCollectEvery = std::chrono::minutes(1);

}  // namespace

SnapshotUsers LocalProvider::users_of(std::string_view snapshot,
                                      const std::vector<SandboxRecord>& sandboxes,
                                      const std::vector<SnapshotRecord>& snapshots) const {
  SnapshotUsers users;
  for (const auto& sandbox : sandboxes) {
    if (sandbox.snapshot == snapshot) users.sandboxes.push_back(sandbox.id);
  }
  for (const auto& other : snapshots) {
    if (other.parent == snapshot) users.snapshots.push_back(other.name);
  }
  return users;
}

Result<SnapshotRecord> LocalProvider::freeze(const SandboxRecord& sandbox, std::string_view name,
                                             std::vector<std::string> packages, std::string lock) {
  ASSIGN_OR_RETURN(const SandboxVolume* volume, this->volume());
  ASSIGN_OR_RETURN(auto staging, snapshots_.stage());
  const auto layer = staging.path() / "layer";
  RETURN_IF_ERROR(volume->freeze(sandbox.id, layer));
  auto made = [&]() -> Result<SnapshotRecord> {
    if (const auto execs = cgroups_->execs(sandbox.id); !execs.empty()) {
      return make_error(ErrorCode::kAborted,
                        "a command started in sandbox {} while it was being frozen, and may have "
                        "been writing; try again",
                        sandbox.id);
    }
    SnapshotRecord record;
    record.name = name;
    record.id = random_id();
    record.image = sandbox.image;
    record.parent = sandbox.snapshot;
    record.sandbox = sandbox.id;
    record.packages = std::move(packages);
    record.lock = std::move(lock);
    record.id_base = sandbox.id_base;
    // What the sandbox's subvolume held when it was frozen (the snapshot committed a
    // transaction): nearly all of it is the layer. Walking the layer would visit every file.
    auto held = volume->referenced_bytes(sandbox.qgroup);
    if (!held) held = tree_bytes(layer / "upper");
    ASSIGN_OR_RETURN(record.size_bytes, std::move(held));
    record.created_at = record.last_used_at = std::chrono::system_clock::now();
    RETURN_IF_ERROR(snapshots_.save_staged(staging, record));
    RETURN_IF_ERROR(snapshots_.publish(staging, name));
    return record;
  }();
  // The staging directory's guard removes the rest; a read-only subvolume it cannot.
  if (!made) (void)volume->remove_frozen(layer);
  return made;
}

Result<SnapshotInfo> LocalProvider::snapshot(std::string_view id, std::string_view name,
                                             bool stop_commands) {
  RETURN_IF_ERROR(check_snapshot_name(name));
  ASSIGN_OR_RETURN(auto sandbox, state_.load(id));
  ASSIGN_OR_RETURN(const SandboxVolume* volume, this->volume());
  (void)volume;
  if (auto existing = snapshots_.load(name)) {
    return make_error(ErrorCode::kAlreadyExists,
                      "snapshot '{}' exists already (frozen from sandbox {}); choose another name, "
                      "or remove it first: quarry snapshot rm {}",
                      name, existing->sandbox, name);
  }
  if (!sandbox.snapshot.empty()) {
    ASSIGN_OR_RETURN(auto below, snapshots_.chain(sandbox.snapshot));
    if (below.size() >= kMaxFrozenLayers) {
      return make_error(ErrorCode::kFailedPrecondition,
                        "sandbox {} has {} frozen layers already (snapshot {} and those it is made "
                        "on), the most a sandbox can have; snapshot a sandbox started from fewer",
                        id, below.size(), sandbox.snapshot);
    }
  }
  if (const auto execs = cgroups_->execs(id); !execs.empty()) {
    if (!stop_commands) {
      return make_error(ErrorCode::kFailedPrecondition,
                        "sandbox {} is running {} command{} (a conversation's Python kernel is "
                        "one): a snapshot now could hold files half written. Take it when they "
                        "have ended, or stop them first: quarry snapshot create --stop-commands "
                        "{} {}",
                        id, execs.size(), execs.size() == 1 ? "" : "s", id, name);
    }
    RETURN_IF_ERROR(this->stop_commands(id));
  }
  ASSIGN_OR_RETURN(auto made, freeze(sandbox, name, {}, ""));
  return SnapshotInfo{std::move(made), {}};
}

Result<std::vector<SnapshotInfo>> LocalProvider::snapshots() {
  ASSIGN_OR_RETURN(const SandboxVolume* volume, this->volume());
  (void)volume;
  ASSIGN_OR_RETURN(auto snapshots, snapshots_.list());
  ASSIGN_OR_RETURN(auto sandboxes, state_.list());
  std::vector<SnapshotInfo> infos;
  for (auto& snapshot : snapshots) {
    auto users = users_of(snapshot.name, sandboxes, snapshots);
    infos.push_back({snapshot, std::move(users)});
  }
  return infos;
}

Result<void> LocalProvider::remove_snapshot(std::string_view name) {
  ASSIGN_OR_RETURN(const SandboxVolume* volume, this->volume());
  ASSIGN_OR_RETURN(auto lock, snapshots_.lock(/*exclusive=*/true));
  // A damaged record is removed all the same (its error says to).
  if (auto snapshot = snapshots_.load(name); !snapshot) {
    if (snapshot.error().code == ErrorCode::kNotFound) return std::unexpected(snapshot.error());
    spdlog::warn("{}", snapshot.error().message);
  }
  ASSIGN_OR_RETURN(auto snapshots, snapshots_.list());
  ASSIGN_OR_RETURN(auto sandboxes, state_.list());
  const auto users = users_of(name, sandboxes, snapshots);
  if (!users.sandboxes.empty()) {
    return make_error(ErrorCode::kFailedPrecondition,
                      "snapshot '{}' is in use by sandbox{} {}; remove {} first: quarry sandbox rm "
                      "{}",
                      name, users.sandboxes.size() == 1 ? "" : "es",
                      fmt::join(users.sandboxes, ", "), users.sandboxes.size() == 1 ? "it" : "them",
                      fmt::join(users.sandboxes, " "));
  }
  if (!users.snapshots.empty()) {
    return make_error(ErrorCode::kFailedPrecondition,
                      "snapshot{} {} {} made on snapshot '{}'; remove {} first: quarry snapshot rm "
                      "{}",
                      users.snapshots.size() == 1 ? "" : "s", fmt::join(users.snapshots, ", "),
                      users.snapshots.size() == 1 ? "is" : "are", name,
                      users.snapshots.size() == 1 ? "it" : "them", fmt::join(users.snapshots, " "));
  }
  RETURN_IF_ERROR(volume->remove_frozen(snapshots_.layer(name)));
  return snapshots_.remove_record(name);
}

Result<std::vector<std::string>> LocalProvider::collect_snapshots(bool wait) {
  ASSIGN_OR_RETURN(const SandboxVolume* volume, this->volume());
  auto lock = snapshots_.lock(/*exclusive=*/true, wait);
  if (!lock && lock.error().code == ErrorCode::kUnavailable) return std::vector<std::string>{};
  if (!lock) return std::unexpected(lock.error());
  ASSIGN_OR_RETURN(auto snapshots, snapshots_.list());
  ASSIGN_OR_RETURN(auto sandboxes, state_.list());
  // In use: by a sandbox started from it, or by the sandbox it was frozen from (just made).
  std::set<std::string> used, live;
  for (const auto& sandbox : sandboxes) {
    if (!sandbox.snapshot.empty()) used.insert(sandbox.snapshot);
    live.insert(sandbox.id);
  }
  for (const auto& snapshot : snapshots) {
    if (live.contains(snapshot.sandbox)) used.insert(snapshot.name);
  }
  auto names =
      collectable_snapshots(snapshots, used, std::chrono::system_clock::now(), config_.snapshots);
  std::vector<std::string> collected;
  for (const auto& name : names) {
    auto removed = volume->remove_frozen(snapshots_.layer(name));
    if (removed) removed = snapshots_.remove_record(name);
    if (!removed) {
      spdlog::warn("deleting unused snapshot {}: {}", name, removed.error().message);
      continue;
    }
    spdlog::info("deleted snapshot {}: unused for longer than sandbox.snapshots keeps it", name);
    collected.push_back(name);
  }
  return collected;
}

void LocalProvider::collect_now_and_then() {
  std::error_code error;
  const auto stamp = state_.state_dir() / "collected";
  const auto last = std::filesystem::last_write_time(stamp, error);
  if (!error && std::filesystem::file_time_type::clock::now() - last < kCollectEvery) return;
  // Stamped first: the creates of other processes meanwhile leave the work to this one.
  (void)write_file_atomic(stamp, "", 0600);
  remove_abandoned();
  if (!std::filesystem::exists(snapshots_.dir(), error)) return;  // none made here yet
  if (auto collected = collect_snapshots(/*wait=*/false); !collected) {
    spdlog::warn("looking for unused snapshots: {}", collected.error().message);
  }
}

void LocalProvider::remove_abandoned() {
  for (const auto& [id, changed] : state_.abandoned(kAbandonedAfter)) {
    if (auto removed = destroy(id); !removed) {
      if (removed.error().code != ErrorCode::kNotFound) {  // not removed by another process
        spdlog::warn("removing what a cut-short create of sandbox {} left: {}", id,
                     removed.error().message);
      }
      continue;
    }
    const auto quiet = std::chrono::system_clock::now() - changed;
    spdlog::info("removed sandbox {}: its create was cut short (no record for {} s)", id,
                 std::chrono::duration_cast<std::chrono::seconds>(quiet).count());
  }
}

Result<void> LocalProvider::install_packages(std::string_view id, const ImageDefinition& definition,
                                             const Image& image, const Layers& layers,
                                             int cancel_fd) {
  Progress progress("packages", 4);
  ASSIGN_OR_RETURN(auto set, package_set(options_.cache_dir, definition, image.hash,
                                         layers.packages, progress, cancel_fd));
  ASSIGN_OR_RETURN(auto sandbox, running(id));
  if (!set.lock.packages.empty()) {
    progress.step(
        fmt::format("installing {} packages into sandbox {}", set.lock.packages.size(), id));
    ASSIGN_OR_RETURN(auto files, SandboxFiles::open(sandbox.record.init_pid, sandbox.pidfd.get()));
    const uint32_t owner = sandbox.record.id_base + kSandboxUser;
    const std::string staging(kPackageStaging);
    for (const auto& [name, wheel] : set.wheels) {
      std::ifstream content(wheel, std::ios::binary);
      if (!content) return make_error(ErrorCode::kInternal, "cannot read '{}'", wheel.string());
      RETURN_IF_ERROR(
          files.write(staging + "/" + wheel.filename().string(), content, owner, owner));
    }
    std::istringstream requirements(set.lock.text(""));
    RETURN_IF_ERROR(files.write(staging + "/requirements.txt", requirements, owner, owner));
    ExecRequest request;
    request.timeout = kInstallTimeout;
    request.cancel_fd = cancel_fd;
    request.env = {{"HOME", "/root"}};
    request.working_directory = "/";
    const std::pair<std::vector<std::string>, const char*> steps[] = {
        {pip_install_command(), "pip install"}, {pip_check_command(), "pip check"}};
    for (const auto& [argv, what] : steps) {
      request.argv = argv;
      ASSIGN_OR_RETURN(auto ran, execute(id, request, /*as_root=*/true));
      if (ran.exit_code != 0 || ran.timed_out) {
        return make_error(ErrorCode::kFailedPrecondition, "{} in the sandbox failed ({}): {}{}",
                          what, ran.timed_out ? "timed out" : fmt::format("exit {}", ran.exit_code),
                          tail_lines(ran.stdout_text + ran.stderr_text, 20),
                          ran.message ? "\n" + *ran.message : "");
      }
    }
    // The wheels are not part of what the sandbox (and its snapshot) has.
    request.argv = {"rm", "-rf", staging};
    request.env.clear();
    ASSIGN_OR_RETURN(auto removed, execute(id, request, /*as_root=*/false));
    if (removed.exit_code != 0) {
      return make_error(ErrorCode::kInternal, "removing {} from the sandbox failed: {}", staging,
                        removed.stderr_text);
    }
  }
  // Only a sandbox that started from exactly the layers the key names is what the key says.
  if (sandbox.record.snapshot != layers.base || set.lock.packages.empty()) return {};
  progress.step(fmt::format("freezing the result as snapshot {}", layers.package_snapshot));
  auto frozen = freeze(sandbox.record, layers.package_snapshot, layers.packages, set.lock.text(""));
  if (!frozen && frozen.error().code != ErrorCode::kAlreadyExists) {
    // The sandbox has its packages; only the next one will install them again.
    spdlog::warn("keeping the packages of sandbox {} as a snapshot: {}", id,
                 frozen.error().message);
  }
  progress.finish(fmt::format("{} in sandbox {}", fmt::join(layers.packages, " "), id));
  return {};
}

}  // namespace quarry::sandbox::local

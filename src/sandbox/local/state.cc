#include "sandbox/local/state.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <nlohmann/json.hpp>

#include "common/file_util.h"
#include "common/random_id.h"
#include "common/unique_fd.h"
#include "sandbox/local/image.h"

namespace quarry::sandbox::local {
namespace {

constexpr std::string_view kRecordFile = "sandbox.json";

// A sandbox's limits, as its record and its admission ticket keep them.
nlohmann::json resources_json(const ResourceLimits& resources) {
  return {{"cpus", resources.cpus},
          {"memory_bytes", resources.memory_bytes},
          {"disk_bytes", resources.disk_bytes},
          {"pids", resources.pids}};
}

// Throws nlohmann::json::exception when one is missing or of another type.
ResourceLimits resources_from(const nlohmann::json& json) {
  ResourceLimits resources;
  json.at("cpus").get_to(resources.cpus);
  json.at("memory_bytes").get_to(resources.memory_bytes);
  json.at("disk_bytes").get_to(resources.disk_bytes);
  json.at("pids").get_to(resources.pids);
  return resources;
}

nlohmann::json to_json(const SandboxRecord& record) {
  nlohmann::json json = {
      {"id", record.id},
      {"labels", record.labels},
      {"resources", resources_json(record.resources)},
      {"image", record.image},
      {"snapshot", record.snapshot},
      {"packages", record.packages},
      {"init_pid", record.init_pid},
      {"init_start_time", record.init_start_time},
      {"qgroup", record.qgroup},
      {"id_base", record.id_base},
      {"created_at_ms",
       std::chrono::duration_cast<std::chrono::milliseconds>(record.created_at.time_since_epoch())
           .count()},
  };
  if (record.network.mode == NetworkMode::kAllowlist) {
    json["network"] = {{"mode", "allowlist"}, {"allow", record.network.allow}};
  }
  return json;
}

Result<SandboxRecord> from_json(const nlohmann::json& json) {
  try {
    SandboxRecord record;
    json.at("id").get_to(record.id);
    json.at("labels").get_to(record.labels);
    record.resources = resources_from(json.at("resources"));
    json.at("image").get_to(record.image);
    // Records from before snapshots started from the image.
    record.snapshot = json.value("snapshot", "");
    record.packages = json.value("packages", std::vector<std::string>{});
    json.at("init_pid").get_to(record.init_pid);
    json.at("init_start_time").get_to(record.init_start_time);
    json.at("qgroup").get_to(record.qgroup);
    // Records from before sandboxes had ranges of their own used the image's.
    record.id_base = json.value("id_base", kSandboxIdBase);
    record.created_at = std::chrono::system_clock::time_point(
        std::chrono::milliseconds(json.at("created_at_ms").get<int64_t>()));
    if (json.contains("network")) {
      const auto& network = json.at("network");
      if (network.at("mode").get<std::string>() != "allowlist") {
        return make_error(ErrorCode::kInternal, "unknown network mode {}",
                          network.at("mode").dump());
      }
      record.network.mode = NetworkMode::kAllowlist;
      network.at("allow").get_to(record.network.allow);
    }
    return record;
  } catch (const nlohmann::json::exception& error) {
    return make_error(ErrorCode::kInternal, "{}", error.what());
  }
}

}  // namespace

bool valid_sandbox_id(std::string_view id) {
  if (id.size() != 12) return false;
  for (char c : id) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

StateStore::StateStore(std::filesystem::path state_dir)
    : state_dir_(std::move(state_dir)),
      sandboxes_dir_(state_dir_ / "sandboxes"),
      admitting_dir_(state_dir_ / "admitting") {}

std::filesystem::path StateStore::sandbox_dir(std::string_view id) const {
  return sandboxes_dir_ / id;
}

std::filesystem::path StateStore::control_socket(std::string_view id) const {
  return sandbox_dir(id) / "control.sock";
}

Result<void> StateStore::save(const SandboxRecord& record) const {
  return write_file_atomic(sandbox_dir(record.id) / kRecordFile, to_json(record).dump(2) + "\n",
                           0600);
}

Result<SandboxRecord> StateStore::load(std::string_view id) const {
  if (!valid_sandbox_id(id)) {
    return make_error(ErrorCode::kNotFound,
                      "no sandbox '{}' (sandbox ids are 12 hex digits; see quarry sandbox ls)", id);
  }
  auto text = read_file(sandbox_dir(id) / kRecordFile);
  if (!text) {
    if (text.error().code == ErrorCode::kNotFound) {
      return make_error(ErrorCode::kNotFound, "no sandbox '{}' (see quarry sandbox ls)", id);
    }
    return std::unexpected(text.error());
  }
  auto json = nlohmann::json::parse(*text, nullptr, false);
  if (json.is_discarded()) {
    return make_error(ErrorCode::kInternal, "the record of sandbox {} is not valid JSON", id);
  }
  auto record = from_json(json);
  if (!record)
    return std::unexpected(
        record.error().with_context(fmt::format("the record of sandbox {} is damaged", id)));
  return record;
}

Result<std::vector<SandboxRecord>> StateStore::list() const {
  std::vector<SandboxRecord> records;
  std::error_code error;
  if (!std::filesystem::exists(sandboxes_dir_, error)) return records;
  for (const auto& entry : std::filesystem::directory_iterator(sandboxes_dir_, error)) {
    std::string id = entry.path().filename().string();
    if (!valid_sandbox_id(id) || !std::filesystem::exists(entry.path() / kRecordFile)) continue;
    auto record = load(id);
    if (record) records.push_back(std::move(*record));
  }
  if (error) {
    return make_error(ErrorCode::kInternal, "listing '{}' failed: {}", sandboxes_dir_.string(),
                      error.message());
  }
  std::sort(records.begin(), records.end(),
            [](const auto& a, const auto& b) { return a.created_at < b.created_at; });
  return records;
}

std::vector<std::pair<std::string, std::chrono::system_clock::time_point>> StateStore::abandoned(
    std::chrono::seconds quiet) const {
  std::vector<std::pair<std::string, std::chrono::system_clock::time_point>> found;
  const auto now = std::filesystem::file_time_type::clock::now();
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(sandboxes_dir_, error)) {
    const std::string id = entry.path().filename().string();
    if (!valid_sandbox_id(id) || std::filesystem::exists(entry.path() / kRecordFile)) continue;
    std::error_code unreadable;
    const auto changed = std::filesystem::last_write_time(entry.path(), unreadable);
    if (unreadable || now - changed < quiet) continue;
    found.emplace_back(id, std::chrono::time_point_cast<std::chrono::system_clock::duration>(
                               std::chrono::file_clock::to_sys(changed)));
  }
  return found;
}

namespace {

constexpr uint32_t kIdRanges = 16383;  // ranges above the image's: up to 2^31

std::filesystem::path claim_path(const std::filesystem::path& state_dir, uint32_t base) {
  return state_dir / "id-ranges" / std::to_string(base);
}

}  // namespace

Result<uint32_t> StateStore::claim_id_range(std::string_view id) const {
  RETURN_IF_ERROR(make_directories(state_dir_ / "id-ranges", 0700));
  for (int attempt = 0; attempt < 64; ++attempt) {
    const uint32_t slot = 1 + random_bits() % kIdRanges;
    const uint32_t base = kSandboxIdBase + slot * kSandboxIdCount;
    const auto path = claim_path(state_dir_, base);
    UniqueFd claim(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
    if (!claim && errno == EEXIST) {
      // Taken, unless the sandbox that took it is gone (its creator died half way).
      auto owner = read_file(path);
      if (!owner || !valid_sandbox_id(*owner) || std::filesystem::exists(sandbox_dir(*owner))) {
        continue;
      }
      ::unlink(path.c_str());
      claim.reset(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
      if (!claim) continue;
    }
    if (!claim) return errno_error("claiming host ids at '{}'", path.string());
    if (::write(claim.get(), id.data(), id.size()) != static_cast<ssize_t>(id.size())) {
      ::unlink(path.c_str());
      continue;
    }
    return base;
  }
  return make_error(ErrorCode::kResourceExhausted,
                    "no free host id range for a sandbox after 64 tries (see {})",
                    (state_dir_ / "id-ranges").string());
}

Result<UniqueFd> StateStore::lock_admissions() const {
  RETURN_IF_ERROR(make_directories(admitting_dir_, 0700));
  const auto path = admitting_dir_ / ".lock";
  UniqueFd lock(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
  if (!lock) return errno_error("open '{}'", path.string());
  while (::flock(lock.get(), LOCK_EX) != 0) {
    if (errno != EINTR) return errno_error("flock '{}'", path.string());
  }
  return lock;
}

Result<std::vector<AdmissionTicket>> StateStore::admitting(std::chrono::seconds max_age) const {
  std::vector<AdmissionTicket> tickets;
  const auto now = std::filesystem::file_time_type::clock::now();
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(admitting_dir_, error)) {
    const std::string name = entry.path().filename().string();
    if (name.starts_with(".")) continue;
    // <pid>-<n>[-<id>]
    const pid_t pid = static_cast<pid_t>(std::strtol(name.c_str(), nullptr, 10));
    const size_t dash = name.rfind('-');
    const std::string id = dash == std::string::npos ? "" : name.substr(dash + 1);
    std::error_code unreadable;
    const auto changed = std::filesystem::last_write_time(entry.path(), unreadable);
    if (unreadable) continue;  // its create has ended
    if (pid <= 0 || (::kill(pid, 0) != 0 && errno == ESRCH) || now - changed > max_age) {
      ::unlink(entry.path().c_str());
      continue;
    }
    auto text = read_file(entry.path());
    if (!text) continue;
    auto json = nlohmann::json::parse(*text, nullptr, false);
    try {
      tickets.push_back({valid_sandbox_id(id) ? id : "", resources_from(json)});
    } catch (const nlohmann::json::exception&) {
      ::unlink(entry.path().c_str());  // not one quarry wrote (each is written whole)
    }
  }
  if (error && error != std::errc::no_such_file_or_directory) {
    return make_error(ErrorCode::kInternal, "listing '{}' failed: {}", admitting_dir_.string(),
                      error.message());
  }
  return tickets;
}

Result<std::string> StateStore::add_ticket(const ResourceLimits& limits) const {
  static std::atomic<uint64_t> counter{0};
  const std::string name = fmt::format("{}-{}", ::getpid(), counter++);
  RETURN_IF_ERROR(
      write_file_atomic(admitting_dir_ / name, resources_json(limits).dump() + "\n", 0600));
  return name;
}

std::string StateStore::name_ticket(const std::string& ticket, std::string_view id) const {
  std::string named = fmt::format("{}-{}", ticket, id);
  // Not while another process counts: it may have listed the old name and find it gone, as
  // if the create had ended, before it reads the records (where this one's is not yet).
  auto lock = lock_admissions();
  if (!lock) return ticket;
  if (::rename((admitting_dir_ / ticket).c_str(), (admitting_dir_ / named).c_str()) != 0) {
    return ticket;  // counted by both until the create ends: too much, never too little
  }
  return named;
}

void StateStore::remove_ticket(const std::string& ticket) const {
  if (!ticket.empty()) ::unlink((admitting_dir_ / ticket).c_str());
}

std::vector<uint32_t> host_ids_from(uint32_t lowest) {
  std::vector<uint32_t> ids;
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) return ids;
  while (const dirent* entry = ::readdir(proc)) {
    if (entry->d_name[0] < '1' || entry->d_name[0] > '9') continue;  // pids only
    struct stat info {};
    if (::fstatat(::dirfd(proc), entry->d_name, &info, AT_SYMLINK_NOFOLLOW) != 0) continue;
    if (info.st_uid >= lowest) ids.push_back(info.st_uid);
  }
  ::closedir(proc);
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

HostIds::HostIds(std::chrono::milliseconds max_age, Scan scan)
    : max_age_(max_age),
      scan_(scan ? std::move(scan) : [] { return host_ids_from(kSandboxIdBase); }) {}

bool HostIds::in_use(uint32_t base, uint32_t count) {
  std::lock_guard lock(mutex_);
  const auto now = std::chrono::steady_clock::now();
  if (!read_at_ || now - *read_at_ >= max_age_) {
    ids_ = scan_();
    read_at_ = now;
  }
  auto first = std::lower_bound(ids_.begin(), ids_.end(), base);
  return first != ids_.end() && *first - base < count;
}

void StateStore::release_id_range(uint32_t base) const {
  if (base == kSandboxIdBase || base == 0) return;
  ::unlink(claim_path(state_dir_, base).c_str());
}

}  // namespace quarry::sandbox::local

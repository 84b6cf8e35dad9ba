#include "sandbox/local/snapshot.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>

#include "common/file_util.h"
#include "common/random_id.h"
#include "common/sha256.h"
#include "sandbox/local/python_lock.h"

namespace quarry::sandbox::local {
namespace {

constexpr std::string_view kRecordFile = "snapshot.json";

int64_t milliseconds(std::chrono::system_clock::time_point when) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(when.time_since_epoch()).count();
}

std::chrono::system_clock::time_point from_milliseconds(int64_t ms) {
  return std::chrono::system_clock::time_point(std::chrono::milliseconds(ms));
}

nlohmann::json to_json(const SnapshotRecord& record) {
  return {{"name", record.name},
          {"id", record.id},
          {"image", record.image},
          {"parent", record.parent},
          {"sandbox", record.sandbox},
          {"packages", record.packages},
          {"lock", record.lock},
          {"id_base", record.id_base},
          {"size_bytes", record.size_bytes},
          {"created_at_ms", milliseconds(record.created_at)},
          {"last_used_at_ms", milliseconds(record.last_used_at)}};
}

Result<SnapshotRecord> from_json(const nlohmann::json& json) {
  try {
    SnapshotRecord record;
    json.at("name").get_to(record.name);
    json.at("id").get_to(record.id);
    json.at("image").get_to(record.image);
    json.at("parent").get_to(record.parent);
    json.at("sandbox").get_to(record.sandbox);
    json.at("packages").get_to(record.packages);
    json.at("lock").get_to(record.lock);
    json.at("id_base").get_to(record.id_base);
    json.at("size_bytes").get_to(record.size_bytes);
    record.created_at = from_milliseconds(json.at("created_at_ms").get<int64_t>());
    record.last_used_at = from_milliseconds(json.at("last_used_at_ms").get<int64_t>());
    return record;
  } catch (const nlohmann::json::exception& error) {
    return make_error(ErrorCode::kInternal, "{}", error.what());
  }
}

bool name_character(char c) {
  return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
}

}  // namespace

bool valid_snapshot_name(std::string_view name) {
  if (name.empty() || name.size() > 63 || !std::isalnum(static_cast<unsigned char>(name[0]))) {
    return false;
  }
  return std::all_of(name.begin(), name.end(), name_character);
}

Result<void> check_snapshot_name(std::string_view name) {
  if (!valid_snapshot_name(name)) {
    return make_error(ErrorCode::kInvalidArgument,
                      "'{}' is not a snapshot name: use 1 to 63 lowercase letters, digits, '.', "
                      "'_' and '-', starting with a letter or digit",
                      name);
  }
  if (name.starts_with(kPackageSnapshotPrefix)) {
    return make_error(ErrorCode::kInvalidArgument,
                      "snapshot names starting with '{}' are quarry's own (the snapshots of "
                      "extra packages); choose another name",
                      kPackageSnapshotPrefix);
  }
  return {};
}

Result<std::vector<std::string>> canonical_requirements(
    const std::vector<std::string>& requirements) {
  std::vector<std::string> out;
  for (const auto& requirement : requirements) {
    std::string compact;
    for (char c : requirement) {
      if (c != ' ') compact.push_back(c);
    }
    if (!valid_package_requirement(compact)) {
      return make_error(ErrorCode::kInvalidArgument,
                        "'{}' is not a package requirement (e.g. tabulate or tabulate==0.9.0)",
                        requirement);
    }
    const auto name_end = compact.find_first_of("[=<>!~,");
    out.push_back(requirement_name(compact) +
                  (name_end == std::string::npos ? "" : compact.substr(name_end)));
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::string package_snapshot_name(std::string_view image, std::string_view base,
                                  const std::vector<std::string>& requirements) {
  const nlohmann::json key = {{"image", image}, {"base", base}, {"packages", requirements}};
  return fmt::format("{}{}", kPackageSnapshotPrefix, sha256_hex(key.dump()).substr(0, 16));
}

std::vector<std::string> collectable_snapshots(const std::vector<SnapshotRecord>& snapshots,
                                               const std::set<std::string>& used,
                                               std::chrono::system_clock::time_point now,
                                               const SnapshotConfig& policy) {
  std::map<std::string, int> children;
  for (const auto& snapshot : snapshots) {
    if (!snapshot.parent.empty()) ++children[snapshot.parent];
  }
  auto expired = [&](const SnapshotRecord& snapshot) {
    const auto& keep =
        snapshot.is_package_snapshot() ? policy.keep_unused : policy.keep_unused_named;
    return keep && now - snapshot.last_used_at >= *keep;
  };
  std::vector<std::string> collected;
  std::set<std::string> gone;
  // Leaves first; a parent whose last child went becomes a leaf in the next round.
  for (bool more = true; more;) {
    more = false;
    for (const auto& snapshot : snapshots) {
      if (gone.contains(snapshot.name) || children[snapshot.name] > 0 ||
          used.contains(snapshot.name) || !expired(snapshot)) {
        continue;
      }
      gone.insert(snapshot.name);
      collected.push_back(snapshot.name);
      if (!snapshot.parent.empty()) --children[snapshot.parent];
      more = true;
    }
  }
  return collected;
}

SnapshotStore::SnapshotStore(const std::filesystem::path& volume_dir)
    : dir_(volume_dir / "snapshots") {}

std::filesystem::path SnapshotStore::layer(std::string_view name) const {
  return dir_ / name / "layer";
}

Result<SnapshotRecord> SnapshotStore::load(std::string_view name) const {
  if (!valid_snapshot_name(name)) {
    return make_error(ErrorCode::kNotFound, "no snapshot '{}' (see quarry snapshot ls)", name);
  }
  auto text = read_file(dir_ / name / kRecordFile);
  if (!text) {
    if (text.error().code == ErrorCode::kNotFound) {
      return make_error(ErrorCode::kNotFound, "no snapshot '{}' (see quarry snapshot ls)", name);
    }
    return std::unexpected(text.error());
  }
  auto json = nlohmann::json::parse(*text, nullptr, false);
  auto record = json.is_discarded()
                    ? make_error(ErrorCode::kInternal, "snapshot.json is not valid JSON")
                    : from_json(json);
  if (!record) {
    return std::unexpected(record.error().with_context(fmt::format(
        "the record of snapshot {} is damaged; remove it: quarry snapshot rm {}", name, name)));
  }
  return record;
}

Result<std::vector<SnapshotRecord>> SnapshotStore::chain(std::string_view name) const {
  std::vector<SnapshotRecord> chain;
  for (std::string next(name); !next.empty();) {
    auto record = load(next);
    if (!record) {
      if (chain.empty()) return std::unexpected(record.error());
      return std::unexpected(record.error().with_context(
          fmt::format("snapshot {} was made on snapshot {}", chain.back().name, next)));
    }
    // Each snapshot is made on one that existed before, so a loop means damage.
    if (chain.size() >= kMaxFrozenLayers) {
      return make_error(ErrorCode::kInternal,
                        "snapshot {} is made on more than {} others; a sandbox cannot have that "
                        "many layers",
                        name, kMaxFrozenLayers - 1);
    }
    next = record->parent;
    chain.push_back(std::move(*record));
  }
  return chain;
}

Result<std::vector<SnapshotRecord>> SnapshotStore::list() const {
  std::vector<SnapshotRecord> records;
  std::error_code error;
  if (!std::filesystem::exists(dir_, error)) return records;
  for (const auto& entry : std::filesystem::directory_iterator(dir_, error)) {
    const std::string name = entry.path().filename().string();
    if (!valid_snapshot_name(name) || !std::filesystem::exists(entry.path() / kRecordFile)) {
      continue;
    }
    auto record = load(name);
    if (record) records.push_back(std::move(*record));
  }
  if (error) {
    return make_error(ErrorCode::kInternal, "listing '{}' failed: {}", dir_.string(),
                      error.message());
  }
  std::sort(records.begin(), records.end(),
            [](const auto& a, const auto& b) { return a.created_at < b.created_at; });
  return records;
}

Result<void> SnapshotStore::save(const std::filesystem::path& dir,
                                 const SnapshotRecord& record) const {
  return write_file_atomic(dir / kRecordFile, to_json(record).dump(2) + "\n", 0600);
}

void SnapshotStore::touch(std::string_view name, std::chrono::system_clock::time_point when) const {
  if (auto record = load(name)) touch(std::move(*record), when);
}

void SnapshotStore::touch(SnapshotRecord record, std::chrono::system_clock::time_point when) const {
  if (when - record.last_used_at < std::chrono::minutes(1)) return;
  record.last_used_at = when;
  (void)save(dir_ / record.name, record);
}

Result<UniqueFd> SnapshotStore::lock(bool exclusive, bool wait) const {
  RETURN_IF_ERROR(make_directories(dir_, 0700));
  const auto path = dir_ / "lock";
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
  if (!fd) return errno_error("open '{}'", path.string());
  const int operation = (exclusive ? LOCK_EX : LOCK_SH) | (wait ? 0 : LOCK_NB);
  while (::flock(fd.get(), operation) != 0) {
    if (errno == EINTR) continue;
    if (errno == EWOULDBLOCK) {
      return make_error(ErrorCode::kUnavailable, "the snapshots are in use ({})", path.string());
    }
    return errno_error("flock '{}'", path.string());
  }
  return fd;
}

Result<ScopedTree> SnapshotStore::stage() const {
  RETURN_IF_ERROR(make_directories(dir_, 0700));
  ScopedTree staging(dir_ / fmt::format(".new-{}", random_id()));
  if (::mkdir(staging.path().c_str(), 0700) != 0) {
    const auto failed = errno_error("mkdir '{}'", staging.path().string());
    staging.release();
    return std::unexpected(failed.error());
  }
  return staging;
}

Result<void> SnapshotStore::save_staged(const ScopedTree& staging,
                                        const SnapshotRecord& record) const {
  return save(staging.path(), record);
}

Result<void> SnapshotStore::publish(ScopedTree& staging, std::string_view name) const {
  const auto target = dir_ / name;
  if (::renameat2(AT_FDCWD, staging.path().c_str(), AT_FDCWD, target.c_str(), RENAME_NOREPLACE) !=
      0) {
    if (errno == EEXIST) {
      return make_error(ErrorCode::kAlreadyExists, "snapshot '{}' exists", name);
    }
    return errno_error("rename '{}' to '{}'", staging.path().string(), target.string());
  }
  staging.release();
  return {};
}

Result<void> SnapshotStore::remove_record(std::string_view name) const {
  if (!valid_snapshot_name(name)) {
    return make_error(ErrorCode::kNotFound, "no snapshot '{}' (see quarry snapshot ls)", name);
  }
  return remove_tree(dir_ / name);
}

Result<uint64_t> tree_bytes(const std::filesystem::path& root) {
  uint64_t total = 0;
  std::error_code error;
  struct stat info {};
  if (::lstat(root.c_str(), &info) != 0) return errno_error("lstat '{}'", root.string());
  total += static_cast<uint64_t>(info.st_blocks) * 512;
  for (std::filesystem::recursive_directory_iterator it(root, error), end; it != end;
       it.increment(error)) {
    if (::lstat(it->path().c_str(), &info) != 0) {
      return errno_error("lstat '{}'", it->path().string());
    }
    total += static_cast<uint64_t>(info.st_blocks) * 512;
  }
  if (error) {
    return make_error(ErrorCode::kInternal, "walking '{}' failed: {}", root.string(),
                      error.message());
  }
  return total;
}

}  // namespace quarry::sandbox::local

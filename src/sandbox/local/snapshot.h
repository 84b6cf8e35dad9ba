// Snapshots of the local provider: a sandbox's writable layer frozen into a read-only layer
// (SandboxVolume::freeze) that new sandboxes start from, between the image and their own
// writable layer. They live in the sandbox volume, since a btrfs snapshot is made within one
// filesystem:
//
//   <state>/sandboxes/snapshots/<name>/snapshot.json   the record below
//   <state>/sandboxes/snapshots/<name>/layer/upper/    the frozen layer (layer/ is a read-only
//                                                      subvolume)
//   <state>/sandboxes/snapshots/lock                   held shared while a sandbox is started
//                                                      from a snapshot, exclusive to delete one
//
// A layer's files keep the host ids they had in the sandbox they were frozen from (its range,
// `id_base`). Each sandbox sees a layer through an idmapped mount for its own range, as it sees
// the image: freezing changes nothing in the files (a chown into the image's range would visit
// every file, and clear setuid bits and file capabilities) and takes no longer for a big layer.
//
// Named snapshots are made by `quarry snapshot create`. Package snapshots, named
// "packages-<key>", are made by quarry: a sandbox that asked for extra Python packages, with
// them installed, frozen for the next sandbox that asks for the same set on the same image and
// snapshot (package_snapshot_name).
#pragma once

#include <chrono>
#include <filesystem>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.h"
#include "common/file_util.h"
#include "common/unique_fd.h"
#include "config/config.h"

namespace quarry::sandbox::local {

inline constexpr std::string_view kPackageSnapshotPrefix = "packages-";
// Frozen layers a sandbox can have above the image: one descriptor each in init's setup
// message, which carries at most protocol::kMaxFds.
inline constexpr size_t kMaxFrozenLayers = 15;

struct SnapshotRecord {
  std::string name;
  std::string id;       // random, for this content: a name used again names another snapshot
  std::string image;    // hash of the image it was made on
  std::string parent;   // the snapshot it was made on ("": the image itself)
  std::string sandbox;  // the sandbox it was frozen from
  std::vector<std::string> packages;  // a package snapshot's requirements (canonical, sorted)
  std::string lock;                   // what they resolved to: a lock's text
  uint32_t id_base = 0;               // the host ids of its files: `sandbox`'s range
  uint64_t size_bytes = 0;            // what its layer holds on disk
  std::chrono::system_clock::time_point created_at;
  // When a sandbox was last started from it or destroyed after using it.
  std::chrono::system_clock::time_point last_used_at;

  bool is_package_snapshot() const { return name.starts_with(kPackageSnapshotPrefix); }
};

// What keeps a snapshot: sandboxes started from it, snapshots made on it.
struct SnapshotUsers {
  std::vector<std::string> sandboxes;
  std::vector<std::string> snapshots;
  bool empty() const { return sandboxes.empty() && snapshots.empty(); }
};

struct SnapshotInfo {
  SnapshotRecord snapshot;
  SnapshotUsers users;
};

// Whether `name` may name a snapshot someone makes: 1 to 63 lowercase letters, digits, '.', '_'
// and '-', from a letter or digit, not "packages-..." (quarry's own); kInvalidArgument saying so.
Result<void> check_snapshot_name(std::string_view name);
// The same for any stored snapshot's name, quarry's own included.
bool valid_snapshot_name(std::string_view name);

// Requirements in one spelling, sorted and without repeats: the name normalised (PEP 503), no
// spaces ("Tabulate >= 0.9" -> "tabulate>=0.9"). kInvalidArgument for one that is no plain
// requirement (a URL, a path, an option).
Result<std::vector<std::string>> canonical_requirements(
    const std::vector<std::string>& requirements);

// The package snapshot of `requirements` (canonical) installed on image `image` over the snapshot
// whose id is `base` ("" for the image itself): "packages-" and 16 hex digits of the hash of all
// three, so the same set on the same layers is found again, and any other is another.
std::string package_snapshot_name(std::string_view image, std::string_view base,
                                  const std::vector<std::string>& requirements);

// The snapshots that may be deleted at `now`: those no other snapshot is made on and none of
// `used` (by sandboxes: started from them, or frozen into them and still there) that were last
// used longer ago than `policy` keeps them (package snapshots and named ones each by their own
// setting; nullopt: kept). A snapshot whose only users are being deleted with it goes too.
// Children before their parents, so they can be deleted in that order.
std::vector<std::string> collectable_snapshots(const std::vector<SnapshotRecord>& snapshots,
                                               const std::set<std::string>& used,
                                               std::chrono::system_clock::time_point now,
                                               const SnapshotConfig& policy);

class SnapshotStore {
 public:
  // `volume_dir` is the sandbox volume's mount point, <state>/sandboxes.
  explicit SnapshotStore(const std::filesystem::path& volume_dir);

  const std::filesystem::path& dir() const { return dir_; }
  std::filesystem::path layer(std::string_view name) const;  // the subvolume
  // The directory overlayfs takes as the frozen layer.
  std::filesystem::path upper(std::string_view name) const { return layer(name) / "upper"; }

  // kNotFound naming the snapshot when there is none.
  Result<SnapshotRecord> load(std::string_view name) const;
  // The snapshot and each it was made on, top first.
  Result<std::vector<SnapshotRecord>> chain(std::string_view name) const;
  // Every complete snapshot, oldest first (one being made is not there yet).
  Result<std::vector<SnapshotRecord>> list() const;
  // Records that a sandbox started from it or stopped using it at `when`. Best effort, and only
  // when the record says a minute earlier or more (the time is for collection, kept in days):
  // sandbox starts do not write it each time.
  void touch(std::string_view name, std::chrono::system_clock::time_point when) const;
  void touch(SnapshotRecord record, std::chrono::system_clock::time_point when) const;

  // The store's lock: shared while a sandbox is started from a snapshot (until its record names
  // it), exclusive to delete one. With `wait` false, kUnavailable when it is held.
  Result<UniqueFd> lock(bool exclusive, bool wait = true) const;

  // An empty directory in the store to make a snapshot in (its layer frozen into
  // `staging / "layer"`, its record written with `save_staged`), then published under its name
  // in one rename: a half-made snapshot is never seen, and two made under one name at once
  // cannot both be. The directory is removed if not published.
  Result<ScopedTree> stage() const;
  Result<void> save_staged(const ScopedTree& staging, const SnapshotRecord& record) const;
  // kAlreadyExists when the name is taken (the staging directory is then left to its guard).
  Result<void> publish(ScopedTree& staging, std::string_view name) const;
  // Removes what remains of snapshot `name` once its layer is deleted.
  Result<void> remove_record(std::string_view name) const;

 private:
  Result<void> save(const std::filesystem::path& dir, const SnapshotRecord& record) const;
  std::filesystem::path dir_;
};

// Bytes a directory tree holds on disk (st_blocks), not following links.
Result<uint64_t> tree_bytes(const std::filesystem::path& root);

}  // namespace quarry::sandbox::local

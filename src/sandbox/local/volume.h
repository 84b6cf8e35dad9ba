// The sandbox volume: <state>/sandboxes is a btrfs filesystem and every sandbox is one
// subvolume in it, holding its record, control socket, log, mount point and the writable
// layer of its overlay root, under a qgroup limit (the sandbox's disk size).
//
// btrfs qgroups work on kernels built without CONFIG_QUOTA (where ext4 and XFS project quotas
// are unavailable), and deleting a subvolume removes everything a sandbox wrote in O(1), with
// no per-file work on the host's filesystem. When the state directory is not itself on btrfs,
// the volume is a sparse file, <state>/sandboxes.btrfs, loop-mounted at <state>/sandboxes;
// discard=async keeps the file only as large as what sandboxes hold.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <filesystem>
#include <string_view>
#include <vector>

#include "common/error.h"

namespace quarry::sandbox::local {

struct SandboxDirectory {
  std::filesystem::path path;   // <state>/sandboxes/<id>
  std::filesystem::path upper;  // overlay upperdir
  std::filesystem::path work;   // overlay workdir
  uint64_t qgroup = 0;          // the subvolume's qgroup id
};

class SandboxVolume {
 public:
  // Mounts the volume if needed (creating it on first use) and enables quotas on it.
  // `volume_bytes` sizes a new backing file; an existing smaller one is grown to it (a larger
  // one is used as it is).
  static Result<SandboxVolume> open(const std::filesystem::path& state_dir, uint64_t volume_bytes);

  // A subvolume named `id` limited to `limit_bytes`, with upper/ owned by `root_uid` (the
  // sandbox's root as seen from the host) and work/. kAlreadyExists if `id` is taken.
  Result<SandboxDirectory> create(std::string_view id, uint64_t limit_bytes,
                                  uint32_t root_uid) const;
  // Deletes the subvolume with everything in it, and its qgroup. Missing is fine.
  Result<void> remove(std::string_view id, uint64_t qgroup) const;

  // Freezes sandbox `id`'s writable layer: a read-only btrfs snapshot of its subvolume at
  // `target` (a new name in a directory of the volume), whose upper/ is the layer with its
  // whiteouts and opaque directories as they are (the rest of the sandbox's directory, its
  // record and log, comes along unused). Nothing is copied, so it takes no longer for a full
  // layer than an empty one; the sandbox goes on. It holds what reached the filesystem: btrfs
  // writes out the sandbox's dirty pages first.
  Result<void> freeze(std::string_view id, const std::filesystem::path& target) const;
  // The bytes qgroup 0/`qgroup` (a subvolume's) refers to, as of the last transaction.
  Result<uint64_t> referenced_bytes(uint64_t qgroup) const;
  // Deletes a subvolume that `freeze` made, and its qgroup. Missing is fine.
  Result<void> remove_frozen(const std::filesystem::path& layer) const;

  // Whether a new sandbox limited to `limit_bytes` can be backed when the sandboxes there now
  // are limited to `committed_bytes` together: the volume is sparse, and a host filesystem that
  // fills up under it turns btrfs read-only for every sandbox. Where the volume is a file, all
  // limits together must fit in what that file holds plus what its filesystem has free, less a
  // reserve for the host (5 %, at least 512 MiB), and in the volume itself, both times
  // `overcommit` (capacity.overcommit.disk); on a btrfs state directory the new limit must fit
  // in its free space less the reserve. kResourceExhausted, with the figures, when not.
  Result<void> admit(uint64_t committed_bytes, uint64_t limit_bytes, double overcommit = 1.0) const;

  const std::filesystem::path& mount_point() const { return mount_point_; }
  // The block devices the volume is on: its loop device, or the disks of a btrfs state
  // directory (where each sandbox's reads and writes are throttled).
  const std::vector<dev_t>& devices() const { return devices_; }

 private:
  // Deletes subvolume `name` of `parent`, and its qgroup (looked up when 0).
  static Result<void> delete_subvolume(const std::filesystem::path& parent, std::string_view name,
                                       uint64_t qgroup);
  SandboxVolume(std::filesystem::path mount_point, std::filesystem::path backing,
                std::vector<dev_t> devices)
      : mount_point_(std::move(mount_point)),
        backing_(std::move(backing)),
        devices_(std::move(devices)) {}
  std::filesystem::path mount_point_;
  std::filesystem::path backing_;  // the file holding the volume; empty on a btrfs state dir
  std::vector<dev_t> devices_;
};

}  // namespace quarry::sandbox::local

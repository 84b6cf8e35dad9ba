// Writable layers: the upper half of each sandbox's overlay root, with a disk limit.
//
// The limit is a btrfs qgroup on a subvolume per sandbox, which works on kernels built without
// CONFIG_QUOTA (where ext4 and XFS project quotas are unavailable) and makes destroying a
// sandbox's files O(1). When the state directory is not itself on btrfs, the layers live on a
// btrfs filesystem in a sparse file, <state>/layers.btrfs, loop-mounted at <state>/layers;
// discard keeps the file only as large as what sandboxes hold.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string_view>

#include "common/error.h"

namespace quarry::sandbox::local {

struct Layer {
  std::filesystem::path upper;  // overlay upperdir
  std::filesystem::path work;   // overlay workdir
  uint64_t qgroup = 0;          // the subvolume's qgroup id
};

class LayerStore {
 public:
  // Mounts the volume if needed (creating it on first use) and enables quotas on it.
  // `volume_bytes` sizes a new backing file; an existing one is used as it is.
  static Result<LayerStore> open(const std::filesystem::path& state_dir, uint64_t volume_bytes);

  // A subvolume named `id` limited to `limit_bytes`, with upper/ owned by `root_uid` (the
  // sandbox's root as seen from the host) and work/.
  Result<Layer> create(std::string_view id, uint64_t limit_bytes, uint32_t root_uid) const;
  // Deletes the subvolume and its qgroup. Missing is fine.
  Result<void> remove(std::string_view id, uint64_t qgroup) const;

  const std::filesystem::path& mount_point() const { return mount_point_; }

 private:
  explicit LayerStore(std::filesystem::path mount_point) : mount_point_(std::move(mount_point)) {}
  std::filesystem::path mount_point_;
};

}  // namespace quarry::sandbox::local

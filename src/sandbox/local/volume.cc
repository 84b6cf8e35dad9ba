#include "sandbox/local/volume.h"

#include <endian.h>
#include <fcntl.h>
#include <linux/btrfs.h>
#include <linux/btrfs_tree.h>
#include <linux/loop.h>
#include <linux/magic.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <functional>
#include <optional>
#include <thread>

#include "common/command.h"
#include "common/file_util.h"
#include "common/unique_fd.h"
#include "common/units.h"

namespace quarry::sandbox::local {
namespace {

bool is_btrfs(const std::filesystem::path& path) {
  struct statfs info {};
  return ::statfs(path.c_str(), &info) == 0 && info.f_type == BTRFS_SUPER_MAGIC;
}

bool is_mount_point(const std::filesystem::path& path) {
  struct stat self {
  }, parent{};
  if (::stat(path.c_str(), &self) != 0) return false;
  if (::stat(path.parent_path().c_str(), &parent) != 0) return false;
  return self.st_dev != parent.st_dev;
}

Result<void> make_backing_file(const std::filesystem::path& file, uint64_t bytes) {
  auto temp = file;
  temp += ".new";
  {
    UniqueFd fd(::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
    if (!fd) return errno_error("create '{}'", temp.string());
    if (::ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0) {
      return errno_error("ftruncate '{}' to {} bytes", temp.string(), bytes);
    }
  }
  auto made = run_command({"mkfs.btrfs", "-q", temp.string()});
  if (!made) {
    ::unlink(temp.c_str());
    return std::unexpected(made.error().with_context(
        "making the btrfs filesystem for sandbox layers (install btrfs-progs: scripts/setup)"));
  }
  if (::rename(temp.c_str(), file.c_str()) != 0) return errno_error("rename '{}'", temp.string());
  return {};
}

// Attaches `file` to a free loop device and mounts it; the device detaches itself on unmount.
Result<void> loop_mount(const std::filesystem::path& file, const std::filesystem::path& target) {
  UniqueFd backing(::open(file.c_str(), O_RDWR | O_CLOEXEC));
  if (!backing) return errno_error("open '{}'", file.string());
  UniqueFd control(::open("/dev/loop-control", O_RDWR | O_CLOEXEC));
  if (!control) {
    return std::unexpected(
        errno_error("open('/dev/loop-control')")
            .error()
            .with_context("sandbox layers need a loop device (or a state directory on btrfs)"));
  }
  for (int attempt = 0; attempt < 8; ++attempt) {
    int number = ::ioctl(control.get(), LOOP_CTL_GET_FREE);
    if (number < 0) return errno_error("ioctl(LOOP_CTL_GET_FREE)");
    std::string device = fmt::format("/dev/loop{}", number);
    UniqueFd loop(::open(device.c_str(), O_RDWR | O_CLOEXEC));
    if (!loop) return errno_error("open '{}'", device);
    loop_config config{};
    config.fd = static_cast<uint32_t>(backing.get());
    config.info.lo_flags = LO_FLAGS_AUTOCLEAR;
    std::strncpy(reinterpret_cast<char*>(config.info.lo_file_name), file.c_str(), LO_NAME_SIZE - 1);
    if (::ioctl(loop.get(), LOOP_CONFIGURE, &config) != 0) {
      if (errno == EBUSY) continue;  // another process took this device first
      return errno_error("ioctl(LOOP_CONFIGURE) on {}", device);
    }
    if (::mount(device.c_str(), target.c_str(), "btrfs", MS_NOSUID | MS_NODEV | MS_NOATIME,
                "discard=async") != 0) {
      return errno_error("mount('{}' on '{}', btrfs)", device, target.string());
    }
    return {};
  }
  return make_error(ErrorCode::kUnavailable, "no free loop device for '{}'", file.string());
}

Result<void> enable_quota(const std::filesystem::path& mount_point) {
  UniqueFd dir(::open(mount_point.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dir) return errno_error("open '{}'", mount_point.string());
  btrfs_ioctl_quota_ctl_args args{};
  args.cmd = BTRFS_QUOTA_CTL_ENABLE;
  if (::ioctl(dir.get(), BTRFS_IOC_QUOTA_CTL, &args) != 0 && errno != EEXIST) {
    return errno_error("enabling btrfs quotas on '{}'", mount_point.string());
  }
  return {};
}

// The block devices under the btrfs filesystem mounted at `mount_point` (its loop device, or
// the disks of a btrfs state directory), from /sys/fs/btrfs/<fsid>/devices/*/dev.
Result<std::vector<dev_t>> block_devices(const std::filesystem::path& mount_point) {
  UniqueFd dir(::open(mount_point.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dir) return errno_error("open '{}'", mount_point.string());
  btrfs_ioctl_fs_info_args info{};
  if (::ioctl(dir.get(), BTRFS_IOC_FS_INFO, &info) != 0) {
    return errno_error("reading the btrfs filesystem id of '{}'", mount_point.string());
  }
  const auto* id = info.fsid;
  const auto devices =
      std::filesystem::path("/sys/fs/btrfs") /
      fmt::format("{:02x}-{:02x}-{:02x}-{:02x}-{:02x}", fmt::join(id, id + 4, ""),
                  fmt::join(id + 4, id + 6, ""), fmt::join(id + 6, id + 8, ""),
                  fmt::join(id + 8, id + 10, ""), fmt::join(id + 10, id + 16, "")) /
      "devices";
  std::vector<dev_t> found;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(devices, error)) {
    ASSIGN_OR_RETURN(auto text, read_file(entry.path() / "dev"));
    unsigned major_number = 0, minor_number = 0;
    if (std::sscanf(text.c_str(), "%u:%u", &major_number, &minor_number) != 2) {
      return make_error(ErrorCode::kInternal, "'{}' holds '{}', not major:minor",
                        (entry.path() / "dev").string(), text);
    }
    found.push_back(makedev(major_number, minor_number));
  }
  if (error || found.empty()) {
    return make_error(ErrorCode::kInternal, "no block device of '{}' is listed in '{}'",
                      mount_point.string(), devices.string());
  }
  return found;
}

// Grows the volume held in `backing`, mounted at `mount_point`, to `bytes` while sandboxes use
// it: the file, then what its loop device takes its size to be, then the filesystem.
Result<void> grow_volume(const std::filesystem::path& backing,
                         const std::filesystem::path& mount_point, uint64_t bytes) {
  if (::truncate(backing.c_str(), static_cast<off_t>(bytes)) != 0) {
    return errno_error("growing '{}' to {} bytes", backing.string(), bytes);
  }
  ASSIGN_OR_RETURN(auto devices, block_devices(mount_point));
  for (dev_t device : devices) {
    const auto uevent = fmt::format("/sys/dev/block/{}:{}/uevent", major(device), minor(device));
    ASSIGN_OR_RETURN(auto text, read_file(uevent));
    const auto name = text.find("DEVNAME=");
    if (name == std::string::npos) {
      return make_error(ErrorCode::kInternal, "'{}' names no device", uevent);
    }
    const auto path = "/dev/" + text.substr(name + 8, text.find('\n', name) - name - 8);
    UniqueFd loop(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!loop) return errno_error("open '{}'", path);
    if (::ioctl(loop.get(), LOOP_SET_CAPACITY, 0) != 0) {
      return errno_error("ioctl(LOOP_SET_CAPACITY) on {}", path);
    }
  }
  UniqueFd dir(::open(mount_point.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dir) return errno_error("open '{}'", mount_point.string());
  btrfs_ioctl_vol_args resize{};
  std::strncpy(resize.name, "max", BTRFS_PATH_NAME_MAX);
  if (::ioctl(dir.get(), BTRFS_IOC_RESIZE, &resize) != 0) {
    return errno_error("resizing the btrfs filesystem at '{}'", mount_point.string());
  }
  spdlog::info("the sandbox volume '{}' grew to {} (sandbox.local.volume_size)", backing.string(),
               format_size(bytes));
  return {};
}

// The id of the subvolume `subvolume` (an open directory at `dir`), which is also its
// qgroup's.
Result<uint64_t> subvolume_id(int subvolume, const std::filesystem::path& dir) {
  btrfs_ioctl_ino_lookup_args lookup{};
  lookup.objectid = BTRFS_FIRST_FREE_OBJECTID;
  if (::ioctl(subvolume, BTRFS_IOC_INO_LOOKUP, &lookup) != 0) {
    return errno_error("looking up the id of subvolume '{}'", dir.string());
  }
  return lookup.treeid;
}

// Sets the limit and makes upper/ and work/ in a new subvolume.
Result<SandboxDirectory> fill_subvolume(const std::filesystem::path& dir, uint64_t limit_bytes,
                                        uint32_t root_uid) {
  UniqueFd subvolume(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!subvolume) return errno_error("open '{}'", dir.string());
  ASSIGN_OR_RETURN(const uint64_t qgroup, subvolume_id(subvolume.get(), dir));
  // qgroupid 0 means "the subvolume this file is in".
  btrfs_ioctl_qgroup_limit_args limit{};
  limit.lim.flags = BTRFS_QGROUP_LIMIT_MAX_RFER;
  limit.lim.max_rfer = limit_bytes;
  if (::ioctl(subvolume.get(), BTRFS_IOC_QGROUP_LIMIT, &limit) != 0) {
    return errno_error("limiting subvolume '{}' to {} bytes", dir.string(), limit_bytes);
  }
  if (::chmod(dir.c_str(), 0700) != 0) return errno_error("chmod '{}'", dir.string());
  SandboxDirectory made{dir, dir / "upper", dir / "work", qgroup};
  // upper/ is the root directory of the sandbox's filesystem: it must look like the image's
  // root (owned by the sandbox's root, 0755).
  for (const auto& path : {made.upper, made.work}) {
    if (::mkdir(path.c_str(), 0755) != 0) return errno_error("mkdir '{}'", path.string());
  }
  if (::chown(made.upper.c_str(), root_uid, root_uid) != 0) {
    return errno_error("chown '{}'", made.upper.string());
  }
  return made;
}

// The items of one btrfs tree with the key (objectid, type, offset) for offsets from `first`
// to `last`, passed to `visit` with their offset and data (BTRFS_IOC_TREE_SEARCH, a buffer at a
// time). At most `limit` of them.
Result<void> search_tree(int fd, uint64_t tree, uint64_t objectid, uint32_t type, uint64_t first,
                         uint64_t last,
                         const std::function<void(uint64_t, std::string_view)>& visit,
                         uint32_t limit = UINT32_MAX) {
  btrfs_ioctl_search_args args{};
  uint64_t from = first;
  while (limit > 0) {
    args.key = {};
    args.key.tree_id = tree;
    args.key.min_objectid = args.key.max_objectid = objectid;
    args.key.min_type = args.key.max_type = type;
    args.key.min_offset = from;
    args.key.max_offset = last;
    args.key.max_transid = UINT64_MAX;
    args.key.nr_items = limit;
    if (::ioctl(fd, BTRFS_IOC_TREE_SEARCH, &args) != 0) {
      return errno_error("searching btrfs tree {} for items ({}, {}, {}..{})", tree, objectid, type,
                         from, last);
    }
    if (args.key.nr_items == 0) return {};
    size_t at = 0;
    uint64_t offset = 0;
    for (uint32_t item = 0; item < args.key.nr_items; ++item) {
      btrfs_ioctl_search_header header{};
      std::memcpy(&header, args.buf + at, sizeof header);
      at += sizeof header;
      offset = header.offset;
      visit(offset, std::string_view(args.buf + at, header.len));
      at += header.len;
    }
    limit -= std::min(limit, args.key.nr_items);
    if (offset >= last) return {};
    from = offset + 1;
  }
  return {};
}

uint64_t little_endian_at(std::string_view data, size_t at) {
  uint64_t value = 0;
  if (data.size() >= at + sizeof value) std::memcpy(&value, data.data() + at, sizeof value);
  return le64toh(value);
}

// Whether qgroup 0/`qgroup` still counts bytes (referenced or exclusive). Deleting one that does
// marks every qgroup of the filesystem inconsistent (Linux 6.8 and later: "to be deleted qgroup
// has non-zero numbers"), and from then on the kernel stops accounting, so no sandbox's disk
// limit holds until a rescan. A subvolume that shared extents with a snapshot counts them for a
// while after it is gone; the kernel deletes its qgroup itself once it no longer does.
bool qgroup_counts(int fd, uint64_t qgroup) {
  bool counts = true;
  auto searched =
      search_tree(fd, BTRFS_QUOTA_TREE_OBJECTID, 0, BTRFS_QGROUP_INFO_KEY, qgroup, qgroup,
                  [&](uint64_t, std::string_view item) {
                    counts = little_endian_at(item, offsetof(btrfs_qgroup_info_item, rfer)) != 0 ||
                             little_endian_at(item, offsetof(btrfs_qgroup_info_item, excl)) != 0;
                  });
  return !searched || counts;
}

// Deletes the level-0 qgroups whose subvolume no longer exists and returns how many, as `btrfs
// qgroup clear-stale` does, in this process: running btrfs-progs for it (a fork and exec of
// another program, and its own start) took longer than the rest of opening the volume. A
// subvolume exists while its root item does (newer btrfs-progs judge by that too): one deleted
// but still being cleaned up has it, and its qgroup goes with it. A qgroup that still counts
// bytes is kept even so (qgroup_counts).
Result<int> remove_stale_qgroups(const std::filesystem::path& mount_point) {
  UniqueFd dir(::open(mount_point.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dir) return errno_error("open '{}'", mount_point.string());
  // Level-0 qgroup ids are the subvolume ids; higher levels have the level above bit 48.
  std::vector<uint64_t> candidates;
  RETURN_IF_ERROR(search_tree(
      dir.get(), BTRFS_QUOTA_TREE_OBJECTID, 0, BTRFS_QGROUP_INFO_KEY, 0, (1ULL << 48) - 1,
      [&](uint64_t qgroup, std::string_view item) {
        const bool counts = little_endian_at(item, offsetof(btrfs_qgroup_info_item, rfer)) != 0 ||
                            little_endian_at(item, offsetof(btrfs_qgroup_info_item, excl)) != 0;
        if (!counts) candidates.push_back(qgroup);
      }));
  int removed = 0;
  for (uint64_t qgroup : candidates) {
    bool exists = false;
    RETURN_IF_ERROR(search_tree(
        dir.get(), BTRFS_ROOT_TREE_OBJECTID, qgroup, BTRFS_ROOT_ITEM_KEY, 0, UINT64_MAX,
        [&](uint64_t, std::string_view) { exists = true; }, 1));
    if (exists) continue;
    btrfs_ioctl_qgroup_create_args remove{};
    remove.create = 0;
    remove.qgroupid = qgroup;
    if (::ioctl(dir.get(), BTRFS_IOC_QGROUP_CREATE, &remove) != 0) {
      spdlog::debug("deleting stale qgroup 0/{} on '{}': {}", qgroup, mount_point.string(),
                    strerrordesc_np(errno));
      continue;
    }
    ++removed;
  }
  return removed;
}

}  // namespace

Result<SandboxVolume> SandboxVolume::open(const std::filesystem::path& state_dir,
                                          uint64_t volume_bytes) {
  auto mount_point = state_dir / "sandboxes";
  auto opened = [&](std::filesystem::path backing) -> Result<SandboxVolume> {
    ASSIGN_OR_RETURN(auto devices, block_devices(mount_point));
    // A process that died between deleting a subvolume and its qgroup left the qgroup (newer
    // kernels remove it with the subvolume): sweep such leftovers once per process.
    if (auto swept = remove_stale_qgroups(mount_point); !swept) {
      spdlog::debug("removing stale qgroups: {}", swept.error().message);
    } else if (*swept > 0) {
      spdlog::debug("removed {} stale qgroup{}", *swept, *swept == 1 ? "" : "s");
    }
    return SandboxVolume(mount_point, std::move(backing), std::move(devices));
  };
  if (is_btrfs(state_dir)) {
    RETURN_IF_ERROR(make_directories(mount_point, 0700));
    RETURN_IF_ERROR(enable_quota(mount_point));
    return opened({});
  }
  auto backing = state_dir / "sandboxes.btrfs";
  // A volume_size made larger since the volume was made grows it (a smaller one leaves it).
  const auto too_small = [&] {
    std::error_code error;
    const auto size = std::filesystem::file_size(backing, error);
    return !error && size < volume_bytes;
  };
  const auto mounted = [&] { return is_mount_point(mount_point) && is_btrfs(mount_point); };
  if (mounted() && !too_small()) return opened(backing);

  // First use (or after a reboot, or to grow): one process at a time sets the volume up.
  RETURN_IF_ERROR(make_directories(state_dir, 0755));
  auto lock_path = state_dir / "sandboxes.lock";
  UniqueFd lock(::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
  if (!lock) return errno_error("open '{}'", lock_path.string());
  if (::flock(lock.get(), LOCK_EX) != 0) return errno_error("flock '{}'", lock_path.string());
  if (!mounted()) {
    RETURN_IF_ERROR(make_directories(mount_point, 0700));
    if (!std::filesystem::exists(backing)) {
      RETURN_IF_ERROR(make_backing_file(backing, volume_bytes));
    }
    RETURN_IF_ERROR(loop_mount(backing, mount_point));
    RETURN_IF_ERROR(enable_quota(mount_point));
    // Sandboxes hold the data exported into them: no other host user may look in.
    if (::chmod(mount_point.c_str(), 0700) != 0)
      return errno_error("chmod '{}'", mount_point.string());
  }
  if (too_small()) RETURN_IF_ERROR(grow_volume(backing, mount_point, volume_bytes));
  return opened(backing);
}

Result<SandboxDirectory> SandboxVolume::create(std::string_view id, uint64_t limit_bytes,
                                               uint32_t root_uid) const {
  UniqueFd volume(::open(mount_point_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!volume) return errno_error("open '{}'", mount_point_.string());
  btrfs_ioctl_vol_args create{};
  std::strncpy(create.name, std::string(id).c_str(), BTRFS_PATH_NAME_MAX);
  if (::ioctl(volume.get(), BTRFS_IOC_SUBVOL_CREATE, &create) != 0) {
    if (errno == EEXIST) return make_error(ErrorCode::kAlreadyExists, "sandbox {} exists", id);
    return errno_error("creating btrfs subvolume '{}' in '{}'", id, mount_point_.string());
  }
  auto dir = mount_point_ / id;
  auto made = fill_subvolume(dir, limit_bytes, root_uid);
  if (!made) (void)remove(id, 0);
  return made;
}

Result<void> SandboxVolume::remove(std::string_view id, uint64_t qgroup) const {
  return delete_subvolume(mount_point_, id, qgroup);
}

Result<void> SandboxVolume::delete_subvolume(const std::filesystem::path& parent,
                                             std::string_view name, uint64_t qgroup) {
  auto dir = parent / name;
  if (!std::filesystem::exists(dir)) return {};
  UniqueFd volume(::open(parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!volume) return errno_error("open '{}'", parent.string());
  // A record saved before its qgroup was known (or a half-made subvolume) does not name it:
  // the subvolume does.
  if (qgroup == 0) {
    if (UniqueFd subvolume(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)); subvolume) {
      if (auto id_of = subvolume_id(subvolume.get(), dir)) qgroup = *id_of;
    }
  }
  btrfs_ioctl_vol_args destroy{};
  std::strncpy(destroy.name, std::string(name).c_str(), BTRFS_PATH_NAME_MAX);
  // EBUSY while the sandbox's mount namespace is still being torn down; it takes moments.
  for (int attempt = 0;; ++attempt) {
    if (::ioctl(volume.get(), BTRFS_IOC_SNAP_DESTROY, &destroy) == 0) break;
    if (errno == ENOENT) return {};
    if (errno != EBUSY || attempt >= 200) {
      return errno_error("deleting btrfs subvolume '{}'", dir.string());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (qgroup != 0 && !qgroup_counts(volume.get(), qgroup)) {
    // The qgroup outlives its subvolume until removed; failing here only leaves a stale
    // accounting record, so it is not an error.
    btrfs_ioctl_qgroup_create_args remove{};
    remove.create = 0;
    remove.qgroupid = qgroup;
    ::ioctl(volume.get(), BTRFS_IOC_QGROUP_CREATE, &remove);
  }
  return {};
}

Result<void> SandboxVolume::freeze(std::string_view id, const std::filesystem::path& target) const {
  const auto source_dir = mount_point_ / id;
  UniqueFd source(::open(source_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!source) return errno_error("open '{}'", source_dir.string());
  const auto parent = target.parent_path();
  UniqueFd into(::open(parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!into) return errno_error("open '{}'", parent.string());
  // Read-only from the start: trimming it to upper/ first would cost a second transaction
  // (about as long as the snapshot) to save a few kilobytes.
  btrfs_ioctl_vol_args_v2 args{};
  args.fd = source.get();
  args.flags = BTRFS_SUBVOL_RDONLY;
  std::strncpy(args.name, target.filename().c_str(), BTRFS_SUBVOL_NAME_MAX);
  if (::ioctl(into.get(), BTRFS_IOC_SNAP_CREATE_V2, &args) != 0) {
    return errno_error("snapshotting btrfs subvolume '{}' as '{}'", source_dir.string(),
                       target.string());
  }
  return {};
}

Result<uint64_t> SandboxVolume::referenced_bytes(uint64_t qgroup) const {
  UniqueFd dir(::open(mount_point_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dir) return errno_error("open '{}'", mount_point_.string());
  std::optional<uint64_t> bytes;
  RETURN_IF_ERROR(search_tree(dir.get(), BTRFS_QUOTA_TREE_OBJECTID, 0, BTRFS_QGROUP_INFO_KEY,
                              qgroup, qgroup, [&](uint64_t, std::string_view item) {
                                bytes =
                                    little_endian_at(item, offsetof(btrfs_qgroup_info_item, rfer));
                              }));
  if (!bytes) return make_error(ErrorCode::kNotFound, "no qgroup 0/{}", qgroup);
  return *bytes;
}

Result<void> SandboxVolume::remove_frozen(const std::filesystem::path& layer) const {
  return delete_subvolume(layer.parent_path(), layer.filename().string(), 0);
}

Result<void> SandboxVolume::admit(uint64_t committed_bytes, uint64_t limit_bytes,
                                  double overcommit) const {
  auto space = [](const std::filesystem::path& path) -> Result<struct statvfs> {
    struct statvfs info {};
    if (::statvfs(path.c_str(), &info) != 0) return errno_error("statvfs '{}'", path.string());
    return info;
  };
  auto reserve_of = [](const struct statvfs& host) {
    const uint64_t total = static_cast<uint64_t>(host.f_blocks) * host.f_frsize;
    return std::max<uint64_t>(total / 20, 512 * kMiB);
  };
  auto refuse = [&](const std::string& why) {
    return make_error(ErrorCode::kResourceExhausted,
                      "a sandbox with a {} disk cannot be backed: {}; lower "
                      "sandbox.resources.disk, remove sandboxes that are not needed (quarry "
                      "sandbox ls) or free space on the host",
                      format_size(limit_bytes), why);
  };
  ASSIGN_OR_RETURN(auto volume, space(mount_point_));
  if (backing_.empty()) {
    const uint64_t free = static_cast<uint64_t>(volume.f_bavail) * volume.f_frsize;
    const uint64_t reserve = reserve_of(volume);
    if (limit_bytes + reserve > free) {
      return refuse(fmt::format("{} has {} free, of which {} is kept for the host",
                                mount_point_.string(), format_size(free), format_size(reserve)));
    }
    return {};
  }
  // Sandboxes can together fill the volume file up to their limits: the file may grow by what
  // its filesystem has free, and already holds what it has allocated.
  ASSIGN_OR_RETURN(auto host, space(backing_.parent_path()));
  struct stat file {};
  if (::stat(backing_.c_str(), &file) != 0) return errno_error("stat '{}'", backing_.string());
  const uint64_t host_free = static_cast<uint64_t>(host.f_bavail) * host.f_frsize;
  const uint64_t held = static_cast<uint64_t>(file.st_blocks) * 512;
  const uint64_t reserve = reserve_of(host);
  auto times = [overcommit](uint64_t bytes) {
    return static_cast<uint64_t>(static_cast<double>(bytes) * overcommit);
  };
  const uint64_t backed = times(host_free + held > reserve ? host_free + held - reserve : 0);
  // btrfs keeps some of the volume for its metadata: a tenth is plenty for sandboxes' files.
  const uint64_t volume_size =
      times(static_cast<uint64_t>(volume.f_blocks) * volume.f_frsize / 10 * 9);
  const uint64_t wanted = committed_bytes + limit_bytes;
  if (wanted > volume_size) {
    return refuse(fmt::format(
        "the sandboxes there now may use {} and the volume {} holds {} "
        "(sandbox.local.volume_size, times capacity.overcommit.disk {:g})",
        format_size(committed_bytes), backing_.string(), format_size(volume_size), overcommit));
  }
  if (wanted > backed) {
    return refuse(
        fmt::format("the sandboxes there now may use {}, and {} with the {} free on "
                    "its filesystem can back {} (keeping {} for the host; times "
                    "capacity.overcommit.disk {:g})",
                    format_size(committed_bytes), backing_.string(), format_size(host_free),
                    format_size(backed), format_size(reserve), overcommit));
  }
  return {};
}

}  // namespace quarry::sandbox::local

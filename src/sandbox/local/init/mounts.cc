// The sandbox's filesystem: an overlay of the image and the writable layer, a fresh /proc, a
// minimal /dev, and then pivot_root so the host's filesystem is gone.
#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <filesystem>

#include "sandbox/local/init/steps.h"

namespace quarry::sandbox::local::init {
namespace {

Result<void> mount_fs(const char* source, const std::string& target, const char* type,
                      unsigned long flags, const std::string& options) {
  if (::mount(source, target.c_str(), type, flags, options.empty() ? nullptr : options.c_str()) !=
      0) {
    return errno_error("mount('{}', '{}', '{}', {:#x}, '{}')", source ? source : "", target,
                       type ? type : "", flags, options);
  }
  return {};
}

Result<void> make_dir(const std::string& path, mode_t mode) {
  if (::mkdir(path.c_str(), mode) != 0 && errno != EEXIST) {
    return errno_error("mkdir('{}', {:o})", path, mode);
  }
  return {};
}

// Opens the directory `path` (absolute, as the sandbox sees it) in the sandbox's root, making
// each part that is missing with `mode` and giving it to `owner`, never through a symbolic link
// and never onto anything but a directory. Init is still the host's root here, and names still
// resolve from the host's '/', while the layers of a snapshot hold what code in a sandbox
// wrote: a link it planted (`/home/sandbox/data -> /etc`) must not point init at the host's
// files.
Result<UniqueFd> open_sandbox_directory(int root, const std::string& path, mode_t mode,
                                        uid_t owner) {
  UniqueFd directory(::fcntl(root, F_DUPFD_CLOEXEC, 0));
  if (!directory) return errno_error("dup of the sandbox's root");
  std::string walked;
  for (const auto& part : std::filesystem::path(path).relative_path()) {
    const std::string name = part.string();
    walked += "/" + name;
    const bool made = ::mkdirat(directory.get(), name.c_str(), mode) == 0;
    if (!made && errno != EEXIST) return errno_error("mkdir('{}') in the sandbox", walked);
    open_how how{};
    how.flags = O_RDONLY | O_DIRECTORY | O_CLOEXEC;
    how.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV;
    UniqueFd next(
        static_cast<int>(::syscall(SYS_openat2, directory.get(), name.c_str(), &how, sizeof how)));
    if (!next && (errno == ELOOP || errno == ENOTDIR)) {
      struct stat info {};
      const bool link = ::fstatat(directory.get(), name.c_str(), &info, AT_SYMLINK_NOFOLLOW) == 0 &&
                        S_ISLNK(info.st_mode);
      return make_error(ErrorCode::kFailedPrecondition,
                        "'{}' in the sandbox is {} where quarry makes a directory at every start: "
                        "choose other directories (sandbox.data_dir, sandbox.output_dir), or, if "
                        "the sandbox starts from a snapshot that holds it, remove it in a sandbox "
                        "of that snapshot and take the snapshot again",
                        walked, link ? "a symbolic link" : "not a directory");
    }
    if (!next) return errno_error("opening '{}' in the sandbox", walked);
    if (made && ::fchown(next.get(), owner, owner) != 0) {
      return errno_error("chown('{}') in the sandbox", walked);
    }
    directory = std::move(next);
  }
  return directory;
}

// The same for a directory of the sandbox's root (host id `owner`) that init mounts on.
Result<void> make_mount_point(int root, const std::string& path, mode_t mode, uid_t owner) {
  RETURN_IF_ERROR(open_sandbox_directory(root, path, mode, owner));
  return {};
}

Result<UniqueFd> open_root(const std::string& root_dir) {
  UniqueFd root(::open(root_dir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!root) return errno_error("open('{}')", root_dir);
  return root;
}

struct Device {
  const char* name;
  unsigned major;
  unsigned minor;
};

// What programs expect to open; no disks, no terminals, no kernel interfaces.
constexpr Device kDevices[] = {
    {"null", 1, 3}, {"zero", 1, 5}, {"full", 1, 7}, {"random", 1, 8}, {"urandom", 1, 9},
};

// Everything init creates belongs to the sandbox's root (host id `owner`), as the image does;
// a link itself, not what it points to.
Result<void> give_to_root(const std::string& path, uid_t owner) {
  if (::fchownat(AT_FDCWD, path.c_str(), owner, owner, AT_SYMLINK_NOFOLLOW) != 0) {
    return errno_error("chown('{}')", path);
  }
  return {};
}

Result<void> make_dev(const std::string& dev, uid_t owner) {
  RETURN_IF_ERROR(mount_fs("tmpfs", dev, "tmpfs", MS_NOSUID | MS_NOEXEC,
                           fmt::format("mode=0755,size=64k,nr_inodes=64,uid={0},gid={0}", owner)));
  for (const Device& device : kDevices) {
    std::string path = dev + "/" + device.name;
    if (::mknod(path.c_str(), S_IFCHR | 0666, makedev(device.major, device.minor)) != 0) {
      return errno_error("mknod('{}')", path);
    }
    // mknod applies the umask; the nodes must be usable by the sandbox user.
    if (::chmod(path.c_str(), 0666) != 0) return errno_error("chmod('{}')", path);
    RETURN_IF_ERROR(give_to_root(path, owner));
  }
  const std::pair<const char*, const char*> links[] = {
      {"/proc/self/fd", "fd"},
      {"/proc/self/fd/0", "stdin"},
      {"/proc/self/fd/1", "stdout"},
      {"/proc/self/fd/2", "stderr"},
  };
  for (const auto& [target, name] : links) {
    std::string path = dev + "/" + name;
    if (::symlink(target, path.c_str()) != 0) return errno_error("symlink('{}')", path);
    RETURN_IF_ERROR(give_to_root(path, owner));
  }
  // Python's multiprocessing and some libraries need POSIX shared memory. Its pages are
  // charged to the sandbox's memory limit like any other memory.
  RETURN_IF_ERROR(make_dir(dev + "/shm", 01777));
  return mount_fs("tmpfs", dev + "/shm", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
                  fmt::format("mode=1777,size=256m,uid={0},gid={0}", owner));
}

// The sandbox's own cgroups, read-only, so programs can read their limits. Runs inside the
// cgroup namespace, where each hierarchy's root is the sandbox's cgroup.
Result<void> mount_cgroups(int root_fd, const protocol::Setup& setup) {
  if (setup.cgroup_mounts.empty()) return {};
  const std::string& root = setup.root_dir;
  RETURN_IF_ERROR(make_mount_point(root_fd, "/sys/fs/cgroup", 0755, setup.host_id_base));
  const unsigned long flags = MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC;
  const auto& mounts = setup.cgroup_mounts;
  if (mounts.size() == 1 && mounts[0].target == "/sys/fs/cgroup") {
    return mount_fs(mounts[0].type.c_str(), root + mounts[0].target, mounts[0].type.c_str(), flags,
                    mounts[0].options);
  }
  // v1: a small directory of mount points, made read-only once they are in place.
  const std::string base = root + "/sys/fs/cgroup";
  RETURN_IF_ERROR(
      mount_fs("tmpfs", base, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
               fmt::format("mode=0755,size=16k,nr_inodes=32,uid={0},gid={0}", setup.host_id_base)));
  for (const auto& mount : mounts) {
    RETURN_IF_ERROR(make_dir(root + mount.target, 0555));
    RETURN_IF_ERROR(give_to_root(root + mount.target, setup.host_id_base));
    RETURN_IF_ERROR(mount_fs(mount.type.c_str(), root + mount.target, mount.type.c_str(), flags,
                             mount.options));
    const std::string name = std::filesystem::path(mount.target).filename().string();
    for (const auto& alias : mount.aliases) {
      std::string link = base + "/" + alias;
      if (::symlink(name.c_str(), link.c_str()) != 0) return errno_error("symlink('{}')", link);
      RETURN_IF_ERROR(give_to_root(link, setup.host_id_base));
    }
  }
  return mount_fs(nullptr, base, nullptr,
                  MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "");
}

// The overlay's options show in /proc/self/mountinfo inside, so its layers are named from a
// directory beside the root ("lower", "upper", "work"), which the mount is made from: no host
// path appears in them. "lower" is where the image's idmapped tree (sent by the host) is
// attached, "frozen0", "frozen1", ... the frozen layers' (a snapshot's, top first); "upper" and
// "work" are links.
Result<void> mount_overlay(const protocol::Setup& setup, const std::vector<UniqueFd>& layer_trees) {
  const std::string layers = std::filesystem::path(setup.root_dir).parent_path() / "layers";
  RETURN_IF_ERROR(make_dir(layers, 0700));
  std::string lower_dirs;
  auto attach = [&](int tree, const std::string& name, const std::string& what) -> Result<void> {
    const std::string target = layers + "/" + name;
    RETURN_IF_ERROR(make_dir(target, 0700));
    if (::move_mount(tree, "", AT_FDCWD, target.c_str(), MOVE_MOUNT_F_EMPTY_PATH) != 0) {
      return errno_error("move_mount({}, '{}')", what, target);
    }
    lower_dirs += (lower_dirs.empty() ? "" : ":") + name;
    return {};
  };
  for (size_t layer = 0; layer < setup.frozen_dirs.size(); ++layer) {
    RETURN_IF_ERROR(attach(layer_trees[layer].get(), fmt::format("frozen{}", layer),
                           fmt::format("the frozen layer '{}'", setup.frozen_dirs[layer])));
  }
  RETURN_IF_ERROR(
      attach(layer_trees.back().get(), "lower", fmt::format("the image '{}'", setup.lower_dir)));
  const std::pair<const std::string*, const char*> links[] = {{&setup.upper_dir, "upper"},
                                                              {&setup.work_dir, "work"}};
  for (const auto& [target, name] : links) {
    const std::string link = layers + "/" + name;
    ::unlink(link.c_str());
    if (::symlink(target->c_str(), link.c_str()) != 0) return errno_error("symlink('{}')", link);
  }
  if (::chdir(layers.c_str()) != 0) return errno_error("chdir('{}')", layers);
  // volatile: the writable layer is thrown away with the sandbox, so skip syncing it.
  return mount_fs("overlay", setup.root_dir, "overlay", MS_NOSUID | MS_NODEV,
                  fmt::format("lowerdir={},upperdir=upper,workdir=work,volatile", lower_dirs));
}

// What Docker's default profile masks in /proc: kernel memory, keys, timer and scheduler
// internals (files, covered by /dev/null) and hardware lists (directories, covered by an empty
// read-only tmpfs); and what it makes read-only. /proc/sys stays writable for init, which sets
// its namespace's limits there later; the sandbox user has no capability to write a sysctl.
constexpr const char* kMaskedInProc[] = {"kcore",      "keys",        "latency_stats",
                                         "timer_list", "timer_stats", "sched_debug",
                                         "acpi",       "asound",      "scsi"};
constexpr const char* kReadOnlyInProc[] = {"bus", "fs", "irq", "sysrq-trigger"};

Result<void> mask_proc(const std::string& root) {
  const std::string proc = root + "/proc/";
  for (const char* name : kMaskedInProc) {
    struct stat info {};
    const std::string path = proc + name;
    if (::lstat(path.c_str(), &info) != 0) continue;  // not in this kernel
    if (S_ISDIR(info.st_mode)) {
      RETURN_IF_ERROR(mount_fs("tmpfs", path, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC,
                               "size=4k,nr_inodes=2,mode=0555"));
    } else {
      RETURN_IF_ERROR(mount_fs((root + "/dev/null").c_str(), path, nullptr, MS_BIND, ""));
    }
  }
  for (const char* name : kReadOnlyInProc) {
    const std::string path = proc + name;
    if (::access(path.c_str(), F_OK) != 0) continue;
    RETURN_IF_ERROR(mount_fs(path.c_str(), path, nullptr, MS_BIND | MS_REC, ""));
    RETURN_IF_ERROR(mount_fs(nullptr, path, nullptr,
                             MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC,
                             ""));
  }
  return {};
}

}  // namespace

Result<void> mount_root_filesystem(const protocol::Setup& setup,
                                   const std::vector<UniqueFd>& layer_trees) {
  // Nothing mounted below may propagate back to the host's mount namespace.
  RETURN_IF_ERROR(mount_fs(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, ""));
  RETURN_IF_ERROR(mount_overlay(setup, layer_trees));
  const std::string& root = setup.root_dir;
  const uid_t owner = setup.host_id_base;
  // Checked to be directories, not links, before anything is mounted on them by name: nothing
  // else writes to the sandbox's layer until init is done.
  ASSIGN_OR_RETURN(UniqueFd root_fd, open_root(root));
  RETURN_IF_ERROR(make_mount_point(root_fd.get(), "/proc", 0555, owner));
  RETURN_IF_ERROR(mount_fs("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, ""));
  RETURN_IF_ERROR(make_mount_point(root_fd.get(), "/dev", 0755, owner));
  RETURN_IF_ERROR(make_dev(root + "/dev", owner));
  RETURN_IF_ERROR(mask_proc(root));
  RETURN_IF_ERROR(mount_cgroups(root_fd.get(), setup));
  ASSIGN_OR_RETURN(UniqueFd tmp, open_sandbox_directory(root_fd.get(), "/tmp", 01777, owner));
  struct stat info {};
  if (::fstat(tmp.get(), &info) == 0 && (info.st_mode & 07777) == 01777) return {};
  if (::fchmod(tmp.get(), 01777) != 0) return errno_error("chmod('{}/tmp')", root);
  return {};
}

Result<void> make_user_directories(const protocol::Setup& setup) {
  const uid_t owner = setup.host_id_base + setup.user_id;
  const gid_t group = setup.host_id_base + setup.group_id;
  std::vector<std::string> directories = {setup.home};
  directories.insert(directories.end(), setup.directories.begin(), setup.directories.end());
  ASSIGN_OR_RETURN(UniqueFd root, open_root(setup.root_dir));
  for (const std::string& directory : directories) {
    // Parents that do not exist yet belong to the sandbox's root; the directory to the user.
    ASSIGN_OR_RETURN(UniqueFd opened,
                     open_sandbox_directory(root.get(), directory, 0755, setup.host_id_base));
    // Unless it is theirs already: changing what the image has copies it up into the writable
    // layer, a write to the sandbox's disk for nothing.
    struct stat info {};
    if (::fstat(opened.get(), &info) == 0 && info.st_uid == owner && info.st_gid == group) {
      continue;
    }
    if (::fchown(opened.get(), owner, group) != 0) return errno_error("chown('{}')", directory);
  }
  return {};
}

Result<void> pivot_into_root(const std::string& root_dir) {
  if (::chdir(root_dir.c_str()) != 0) return errno_error("chdir('{}')", root_dir);
  // pivot_root(".", ".") stacks the old root on top of the new one; detaching it leaves only
  // the sandbox's filesystem, with no directory through which the host's could be reached.
  if (::syscall(SYS_pivot_root, ".", ".") != 0) return errno_error("pivot_root('{}')", root_dir);
  if (::umount2(".", MNT_DETACH) != 0) return errno_error("umount2(old root)");
  if (::chdir("/") != 0) return errno_error("chdir('/')");
  return {};
}

}  // namespace quarry::sandbox::local::init

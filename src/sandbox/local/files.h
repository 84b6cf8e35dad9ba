// File access from the host into a running sandbox's filesystem. Every path is resolved by
// the kernel inside the sandbox's root (openat2 with RESOLVE_IN_ROOT / RESOLVE_BENEATH), no
// symlink is followed and no mount is crossed, so nothing the sandbox creates (a symlink to
// /etc/shadow, a '..', a FIFO) can make the host touch its own files or hang.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <iosfwd>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.h"
#include "common/unique_fd.h"
#include "sandbox/provider.h"

namespace quarry::sandbox::local {

// Bounds on listing a directory tree that a sandbox controls.
struct ListLimits {
  size_t max_entries = 10000;  // files and directories
  size_t max_depth = 32;       // directory levels below the one listed
  size_t max_path = 1024;      // bytes of a listed path
  std::chrono::milliseconds max_time{5000};
};

// Makes `path` absolute (relative paths are taken from `home`) and normal; refuses '..', empty
// or overlong paths and NUL bytes, with a message that says what was wrong.
Result<std::string> normalize_sandbox_path(std::string_view path, std::string_view home);

class SandboxFiles {
 public:
  // Opens the root of the sandbox whose init is `init_pid` (and still alive behind `pidfd`).
  static Result<SandboxFiles> open(pid_t init_pid, int pidfd);
  // Treats `root` as the sandbox's root (for tests, and for stopped sandboxes' layers).
  static Result<SandboxFiles> open_directory(const std::filesystem::path& root);

  // Creates missing parent directories; new files and directories belong to owner:group. Stops
  // with kCancelled, leaving what was there, once `cancel_fd` (-1: none) is readable.
  Result<void> write(const std::string& path, std::istream& content, uid_t owner, gid_t group,
                     int cancel_fd = -1) const;
  // mkdir -p; new directories belong to owner:group.
  Result<void> make_directories(const std::string& path, uid_t owner, gid_t group) const;
  // Stops with kCancelled once `cancel_fd` (-1: none) is readable.
  Result<uint64_t> read(const std::string& path, std::ostream& out, uint64_t max_bytes,
                        int cancel_fd = -1) const;
  // Whether `path` is a directory: false where nothing is, or a file, link or special file.
  Result<bool> is_directory(const std::string& path) const;
  // Regular files and directories below `directory`, sorted by path; symlinks and special
  // files are left out. The sandbox decides what is there, so the walk is bounded (a deep chain
  // of long names, a wide tree, a directory that keeps growing): past a bound it fails with
  // kResourceExhausted naming it. At most two descriptors are open at any time.
  Result<std::vector<FileInfo>> list(const std::string& directory,
                                     const ListLimits& limits = {}) const;

 private:
  explicit SandboxFiles(UniqueFd root) : root_(std::move(root)) {}
  // Opens `directory` (absolute), creating what is missing.
  Result<UniqueFd> walk_to(const std::string& directory, uid_t owner, gid_t group) const;
  UniqueFd root_;
};

}  // namespace quarry::sandbox::local

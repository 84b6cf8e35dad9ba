#include "sandbox/local/files.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <filesystem>
#include <istream>
#include <memory>
#include <ostream>

#include "common/file_util.h"
#include "common/random_id.h"
#include "sandbox/local/spawn.h"

namespace quarry::sandbox::local {
namespace {

constexpr size_t kMaxPath = 4096;
constexpr uint64_t kSafeResolve = RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV;

int open_in(int dirfd, const std::string& path, uint64_t flags, mode_t mode, uint64_t resolve) {
  open_how how{};
  how.flags = flags;
  how.mode = flags & O_CREAT ? mode : 0;
  how.resolve = resolve;
  return static_cast<int>(::syscall(SYS_openat2, dirfd, path.c_str(), &how, sizeof how));
}

// Turns an openat2 failure into a message about the sandbox path, not about the syscall.
std::unexpected<Error> resolve_error(const std::string& path) {
  switch (errno) {
    case ELOOP:
      return make_error(ErrorCode::kPermissionDenied,
                        "'{}' is, or goes through, a symbolic link; quarry does not follow links "
                        "inside a sandbox",
                        path);
    case EXDEV:
      return make_error(ErrorCode::kPermissionDenied,
                        "'{}' is not on the sandbox's own filesystem (e.g. /proc or /dev)", path);
    case ENOENT:
      return make_error(ErrorCode::kNotFound, "'{}' does not exist in the sandbox", path);
    case ENOTDIR:
      return make_error(ErrorCode::kInvalidArgument, "a parent of '{}' is not a directory", path);
    case ENXIO:
      return make_error(ErrorCode::kInvalidArgument, "'{}' is not a regular file", path);
    default:
      return errno_error("opening '{}' in the sandbox", path);
  }
}

std::string relative(const std::string& absolute) {
  return absolute.substr(1);
}

}  // namespace

Result<std::string> normalize_sandbox_path(std::string_view path, std::string_view home) {
  if (path.empty()) return make_error(ErrorCode::kInvalidArgument, "the path is empty");
  if (path.size() > kMaxPath) {
    return make_error(ErrorCode::kInvalidArgument, "the path is longer than {} bytes", kMaxPath);
  }
  if (path.find('\0') != std::string_view::npos) {
    return make_error(ErrorCode::kInvalidArgument, "the path contains a NUL byte");
  }
  std::filesystem::path full =
      path.front() == '/' ? std::filesystem::path(path) : std::filesystem::path(home) / path;
  for (const auto& part : full) {
    if (part == "..") {
      return make_error(ErrorCode::kInvalidArgument,
                        "'{}' contains '..'; give the path inside the sandbox without it", path);
    }
  }
  std::string normal = full.lexically_normal().string();
  while (normal.size() > 1 && normal.back() == '/')
    normal.pop_back();
  return normal;
}

Result<SandboxFiles> SandboxFiles::open(pid_t init_pid, int pidfd) {
  std::string proc_root = fmt::format("/proc/{}/root", init_pid);
  UniqueFd root(::open(proc_root.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!root || process_exited(pidfd)) {
    return make_error(ErrorCode::kUnavailable, "the sandbox is not running");
  }
  return SandboxFiles(std::move(root));
}

Result<SandboxFiles> SandboxFiles::open_directory(const std::filesystem::path& root) {
  UniqueFd fd(::open(root.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!fd) return errno_error("open '{}'", root.string());
  return SandboxFiles(std::move(fd));
}

Result<UniqueFd> SandboxFiles::walk_to(const std::string& directory, uid_t owner,
                                       gid_t group) const {
  // One component at a time, so each new directory can be given to the user and each step is
  // confined below the one before it.
  UniqueFd current(::fcntl(root_.get(), F_DUPFD_CLOEXEC, 0));
  if (!current) return errno_error("fcntl(F_DUPFD_CLOEXEC)");
  std::string walked;
  for (const auto& part : std::filesystem::path(directory).relative_path()) {
    const std::string name = part.string();
    walked += "/" + name;
    int next = open_in(current.get(), name, O_PATH | O_DIRECTORY | O_CLOEXEC, 0,
                       RESOLVE_BENEATH | kSafeResolve);
    bool made = false;
    if (next < 0 && errno == ENOENT) {
      made = ::mkdirat(current.get(), name.c_str(), 0755) == 0;
      if (!made && errno != EEXIST) {
        if (errno == EDQUOT || errno == ENOSPC) {
          return make_error(ErrorCode::kResourceExhausted,
                            "creating '{}' failed: the sandbox's disk is full", walked);
        }
        return errno_error("creating directory '{}' in the sandbox", walked);
      }
      next = open_in(current.get(), name, O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0,
                     RESOLVE_BENEATH | kSafeResolve);
    }
    if (next < 0) return resolve_error(walked);
    current.reset(next);
    // Given to the user through the descriptor, never by name: the sandbox may have swapped
    // the name for something else meanwhile. A directory host root did not just make (it would
    // own it) is left as it is.
    struct stat info {};
    if (made && ::fstat(current.get(), &info) == 0 && info.st_uid == ::geteuid() &&
        ::fchown(current.get(), owner, group) != 0) {
      return errno_error("chown '{}'", walked);
    }
  }
  return current;
}

Result<void> SandboxFiles::make_directories(const std::string& path, uid_t owner,
                                            gid_t group) const {
  ASSIGN_OR_RETURN(UniqueFd ignored, walk_to(path, owner, group));
  return {};
}

Result<void> SandboxFiles::write(const std::string& path, std::istream& content, uid_t owner,
                                 gid_t group, int cancel_fd) const {
  std::filesystem::path target(path);
  if (target == "/") return make_error(ErrorCode::kInvalidArgument, "'/' is a directory");
  ASSIGN_OR_RETURN(UniqueFd directory, walk_to(target.parent_path().string(), owner, group));
  const std::string name = target.filename().string();
  // Only a regular file is replaced: a symlink is not followed (as for reads), and a
  // directory, FIFO or device node is not a file to write.
  struct stat existing {};
  if (::fstatat(directory.get(), name.c_str(), &existing, AT_SYMLINK_NOFOLLOW) == 0) {
    if (S_ISLNK(existing.st_mode)) {
      errno = ELOOP;
      return resolve_error(path);
    }
    if (!S_ISREG(existing.st_mode)) {
      return make_error(ErrorCode::kInvalidArgument, "'{}' exists and is not a regular file", path);
    }
  }
  // The content goes to a new file beside the target, renamed over it once complete: a
  // failure (a full disk, a broken stream) leaves the old file as it was. Its name is random
  // and it must not exist yet (O_EXCL), so nothing the sandbox plants can stand in for it.
  std::string temp;
  UniqueFd file;
  for (int attempt = 0; attempt < 8 && !file; ++attempt) {
    temp = fmt::format(".{}.quarry-{}", name.substr(0, 200), random_id());
    file.reset(open_in(directory.get(), temp,
                       O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644,
                       RESOLVE_BENEATH | kSafeResolve));
    if (!file && errno != EEXIST) break;
  }
  if (!file) return resolve_error(path);
  auto discard = [&](std::unexpected<Error> error) {
    ::unlinkat(directory.get(), temp.c_str(), 0);
    return error;
  };
  if (::fchown(file.get(), owner, group) != 0) return discard(errno_error("chown '{}'", path));

  char buffer[64 * 1024];
  while (content) {
    if (signalled(cancel_fd)) {
      return discard(make_error(ErrorCode::kCancelled,
                                "cancelled while writing '{}'; nothing was written", path));
    }
    content.read(buffer, sizeof buffer);
    std::streamsize count = content.gcount();
    const char* data = buffer;
    while (count > 0) {
      ssize_t n = ::write(file.get(), data, static_cast<size_t>(count));
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EDQUOT || errno == ENOSPC) {
          return discard(make_error(ErrorCode::kResourceExhausted,
                                    "writing '{}' would fill the sandbox's disk; nothing was "
                                    "written",
                                    path));
        }
        return discard(errno_error("writing '{}' in the sandbox", path));
      }
      data += n;
      count -= n;
    }
  }
  if (content.bad()) {
    return discard(make_error(ErrorCode::kInternal, "reading the content for '{}' failed", path));
  }
  if (::renameat(directory.get(), temp.c_str(), directory.get(), name.c_str()) != 0) {
    return discard(errno_error("renaming '{}' into place", path));
  }
  return {};
}

Result<bool> SandboxFiles::is_directory(const std::string& path) const {
  const std::string inside = relative(path);
  UniqueFd directory(open_in(root_.get(), inside.empty() ? "." : inside,
                             O_PATH | O_DIRECTORY | O_CLOEXEC, 0, RESOLVE_IN_ROOT | kSafeResolve));
  if (directory) return true;
  if (errno == ENOENT || errno == ENOTDIR || errno == ELOOP) return false;
  return resolve_error(path);
}

Result<uint64_t> SandboxFiles::read(const std::string& path, std::ostream& out, uint64_t max_bytes,
                                    int cancel_fd) const {
  UniqueFd file(open_in(root_.get(), relative(path), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC,
                        0, RESOLVE_IN_ROOT | kSafeResolve));
  if (!file) return resolve_error(path);
  struct stat info {};
  if (::fstat(file.get(), &info) != 0) return errno_error("stat '{}'", path);
  if (S_ISDIR(info.st_mode)) {
    return make_error(ErrorCode::kInvalidArgument, "'{}' is a directory", path);
  }
  if (!S_ISREG(info.st_mode)) {
    return make_error(ErrorCode::kInvalidArgument, "'{}' is not a regular file", path);
  }
  if (static_cast<uint64_t>(info.st_size) > max_bytes) {
    return make_error(ErrorCode::kResourceExhausted, "'{}' is {} bytes, over the {} byte limit",
                      path, info.st_size, max_bytes);
  }
  uint64_t total = 0;
  char buffer[64 * 1024];
  while (true) {
    if (signalled(cancel_fd)) {
      return make_error(ErrorCode::kCancelled, "cancelled while reading '{}'", path);
    }
    ssize_t n = ::read(file.get(), buffer, sizeof buffer);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno_error("reading '{}' in the sandbox", path);
    }
    if (n == 0) break;
    total += static_cast<uint64_t>(n);
    // The file may grow while we read (the sandbox is running); stop at the limit.
    if (total > max_bytes) {
      return make_error(ErrorCode::kResourceExhausted, "'{}' grew over the {} byte limit", path,
                        max_bytes);
    }
    out.write(buffer, n);
  }
  return total;
}

Result<std::vector<FileInfo>> SandboxFiles::list(const std::string& directory,
                                                 const ListLimits& limits) const {
  const auto deadline = std::chrono::steady_clock::now() + limits.max_time;
  auto exhausted = [&](std::string_view what) {
    return make_error(ErrorCode::kResourceExhausted,
                      "'{}' {}; quarry lists at most {} entries, {} levels deep, paths of {} "
                      "bytes: remove what is not needed there",
                      directory, what, limits.max_entries, limits.max_depth, limits.max_path);
  };
  std::vector<FileInfo> entries;
  // Directories still to read, by path and depth: each is opened when its turn comes (from
  // the root, confined as every path is), so the walk holds one descriptor however wide the
  // tree. A directory swapped for a link meanwhile is refused by openat2 and left out.
  std::vector<std::pair<std::string, size_t>> pending = {{directory, 0}};
  while (!pending.empty()) {
    auto [path, depth] = std::move(pending.back());
    pending.pop_back();
    const std::string inside = relative(path);
    UniqueFd fd(open_in(root_.get(), inside.empty() ? "." : inside,
                        O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0, RESOLVE_IN_ROOT | kSafeResolve));
    if (!fd) {
      if (depth == 0) return resolve_error(directory);
      continue;
    }
    DIR* stream = ::fdopendir(fd.get());
    if (!stream) return errno_error("reading directory '{}'", path);
    fd.release();
    std::unique_ptr<DIR, int (*)(DIR*)> closer(stream, ::closedir);
    const std::string prefix = path == "/" ? "" : path;
    while (dirent* entry = ::readdir(stream)) {
      std::string_view name = entry->d_name;
      if (name == "." || name == "..") continue;
      if (std::chrono::steady_clock::now() > deadline) {
        return exhausted(fmt::format("took longer than {} ms to list", limits.max_time.count()));
      }
      struct stat info {};
      if (::fstatat(::dirfd(stream), entry->d_name, &info, AT_SYMLINK_NOFOLLOW) != 0) continue;
      if (!S_ISREG(info.st_mode) && !S_ISDIR(info.st_mode)) continue;
      if (entries.size() >= limits.max_entries) {
        return exhausted(fmt::format("holds more than {} entries", limits.max_entries));
      }
      FileInfo file;
      file.path = fmt::format("{}/{}", prefix, name);
      if (file.path.size() > limits.max_path) {
        return exhausted(fmt::format("holds a path longer than {} bytes", limits.max_path));
      }
      file.is_directory = S_ISDIR(info.st_mode);
      if (!file.is_directory) {
        file.size = static_cast<uint64_t>(info.st_size);
        file.allocated = static_cast<uint64_t>(info.st_blocks) * 512;
        file.links = info.st_nlink;
      }
      file.modified_at = std::chrono::system_clock::time_point(
          std::chrono::seconds(info.st_mtim.tv_sec) +
          std::chrono::duration_cast<std::chrono::system_clock::duration>(
              std::chrono::nanoseconds(info.st_mtim.tv_nsec)));
      if (file.is_directory) {
        if (depth + 1 > limits.max_depth) {
          return exhausted(fmt::format("is more than {} levels deep", limits.max_depth));
        }
        pending.emplace_back(file.path, depth + 1);
      }
      entries.push_back(std::move(file));
    }
  }
  std::sort(entries.begin(), entries.end(),
            [](const FileInfo& a, const FileInfo& b) { return a.path < b.path; });
  return entries;
}

}  // namespace quarry::sandbox::local

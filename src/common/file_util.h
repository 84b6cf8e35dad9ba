// Small file helpers with errors that name the path: whole-file reads, atomic writes, and the
// one-line writes used for /proc and cgroup control files.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <string_view>
#include <utility>

#include "common/error.h"

namespace quarry {

Result<std::string> read_file(const std::filesystem::path& path);

// Waits up to `timeout` for `fd` to become readable (a cancel fd being signalled); whether it
// did. With -1 it only waits.
bool signalled_within(int fd, std::chrono::milliseconds timeout);
// Whether `fd` is readable now, without waiting. False for -1.
inline bool signalled(int fd) {
  return signalled_within(fd, std::chrono::milliseconds(0));
}

// Writes `content` to a temporary file beside `path` and renames it over `path`, so readers see
// the old or the new content, never a torn one. No fsync: this protects against a crashed
// process, not a crashed host.
Result<void> write_file_atomic(const std::filesystem::path& path, std::string_view content,
                               mode_t mode = 0644);

// Where a command writes the output file a user named `path`: what a symbolic link there names
// (as cp writes through one), and whether a rename may replace it. A device or a pipe
// (/dev/null, /dev/stdout) may not: it is written into.
struct OutputFile {
  std::filesystem::path path;
  bool in_place = false;
};
OutputFile output_file(const std::filesystem::path& path);

// Has `write` make a file at `path`.quarry-partial and renames that over `path` once `write`
// succeeded; a failed write removes it, so what was at `path` stays. For writers that make the
// file themselves (an export, a copy streamed out of a sandbox), to a path the user named: see
// output_file. `write` returns a Result.
template <typename Write>
auto write_then_rename(const std::filesystem::path& path, Write&& write) -> decltype(write(path)) {
  const auto output = output_file(path);
  if (output.in_place) return write(output.path);
  std::filesystem::path partial = output.path;
  partial += ".quarry-partial";
  auto written = write(partial);
  std::error_code renamed;
  if (written) std::filesystem::rename(partial, output.path, renamed);
  if (written && !renamed) return written;
  std::error_code ignored;
  std::filesystem::remove(partial, ignored);
  if (!written) return written;
  return std::unexpected(
      Error{ErrorCode::kInternal,
            fmt::format("writing '{}' failed: {}", path.string(), renamed.message())});
}

// Writes `content` to `path` (created with `mode`, or truncated) in place.
Result<void> write_file(const std::filesystem::path& path, std::string_view content,
                        mode_t mode = 0644);

// Opens an existing file and writes `content` in one write(2), as control files require.
Result<void> write_control_file(const std::filesystem::path& path, std::string_view content);

// mkdir -p with a mode for the directories it creates.
Result<void> make_directories(const std::filesystem::path& path, mode_t mode = 0755);

// rm -rf that never follows symlinks; a missing path is not an error.
Result<void> remove_tree(const std::filesystem::path& path);

// A directory tree that is removed (remove_tree) when this goes out of scope, unless released:
// work in progress that a failure must not leave behind.
class ScopedTree {
 public:
  explicit ScopedTree(std::filesystem::path path) : path_(std::move(path)) {}
  ScopedTree(ScopedTree&& other) noexcept : path_(std::exchange(other.path_, {})) {}
  ScopedTree& operator=(ScopedTree&&) = delete;
  ~ScopedTree() {
    if (!path_.empty()) (void)remove_tree(path_);
  }
  const std::filesystem::path& path() const { return path_; }
  // Keeps the tree.
  void release() { path_.clear(); }

 private:
  std::filesystem::path path_;
};

// The running executable's path (/proc/self/exe), which programs installed beside it are found
// from; empty if it cannot be read.
std::filesystem::path this_executable();

}  // namespace quarry

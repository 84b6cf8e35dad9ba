#include "common/file_util.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/random_id.h"
#include "common/unique_fd.h"

namespace quarry {

bool signalled_within(int fd, std::chrono::milliseconds timeout) {
  pollfd poll{fd, POLLIN, 0};
  return ::poll(&poll, fd >= 0 ? 1 : 0, static_cast<int>(timeout.count())) > 0 &&
         (poll.revents & POLLIN) != 0;
}

Result<std::string> read_file(const std::filesystem::path& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return errno_error("open '{}'", path.string());
  std::string content;
  char buffer[8192];
  while (true) {
    ssize_t n = ::read(fd.get(), buffer, sizeof buffer);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno_error("read '{}'", path.string());
    }
    if (n == 0) break;
    content.append(buffer, static_cast<size_t>(n));
  }
  return content;
}

namespace {

Result<void> write_all(int fd, std::string_view content, const std::filesystem::path& path) {
  while (!content.empty()) {
    ssize_t n = ::write(fd, content.data(), content.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno_error("write '{}'", path.string());
    }
    content.remove_prefix(static_cast<size_t>(n));
  }
  return {};
}

}  // namespace

Result<void> write_file_atomic(const std::filesystem::path& path, std::string_view content,
                               mode_t mode) {
  std::filesystem::path temp = path;
  temp += fmt::format(".tmp{:x}", random_bits());
  {
    UniqueFd fd(::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode));
    if (!fd) return errno_error("writing '{}'", path.string());
    if (auto written = write_all(fd.get(), content, temp); !written) {
      ::unlink(temp.c_str());
      return written;
    }
  }
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    auto error = errno_error("rename '{}' to '{}'", temp.string(), path.string());
    ::unlink(temp.c_str());
    return error;
  }
  return {};
}

OutputFile output_file(const std::filesystem::path& path) {
  std::error_code error;
  OutputFile output{path};
  if (std::filesystem::is_symlink(std::filesystem::symlink_status(path, error))) {
    // A link to nothing yet is made at what it names, as cp does.
    const auto named = std::filesystem::weakly_canonical(path, error);
    if (!error) output.path = named;
  }
  const auto status = std::filesystem::status(output.path, error);
  output.in_place = std::filesystem::exists(status) && !std::filesystem::is_regular_file(status) &&
                    !std::filesystem::is_directory(status);
  return output;
}

Result<void> write_file(const std::filesystem::path& path, std::string_view content, mode_t mode) {
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode));
  if (!fd) return errno_error("writing '{}'", path.string());
  return write_all(fd.get(), content, path);
}

Result<void> write_control_file(const std::filesystem::path& path, std::string_view content) {
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CLOEXEC));
  if (!fd) return errno_error("open '{}'", path.string());
  ssize_t n = ::write(fd.get(), content.data(), content.size());
  if (n < 0) return errno_error("write '{}' to '{}'", content, path.string());
  return {};
}

Result<void> make_directories(const std::filesystem::path& path, mode_t mode) {
  std::filesystem::path current;
  for (const auto& part : path) {
    current /= part;
    if (::mkdir(current.c_str(), mode) != 0 && errno != EEXIST) {
      return errno_error("mkdir '{}'", current.string());
    }
  }
  return {};
}

Result<void> remove_tree(const std::filesystem::path& path) {
  std::error_code error;
  // Something else removing the same tree at once (another server sharing the state directory)
  // makes an entry vanish under the walk: that is no failure, the rest is removed again.
  for (int attempt = 0; attempt < 3; ++attempt) {
    error.clear();
    std::filesystem::remove_all(path, error);
    if (error != std::errc::no_such_file_or_directory) break;
  }
  if (error && error != std::errc::no_such_file_or_directory) {
    return make_error(ErrorCode::kInternal, "removing '{}' failed: {}", path.string(),
                      error.message());
  }
  return {};
}

std::filesystem::path this_executable() {
  std::error_code error;
  auto path = std::filesystem::read_symlink("/proc/self/exe", error);
  return error ? std::filesystem::path() : path;
}

}  // namespace quarry

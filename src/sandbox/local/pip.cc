#include "sandbox/local/pip.h"

#include <unistd.h>

#include <algorithm>

#include "common/command.h"
#include "common/file_util.h"
#include "common/sha256.h"

namespace quarry::sandbox::local {
namespace {

// What the host's pip needs to fetch wheels for the image rather than for the host: the image's
// Python and platform, wheels only.
std::vector<std::string> pip_target(std::string_view python_version) {
  std::vector<std::string> args = {"--only-binary=:all:", "--python-version",
                                   std::string(python_version), "--implementation", "cp"};
  // manylinux tags up to glibc 2.36 (Debian bookworm's); pip needs each one named.
  args.insert(args.end(), {"--platform", "manylinux2014_x86_64", "--platform",
                           "manylinux2010_x86_64", "--platform", "manylinux1_x86_64"});
  for (int minor = 17; minor <= 36; ++minor) {
    args.insert(args.end(), {"--platform", fmt::format("manylinux_2_{}_x86_64", minor)});
  }
  return args;
}

// Moves the wheels pip left in `from` into `to`.
Result<void> move_wheels(const std::filesystem::path& from, const std::filesystem::path& to) {
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(from, error)) {
    if (entry.path().extension() != ".whl") continue;
    std::filesystem::rename(entry.path(), to / entry.path().filename(), error);
    if (error) {
      return make_error(ErrorCode::kInternal, "moving '{}' into '{}' failed: {}",
                        entry.path().string(), to.string(), error.message());
    }
  }
  if (error) {
    return make_error(ErrorCode::kInternal, "listing '{}' failed: {}", from.string(),
                      error.message());
  }
  return {};
}

// An empty directory of this process's own in `wheels_dir`, removed with the returned guard.
Result<ScopedTree> scratch_directory(const std::filesystem::path& wheels_dir,
                                     std::string_view what) {
  RETURN_IF_ERROR(make_directories(wheels_dir, 0755));
  ScopedTree temp(wheels_dir / fmt::format(".{}-{}", what, ::getpid()));
  RETURN_IF_ERROR(remove_tree(temp.path()));
  RETURN_IF_ERROR(make_directories(temp.path(), 0755));
  return temp;
}

// pip download, its lines shown as progress; its errors name it without the 25 platform tags.
CommandOptions pip_download_options(Progress& progress, int cancel_fd) {
  CommandOptions options;
  options.cancel_fd = cancel_fd;
  options.on_line = [&progress](std::string_view line) { progress.detail(line); };
  options.name = "pip download";
  return options;
}

}  // namespace

Result<std::map<std::string, std::filesystem::path>> fetch_locked_wheels(
    const PythonLock& lock, std::string_view source, std::string_view relock,
    const std::filesystem::path& wheels_dir, Progress& progress, int cancel_fd) {
  RETURN_IF_ERROR(make_directories(wheels_dir, 0755));
  auto wheels = find_locked_wheels(lock, wheels_dir);
  if (!wheels.missing.empty()) {
    // Only the missing ones, each by its pin and hashes: pip resolves nothing and refuses a
    // file whose hash the lock does not list.
    PythonLock missing = lock;
    missing.packages = wheels.missing;
    ASSIGN_OR_RETURN(auto temp, scratch_directory(wheels_dir, "download"));
    RETURN_IF_ERROR(write_file_atomic(temp.path() / "requirements.txt", missing.text(), 0644));
    std::vector<std::string> download = {"python3",
                                         "-m",
                                         "pip",
                                         "download",
                                         "--quiet",
                                         "--no-deps",
                                         "--require-hashes",
                                         "--dest",
                                         temp.path().string(),
                                         "-r",
                                         (temp.path() / "requirements.txt").string()};
    auto target = pip_target(lock.python);
    download.insert(download.end(), target.begin(), target.end());
    auto downloaded = run_command(download, pip_download_options(progress, cancel_fd));
    if (!downloaded && downloaded.error().code == ErrorCode::kCancelled) {
      return std::unexpected(downloaded.error());
    }
    if (!downloaded) {
      return make_error(downloaded.error().code,
                        "downloading the packages of {} that are not in {} failed: {}\nWhere pip "
                        "says a hash does not match, the package index serves another file than "
                        "the one that was locked: if it changed on purpose, {}",
                        source, wheels_dir.string(), downloaded.error().message, relock);
    }
    RETURN_IF_ERROR(move_wheels(temp.path(), wheels_dir));
    wheels = find_locked_wheels(lock, wheels_dir);
  }
  RETURN_IF_ERROR(check_wheels_found(wheels, source, relock));
  return wheels.found;
}

Result<PythonLock> resolve_requirements(const std::vector<std::string>& requirements,
                                        const std::string& python,
                                        const std::vector<std::string>& constraints,
                                        const std::filesystem::path& wheels_dir, Progress& progress,
                                        int cancel_fd) {
  PythonLock lock;
  lock.python = python;
  lock.requirements = requirements;
  std::sort(lock.requirements.begin(), lock.requirements.end());
  if (lock.requirements.empty()) return lock;
  // An empty directory of its own: what pip leaves in it is what it resolved.
  ASSIGN_OR_RETURN(auto temp, scratch_directory(wheels_dir, "lock"));
  std::vector<std::string> download = {
      "python3", "-m", "pip", "download", "--quiet", "--dest", temp.path().string()};
  if (!constraints.empty()) {
    const auto file = temp.path() / "constraints.txt";
    RETURN_IF_ERROR(write_file_atomic(file, fmt::format("{}\n", fmt::join(constraints, "\n"))));
    download.insert(download.end(), {"--constraint", file.string()});
  }
  auto target = pip_target(lock.python);
  download.insert(download.end(), target.begin(), target.end());
  download.insert(download.end(), lock.requirements.begin(), lock.requirements.end());
  RETURN_IF_ERROR(with_context(run_command(download, pip_download_options(progress, cancel_fd)),
                               "resolving the Python packages"));

  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(temp.path(), error)) {
    const std::string filename = entry.path().filename().string();
    if (filename == "constraints.txt") continue;
    auto wheel = parse_wheel_filename(filename);
    if (!wheel) {
      return make_error(ErrorCode::kInternal, "pip left '{}', which is no wheel, in '{}'", filename,
                        temp.path().string());
    }
    if (lock.find(wheel->name)) {
      return make_error(ErrorCode::kInternal, "pip chose two wheels of {} in '{}'", wheel->name,
                        temp.path().string());
    }
    ASSIGN_OR_RETURN(auto content, read_file(entry.path()));
    lock.packages.push_back({wheel->name, wheel->version, {sha256_hex(content)}});
  }
  if (error) {
    return make_error(ErrorCode::kInternal, "listing '{}' failed: {}", temp.path().string(),
                      error.message());
  }
  std::sort(lock.packages.begin(), lock.packages.end(),
            [](const auto& a, const auto& b) { return a.name < b.name; });
  RETURN_IF_ERROR(move_wheels(temp.path(), wheels_dir));
  return lock;
}

}  // namespace quarry::sandbox::local

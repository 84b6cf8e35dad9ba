#include "sandbox/local/cgroup.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstring>
#include <sstream>
#include <thread>

#include "common/file_util.h"

namespace quarry::sandbox::local {
namespace {

std::vector<std::string_view> split(std::string_view text, char separator) {
  std::vector<std::string_view> parts;
  while (true) {
    auto pos = text.find(separator);
    parts.push_back(text.substr(0, pos));
    if (pos == std::string_view::npos) break;
    text.remove_prefix(pos + 1);
  }
  return parts;
}

// mountinfo escapes space, tab, newline and backslash as \ooo.
std::string unescape_mount_path(std::string_view text) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\\' && i + 3 < text.size()) {
      int value = 0;
      auto [end, ec] = std::from_chars(text.data() + i + 1, text.data() + i + 4, value, 8);
      if (ec == std::errc() && end == text.data() + i + 4) {
        out.push_back(static_cast<char>(value));
        i += 3;
        continue;
      }
    }
    out.push_back(text[i]);
  }
  return out;
}

bool has(const std::vector<std::string>& items, std::string_view item) {
  return std::find(items.begin(), items.end(), item) != items.end();
}

}  // namespace

std::vector<CgroupMount> parse_cgroup_mounts(std::string_view mountinfo) {
  std::vector<CgroupMount> mounts;
  for (std::string_view line : split(mountinfo, '\n')) {
    if (line.empty()) continue;
    auto separator = line.find(" - ");
    if (separator == std::string_view::npos) continue;
    auto before = split(line.substr(0, separator), ' ');
    auto after = split(line.substr(separator + 3), ' ');
    if (before.size() < 5 || after.size() < 3) continue;
    CgroupMount mount;
    mount.mount_point = unescape_mount_path(before[4]);
    mount.mount_options = std::string(before[5]);
    mount.super_options = std::string(after[2]);
    if (after[0] == "cgroup2") {
      mount.unified = true;
    } else if (after[0] == "cgroup") {
      for (std::string_view option : split(after[2], ',')) {
        if (option == "rw" || option == "ro" || option.find('=') != std::string_view::npos) {
          continue;
        }
        mount.controllers.emplace_back(option);
      }
    } else {
      continue;
    }
    mounts.push_back(std::move(mount));
  }
  return mounts;
}

Result<std::unique_ptr<CgroupDriver>> make_cgroup_driver(const std::vector<CgroupMount>& mounts,
                                                         std::string_view parent) {
  for (const auto& mount : mounts) {
    if (mount.unified && has(mount.controllers, "memory") && has(mount.controllers, "cpu") &&
        has(mount.controllers, "pids")) {
      return make_cgroup_v2(mount.mount_point, std::string(parent), mount.controllers);
    }
  }
  auto v1_root = [&](std::string_view controller) -> std::filesystem::path {
    for (const auto& mount : mounts) {
      if (!mount.unified && has(mount.controllers, controller)) return mount.mount_point;
    }
    return {};
  };
  CgroupV1Paths paths{.memory = v1_root("memory"),
                      .cpu = v1_root("cpu"),
                      .cpuacct = v1_root("cpuacct"),
                      .pids = v1_root("pids"),
                      .blkio = v1_root("blkio"),
                      .hugetlb = v1_root("hugetlb"),
                      .unified_hugetlb = {},
                      .controllers = {}};
  for (const auto& mount : mounts) {
    if (!mount.unified) paths.controllers[mount.mount_point] = mount.controllers;
    if (mount.unified && paths.hugetlb.empty() && has(mount.controllers, "hugetlb")) {
      paths.unified_hugetlb = mount.mount_point;
    }
  }
  std::vector<std::string_view> missing;
  if (paths.memory.empty()) missing.push_back("memory");
  if (paths.cpu.empty()) missing.push_back("cpu");
  if (paths.cpuacct.empty()) missing.push_back("cpuacct");
  if (paths.pids.empty()) missing.push_back("pids");
  if (missing.empty()) return make_cgroup_v1(std::move(paths), std::string(parent));
  return make_error(ErrorCode::kFailedPrecondition,
                    "no usable cgroup hierarchy: cgroup v2 lacks one of memory, cpu, pids in "
                    "cgroup.controllers, and cgroup v1 has no hierarchy for {}. Mount the cgroup "
                    "filesystems (systemd does this at boot) or enable these controllers",
                    fmt::join(missing, ", "));
}

Result<std::vector<CgroupMount>> read_cgroup_mounts() {
  ASSIGN_OR_RETURN(auto mountinfo, read_file("/proc/self/mountinfo"));
  auto mounts = parse_cgroup_mounts(mountinfo);
  for (auto& mount : mounts) {
    if (!mount.unified) continue;
    auto controllers = read_file(mount.mount_point / "cgroup.controllers");
    if (!controllers) continue;
    std::istringstream words(*controllers);
    for (std::string word; words >> word;)
      mount.controllers.push_back(word);
  }
  return mounts;
}

std::optional<Remount> favordynmods_remount(const CgroupMount& mount) {
  Remount remount;
  remount.flags = MS_REMOUNT;
  // A remount replaces the mount's flags and the filesystem's options: say again what is set.
  for (std::string_view option : split(mount.mount_options, ',')) {
    if (option == "ro") remount.flags |= MS_RDONLY;
    if (option == "nosuid") remount.flags |= MS_NOSUID;
    if (option == "nodev") remount.flags |= MS_NODEV;
    if (option == "noexec") remount.flags |= MS_NOEXEC;
    if (option == "noatime") remount.flags |= MS_NOATIME;
    if (option == "nodiratime") remount.flags |= MS_NODIRATIME;
    if (option == "relatime") remount.flags |= MS_RELATIME;
  }
  std::vector<std::string_view> options;
  for (std::string_view option : split(mount.super_options, ',')) {
    if (option == "favordynmods") return std::nullopt;
    if (option != "rw" && option != "ro" && !option.empty()) options.push_back(option);
  }
  options.push_back("favordynmods");
  remount.data = fmt::format("{}", fmt::join(options, ","));
  return remount;
}

Result<bool> favor_dynamic_modifications(const std::vector<CgroupMount>& mounts) {
  for (const auto& mount : mounts) {
    if (!mount.unified) continue;
    auto remount = favordynmods_remount(mount);
    if (!remount) return true;
    if (::mount(nullptr, mount.mount_point.c_str(), nullptr, remount->flags,
                remount->data.c_str()) != 0) {
      return errno_error("remounting '{}' with favordynmods ({})", mount.mount_point.string(),
                         remount->data);
    }
    return true;
  }
  return false;
}

namespace cgroup_files {

namespace {

Result<uint64_t> parse_number(std::string text, std::string_view where) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' '))
    text.pop_back();
  if (text == "max") return UINT64_MAX;
  uint64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc()) {
    return make_error(ErrorCode::kInternal, "'{}' holds '{}', not a number", where, text);
  }
  return value;
}

}  // namespace

Result<uint64_t> read_number(const std::filesystem::path& path) {
  ASSIGN_OR_RETURN(auto text, read_file(path));
  return parse_number(std::move(text), path.string());
}

Result<uint64_t> read_number_at(int fd) {
  char buffer[64];
  const ssize_t size = ::pread(fd, buffer, sizeof buffer - 1, 0);
  if (size < 0) return errno_error("reading a cgroup file");
  return parse_number(std::string(buffer, static_cast<size_t>(size)), "a cgroup file");
}

Result<uint64_t> read_keyed(const std::filesystem::path& path, std::string_view key) {
  ASSIGN_OR_RETURN(auto text, read_file(path));
  for (std::string_view line : split(text, '\n')) {
    if (line.starts_with(key) && line.size() > key.size() && line[key.size()] == ' ') {
      uint64_t value = 0;
      auto digits = line.substr(key.size() + 1);
      std::from_chars(digits.data(), digits.data() + digits.size(), value);
      return value;
    }
  }
  return make_error(ErrorCode::kNotFound, "'{}' has no '{}' line", path.string(), key);
}

Result<std::vector<pid_t>> read_procs(const std::filesystem::path& path) {
  ASSIGN_OR_RETURN(auto text, read_file(path));
  std::vector<pid_t> pids;
  for (std::string_view line : split(text, '\n')) {
    pid_t pid = 0;
    if (std::from_chars(line.data(), line.data() + line.size(), pid).ec == std::errc()) {
      pids.push_back(pid);
    }
  }
  return pids;
}

Result<void> kill_all(const std::filesystem::path& procs_file) {
  // A process that forks between our read and our kill is caught on the next round; a
  // SIGKILLed process cannot fork, so the set shrinks. The pids limit bounds each round.
  for (int round = 0; round < 1000; ++round) {
    auto pids = read_procs(procs_file);
    if (!pids) {
      if (pids.error().code == ErrorCode::kNotFound) return {};
      return std::unexpected(pids.error());
    }
    if (pids->empty()) return {};
    for (pid_t pid : *pids)
      ::kill(pid, SIGKILL);
    if (round > 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return make_error(ErrorCode::kInternal, "processes in '{}' survived SIGKILL",
                    procs_file.string());
}

std::vector<std::string> exec_children(const std::filesystem::path& directory) {
  std::vector<std::string> names;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(directory, error)) {
    const auto name = entry.path().filename();
    if (entry.is_directory(error) && name != "init" && name != kProxyCgroup) {
      names.push_back(entry.path().filename().string());
    }
  }
  std::sort(names.begin(), names.end());
  return names;
}

Result<void> remove_tree(const std::filesystem::path& directory) {
  // Tried first: a cgroup whose processes are gone and that has no child goes at once (the
  // common case, a syscall), and one that is already gone needs nothing.
  if (::rmdir(directory.c_str()) == 0 || errno == ENOENT) return {};
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(directory, error)) {
    if (entry.is_directory(error) && !entry.is_symlink(error)) {
      RETURN_IF_ERROR(remove_tree(entry.path()));
    }
  }
  // rmdir fails with EBUSY while exiting processes are still being released from the cgroup:
  // microseconds to a few milliseconds after SIGKILL on a quiet host, seconds when a killed
  // process waits in the filesystem (a btrfs commit with quotas, on a loaded host) before it
  // can die. It also fails for a process that joined after the caller's kill: a command whose
  // start raced with its stop joins its cgroups only once init has forked it. Whatever is in
  // a cgroup being removed is killed, on every try. Waits up to 30 s, then says what is still
  // in it.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  for (int attempt = 0;; ++attempt) {
    if (::rmdir(directory.c_str()) == 0 || errno == ENOENT) return {};
    const int error_number = errno;
    auto procs = read_procs(directory / "cgroup.procs");
    if (error_number != EBUSY || std::chrono::steady_clock::now() > deadline) {
      return make_error(ErrorCode::kInternal, "rmdir '{}': {} (processes in it: {})",
                        directory.string(), std::strerror(error_number),
                        procs ? fmt::format("{}", fmt::join(*procs, " ")) : procs.error().message);
    }
    if (procs) {
      for (pid_t pid : *procs)
        ::kill(pid, SIGKILL);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(100 + 50 * std::min(attempt, 100)));
  }
}

Result<void> write_each(const std::filesystem::path& directory, std::string_view prefix,
                        std::string_view suffix, std::string_view value) {
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(directory, error)) {
    const std::string name = entry.path().filename();
    if (name.size() > prefix.size() + suffix.size() && name.starts_with(prefix) &&
        name.ends_with(suffix)) {
      RETURN_IF_ERROR(write_control_file(entry.path(), value));
    }
  }
  if (error)
    return make_error(ErrorCode::kInternal, "listing '{}': {}", directory.string(),
                      error.message());
  return {};
}

}  // namespace cgroup_files
}  // namespace quarry::sandbox::local

#include "sandbox/local/packages.h"

#include <nlohmann/json.hpp>

#include "common/file_util.h"
#include "common/sha256.h"
#include "sandbox/local/pip.h"

namespace quarry::sandbox::local {

Result<PackageSet> package_set(const std::filesystem::path& cache_dir,
                               const ImageDefinition& definition, std::string_view image_hash,
                               const std::vector<std::string>& requirements, Progress& progress,
                               int cancel_fd) {
  const nlohmann::json key = {{"image", image_hash}, {"packages", requirements}};
  PackageSet set;
  set.lock_file =
      cache_dir / "package-locks" / fmt::format("{}.lock", sha256_hex(key.dump()).substr(0, 16));
  const auto wheels_dir = cache_dir / "wheels";
  std::error_code error;
  if (std::filesystem::exists(set.lock_file, error)) {
    progress.step(
        fmt::format("the lock of {} ({})", fmt::join(requirements, " "), set.lock_file.string()));
    ASSIGN_OR_RETURN(auto text, read_file(set.lock_file));
    ASSIGN_OR_RETURN(set.lock, parse_python_lock(text, set.lock_file.string()));
  } else {
    progress.step(fmt::format("resolving {} for Python {}", fmt::join(requirements, " "),
                              definition.lock.python));
    // What the image has stays as it is: pip may only add packages beside it.
    std::vector<std::string> constraints;
    for (const auto& package : definition.lock.packages) {
      constraints.push_back(fmt::format("{}=={}", package.name, package.version));
    }
    ASSIGN_OR_RETURN(auto resolved,
                     resolve_requirements(requirements, definition.lock.python, constraints,
                                          wheels_dir, progress, cancel_fd));
    set.lock.python = resolved.python;
    set.lock.requirements = resolved.requirements;
    for (auto& package : resolved.packages) {
      const auto* in_image = definition.lock.find(package.name);
      if (!in_image || in_image->version != package.version) {
        set.lock.packages.push_back(std::move(package));
      }
    }
    RETURN_IF_ERROR(make_directories(set.lock_file.parent_path(), 0755));
    RETURN_IF_ERROR(write_file_atomic(
        set.lock_file,
        set.lock.text(fmt::format(
            "Extra Python packages for sandboxes of image {}: what {} resolved to\n"
            "beside the image's own packages, each pinned to one version and the sha256 of its\n"
            "wheel. Installed from these wheels every time; delete this file to resolve again.",
            image_hash, fmt::join(requirements, " "))),
        0644));
  }
  progress.step(fmt::format("{} wheels", set.lock.packages.size()));
  ASSIGN_OR_RETURN(set.wheels,
                   fetch_locked_wheels(set.lock, set.lock_file.string(),
                                       fmt::format("delete {} to resolve the packages again",
                                                   set.lock_file.string()),
                                       wheels_dir, progress, cancel_fd));
  return set;
}

std::vector<std::string> pip_install_command() {
  const std::string staging(kPackageStaging);
  return {std::string(kVenvDir) + "/bin/pip",
          "install",
          "--quiet",
          "--no-index",
          "--no-deps",
          "--require-hashes",
          "--no-cache-dir",
          "--disable-pip-version-check",
          "--root-user-action=ignore",
          "--find-links",
          staging,
          "-r",
          staging + "/requirements.txt"};
}

std::vector<std::string> pip_check_command() {
  return {std::string(kVenvDir) + "/bin/pip", "check", "--disable-pip-version-check"};
}

}  // namespace quarry::sandbox::local

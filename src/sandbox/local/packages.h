// Extra Python packages for a sandbox, on top of its image. A set is resolved once for an image,
// with the image's own packages held at their versions, into a lock kept in
// <cache>/package-locks/; from then on it is installed from that lock's wheels, checked by hash,
// as an image is. Sandboxes have no network: the host's pip fetches the wheels, the sandbox's
// pip installs them from a directory.
#pragma once

#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.h"
#include "common/progress.h"
#include "sandbox/local/image.h"
#include "sandbox/local/python_lock.h"

namespace quarry::sandbox::local {

// Where the wheels and their lock go inside the sandbox while they are installed.
inline constexpr std::string_view kPackageStaging = "/tmp/quarry-packages";

struct PackageSet {
  PythonLock lock;  // the packages to install: the requirements and what they need, less what
                    // the image has
  std::filesystem::path lock_file;
  std::map<std::string, std::filesystem::path> wheels;  // package name -> wheel on the host
};

// The lock and wheels of `requirements` (canonical_requirements) on the image of `definition`
// (built as `image_hash`): the lock from <cache>/package-locks/ if this set was resolved for
// this image before, else resolved now with the host's pip and kept there; the wheels from
// <cache>/wheels, or downloaded by their pins and hashes. kCancelled, pip stopped, once
// `cancel_fd` (-1: none) is readable.
Result<PackageSet> package_set(const std::filesystem::path& cache_dir,
                               const ImageDefinition& definition, std::string_view image_hash,
                               const std::vector<std::string>& requirements, Progress& progress,
                               int cancel_fd = -1);

// The sandbox's pip installing exactly the staged lock (no index, no dependencies of its own
// choosing, every hash checked), and checking the environment afterwards.
std::vector<std::string> pip_install_command();
std::vector<std::string> pip_check_command();

}  // namespace quarry::sandbox::local

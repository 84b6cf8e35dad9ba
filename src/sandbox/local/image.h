// Sandbox images: a Debian root filesystem with a Python virtual environment, built once by
// `quarry image build` and cached under the cache directory by a hash of their definition.
//
//   <cache>/images/<hash>/rootfs/      the read-only lower layer of every sandbox's overlay
//   <cache>/images/<hash>/image.json   definition, resolved package versions, size, build time
//   <cache>/images/<hash>/python.lock  the lock its Python packages were installed from
//   <cache>/bases/<hash>/rootfs/       the debootstrapped system, shared by images
//   <cache>/wheels/                    Python wheels downloaded for builds
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/progress.h"
#include "config/config.h"
#include "sandbox/local/python_lock.h"

namespace quarry::sandbox::local {

// Files in an image belong to this host id and up: inside the sandbox's user namespace they
// are root (0) and the sandbox user (1000), outside they are no one in particular.
inline constexpr uint32_t kSandboxIdBase = 1u << 30;
inline constexpr uint32_t kSandboxIdCount = 65536;
inline constexpr uint32_t kSandboxUser = 1000;
inline constexpr std::string_view kSandboxUserName = "sandbox";
inline constexpr std::string_view kVenvDir = "/opt/quarry/venv";
inline constexpr std::string_view kMatplotlibDir = "/opt/quarry/matplotlib";

struct ImageDefinition {
  // The build recipe's version: bump it whenever ImageStore::build changes what it makes, so
  // cached images built by the old recipe are not reused.
  int format = 4;
  std::string suite;                         // Debian release, e.g. bookworm
  std::vector<std::string> debian_packages;  // on top of debootstrap's minbase
  std::vector<std::string> python_packages;  // sandbox.packages, sorted
  // What the virtual environment holds: every package pinned with its hashes. Its sha256 is
  // part of the hash, so a changed lock makes another image.
  PythonLock lock;
  std::string lock_source;  // where the lock came from: a file, or "the built-in lock"
  uint32_t id_base = kSandboxIdBase;

  nlohmann::json to_json() const;
  // sha256 of the canonical JSON (the lock by its sha256), first 16 hex digits.
  std::string hash() const;
  // The part that decides the debootstrapped base, and its hash.
  std::string base_hash() const;
};

// The lock of the built-in sandbox.packages (src/sandbox/local/python.lock, built in).
std::string_view built_in_python_lock();
inline constexpr std::string_view kBuiltInLock = "the built-in lock";

// The lock file `config`'s image is installed from: sandbox.lock if named; else the lock beside
// the configuration if it exists or sandbox.packages is not the built-in set; else nullopt, the
// built-in lock.
Result<std::optional<std::filesystem::path>> lock_file_for(const SandboxConfig& config);

// The image quarry uses for `config`: the host's Debian release, sandbox.packages and their lock
// (read and checked against them; a missing lock file is kNotFound).
Result<ImageDefinition> default_image_definition(const SandboxConfig& config);
// The same without the lock: what `quarry image lock` resolves.
Result<ImageDefinition> unlocked_image_definition(const SandboxConfig& config);

struct Image {
  std::string hash;
  std::filesystem::path rootfs;
  nlohmann::json manifest;  // image.json
};

// What a built image holds, from its manifest: every Python package (normalised name) and its
// version. Empty for a manifest without them.
std::map<std::string, std::string> installed_python_packages(const nlohmann::json& manifest);
// "polars 1.35.2, duckdb 1.4.4, ...": each of `requirements` (sandbox.packages) with the version
// the image has.
std::string describe_python_packages(const nlohmann::json& manifest,
                                     const std::vector<std::string>& requirements);

class ImageStore {
 public:
  explicit ImageStore(std::filesystem::path cache_dir);

  // The built image for `definition`, or kFailedPrecondition telling how to build it.
  Result<Image> find(const ImageDefinition& definition) const;
  Result<std::vector<Image>> list() const;

  // Builds the image unless it is cached (or `force`); returns it. Installs exactly the
  // definition's lock, each wheel checked against its hash, without resolving anything.
  Result<Image> build(const ImageDefinition& definition, bool force, Progress& progress) const;

  // Resolves the definition's python_packages anew (the newest versions they allow, for the
  // image's Python) with the host's pip and its configuration, and locks what it chose. The
  // wheels stay in <cache>/wheels for the build.
  Result<PythonLock> lock(const ImageDefinition& definition, Progress& progress) const;

  const std::filesystem::path& cache_dir() const { return cache_dir_; }

 private:
  std::filesystem::path image_dir(std::string_view hash) const;
  Result<std::filesystem::path> build_base(const ImageDefinition& definition,
                                           Progress& progress) const;

  std::filesystem::path cache_dir_;
};

// The Debian mirror the host's apt uses for `suite` (QUARRY_DEBIAN_MIRROR overrides it).
Result<std::string> host_debian_mirror(std::string_view suite);

}  // namespace quarry::sandbox::local

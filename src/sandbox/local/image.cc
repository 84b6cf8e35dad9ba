#include "sandbox/local/image.h"

#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include "common/command.h"
#include "common/file_util.h"
#include "common/sha256.h"

namespace quarry::sandbox::local {
namespace {

// What analysis code needs from Debian besides Python: time zone data for zoneinfo.
const std::vector<std::string> kDebianPackages = {"python3", "python3-venv", "tzdata"};

// The environment for commands run inside an image being built: nothing of ours leaks in
// (notably no PIP_* settings meant for the host's pip).
const std::map<std::string, std::string> kBuildEnvironment = {
    {"PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
    {"HOME", "/root"},
    {"LANG", "C.UTF-8"},
};

Result<std::string> os_release_value(std::string_view key) {
  ASSIGN_OR_RETURN(auto text, read_file("/etc/os-release"));
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (line.starts_with(key) && line.size() > key.size() && line[key.size()] == '=') {
      std::string value = line.substr(key.size() + 1);
      if (value.size() >= 2 && value.front() == '"') value = value.substr(1, value.size() - 2);
      return value;
    }
  }
  return make_error(ErrorCode::kNotFound, "/etc/os-release has no {}", key);
}

std::vector<std::string> words(std::string_view text) {
  std::vector<std::string> out;
  std::istringstream stream{std::string(text)};
  for (std::string word; stream >> word;)
    out.push_back(word);
  return out;
}

bool contains(const std::vector<std::string>& items, std::string_view item) {
  return std::find(items.begin(), items.end(), item) != items.end();
}

Result<CommandOutput> in_chroot(const std::filesystem::path& rootfs,
                                const std::vector<std::string>& command, Progress& progress,
                                std::map<std::string, std::string> extra_env = {}) {
  std::vector<std::string> argv = {"chroot", rootfs.string()};
  argv.insert(argv.end(), command.begin(), command.end());
  CommandOptions options;
  options.environment = kBuildEnvironment;
  options.environment->insert(extra_env.begin(), extra_env.end());
  options.on_line = [&](std::string_view line) { progress.detail(line); };
  return run_command(argv, options);
}

// Moves every file's owner into the sandbox's id range (see kSandboxIdBase) and returns the
// space the tree takes.
Result<uint64_t> shift_owners(const std::filesystem::path& root, uint32_t id_base) {
  uint64_t total = 0;
  std::error_code error;
  auto visit = [&](const std::filesystem::path& path) -> Result<void> {
    struct stat info {};
    if (::lstat(path.c_str(), &info) != 0) return errno_error("lstat '{}'", path.string());
    if (::lchown(path.c_str(), info.st_uid + id_base, info.st_gid + id_base) != 0) {
      return errno_error("lchown '{}'", path.string());
    }
    total += static_cast<uint64_t>(info.st_blocks) * 512;
    return {};
  };
  RETURN_IF_ERROR(visit(root));
  for (std::filesystem::recursive_directory_iterator it(root, error), end; it != end;
       it.increment(error)) {
    RETURN_IF_ERROR(visit(it->path()));
  }
  if (error) {
    return make_error(ErrorCode::kInternal, "walking '{}' failed: {}", root.string(),
                      error.message());
  }
  return total;
}

}  // namespace

nlohmann::json ImageDefinition::to_json() const {
  return {{"format", format},
          {"suite", suite},
          {"debian_packages", debian_packages},
          {"python_packages", python_packages},
          {"id_base", id_base}};
}

std::string ImageDefinition::hash() const {
  return sha256_hex(to_json().dump()).substr(0, 16);
}

std::string ImageDefinition::base_hash() const {
  // The debootstrap step has its own recipe version, so image recipe changes reuse the base.
  constexpr int kBaseFormat = 1;
  nlohmann::json base = {
      {"format", kBaseFormat}, {"suite", suite}, {"debian_packages", debian_packages}};
  return sha256_hex(base.dump()).substr(0, 16);
}

Result<ImageDefinition> default_image_definition(const SandboxConfig& config) {
  auto id = os_release_value("ID");
  auto codename = os_release_value("VERSION_CODENAME");
  if (!id || *id != "debian" || !codename) {
    return make_error(ErrorCode::kFailedPrecondition,
                      "building sandbox images needs a Debian host (its apt sources give the "
                      "image's Debian root); /etc/os-release says this is '{}'",
                      id ? *id : "unknown");
  }
  ImageDefinition definition;
  definition.suite = *codename;
  definition.debian_packages = kDebianPackages;
  definition.python_packages = config.packages;
  return definition;
}

Result<std::string> host_debian_mirror(std::string_view suite) {
  if (const char* mirror = std::getenv("QUARRY_DEBIAN_MIRROR"); mirror && *mirror) return mirror;
  std::vector<std::filesystem::path> files = {"/etc/apt/sources.list"};
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator("/etc/apt/sources.list.d", error)) {
    files.push_back(entry.path());
  }
  for (const auto& file : files) {
    auto text = read_file(file);
    if (!text) continue;
    const bool deb822 = file.extension() == ".sources";
    if (file.extension() != ".list" && !deb822 && file.filename() != "sources.list") continue;
    std::istringstream lines(*text);
    if (deb822) {
      // Stanzas separated by blank lines: Types, URIs, Suites, Components.
      std::map<std::string, std::string> stanza;
      auto check = [&]() -> std::optional<std::string> {
        if (contains(words(stanza["Types"]), "deb") && contains(words(stanza["Suites"]), suite) &&
            contains(words(stanza["Components"]), "main") && !stanza["URIs"].empty()) {
          return words(stanza["URIs"]).front();
        }
        return std::nullopt;
      };
      for (std::string line; std::getline(lines, line);) {
        if (line.empty()) {
          if (auto uri = check()) return *uri;
          stanza.clear();
          continue;
        }
        if (line.front() == '#') continue;
        auto colon = line.find(':');
        if (colon != std::string::npos) stanza[line.substr(0, colon)] = line.substr(colon + 1);
      }
      if (auto uri = check()) return *uri;
    } else {
      for (std::string line; std::getline(lines, line);) {
        auto parts = words(line);
        if (parts.size() < 4 || parts[0] != "deb") continue;
        size_t at = 1;
        if (parts[at].starts_with("[")) {
          while (at < parts.size() && !parts[at].ends_with("]"))
            ++at;
          ++at;
        }
        if (at + 2 < parts.size() && parts[at + 1] == suite &&
            std::find(parts.begin() + static_cast<long>(at) + 2, parts.end(), "main") !=
                parts.end()) {
          return parts[at];
        }
      }
    }
  }
  return make_error(ErrorCode::kFailedPrecondition,
                    "no apt source for Debian '{}' main was found in /etc/apt; set "
                    "QUARRY_DEBIAN_MIRROR to a Debian mirror URL",
                    suite);
}

ImageStore::ImageStore(std::filesystem::path cache_dir) : cache_dir_(std::move(cache_dir)) {}

std::filesystem::path ImageStore::image_dir(std::string_view hash) const {
  return cache_dir_ / "images" / hash;
}

Result<Image> ImageStore::find(const ImageDefinition& definition) const {
  const std::string hash = definition.hash();
  auto manifest_text = read_file(image_dir(hash) / "image.json");
  if (!manifest_text) {
    return make_error(ErrorCode::kFailedPrecondition,
                      "the sandbox image for this configuration (Debian {}, Python packages: {}) "
                      "is not built yet; run: quarry image build",
                      definition.suite, fmt::join(definition.python_packages, ", "));
  }
  auto manifest = nlohmann::json::parse(*manifest_text, nullptr, false);
  if (manifest.is_discarded()) {
    return make_error(ErrorCode::kFailedPrecondition,
                      "the image {} is damaged (bad image.json); run: quarry image build --force",
                      hash);
  }
  return Image{hash, image_dir(hash) / "rootfs", std::move(manifest)};
}

Result<std::vector<Image>> ImageStore::list() const {
  std::vector<Image> images;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(cache_dir_ / "images", error)) {
    auto text = read_file(entry.path() / "image.json");
    if (!text) continue;
    auto manifest = nlohmann::json::parse(*text, nullptr, false);
    if (manifest.is_discarded()) continue;
    images.push_back(
        Image{entry.path().filename().string(), entry.path() / "rootfs", std::move(manifest)});
  }
  return images;
}

Result<std::filesystem::path> ImageStore::build_base(const ImageDefinition& definition,
                                                     Progress& progress) const {
  auto dir = cache_dir_ / "bases" / definition.base_hash();
  if (std::filesystem::exists(dir / "complete")) {
    progress.step(fmt::format("Debian {} base system (cached)", definition.suite));
    return dir / "rootfs";
  }
  progress.step(fmt::format("Debian {} base system (debootstrap)", definition.suite));
  ASSIGN_OR_RETURN(auto mirror, host_debian_mirror(definition.suite));
  auto temp = cache_dir_ / "bases" / fmt::format(".tmp-{}-{}", definition.base_hash(), ::getpid());
  RETURN_IF_ERROR(remove_tree(temp));
  RETURN_IF_ERROR(make_directories(temp, 0755));
  CommandOptions options;
  options.on_line = [&](std::string_view line) { progress.detail(line); };
  auto bootstrapped =
      run_command({"debootstrap", "--variant=minbase",
                   fmt::format("--include={}", fmt::join(definition.debian_packages, ",")),
                   definition.suite, (temp / "rootfs").string(), mirror},
                  options);
  if (!bootstrapped) {
    (void)remove_tree(temp);
    return std::unexpected(bootstrapped.error().with_context("debootstrap of the image's base"));
  }
  RETURN_IF_ERROR(write_file_atomic(temp / "complete", "", 0644));
  RETURN_IF_ERROR(remove_tree(dir));
  std::error_code error;
  std::filesystem::rename(temp, dir, error);
  if (error) {
    return make_error(ErrorCode::kInternal, "moving the base into '{}' failed: {}", dir.string(),
                      error.message());
  }
  return dir / "rootfs";
}

Result<Image> ImageStore::build(const ImageDefinition& definition, bool force,
                                Progress& progress) const {
  if (!force) {
    if (auto cached = find(definition)) {
      progress.finish(fmt::format("image {} is already built (cached)", cached->hash));
      return cached;
    }
  }
  const std::string hash = definition.hash();
  ASSIGN_OR_RETURN(auto base, build_base(definition, progress));

  progress.step("copying the base system");
  auto work = cache_dir_ / "images" / fmt::format(".build-{}-{}", hash, ::getpid());
  RETURN_IF_ERROR(remove_tree(work));
  RETURN_IF_ERROR(make_directories(work, 0755));
  // Whatever fails below, leave no half-built image behind.
  struct Cleanup {
    std::filesystem::path path;
    bool armed = true;
    ~Cleanup() {
      if (armed) (void)remove_tree(path);
    }
  } cleanup{work};
  auto rootfs = work / "rootfs";
  RETURN_IF_ERROR(run_command({"cp", "-a", base.string(), rootfs.string()}));

  progress.step("sandbox user and Python virtual environment");
  {
    std::ofstream passwd(rootfs / "etc/passwd", std::ios::app);
    passwd << fmt::format("{0}:x:{1}:{1}:quarry sandbox:/home/{0}:/bin/bash\n", kSandboxUserName,
                          kSandboxUser);
    std::ofstream group(rootfs / "etc/group", std::ios::app);
    group << fmt::format("{}:x:{}:\n", kSandboxUserName, kSandboxUser);
    std::ofstream shadow(rootfs / "etc/shadow", std::ios::app);
    shadow << fmt::format("{}:!:20000:0:99999:7:::\n", kSandboxUserName);
    if (!passwd || !group || !shadow) {
      return make_error(ErrorCode::kInternal, "adding the sandbox user to '{}' failed",
                        rootfs.string());
    }
  }
  // debootstrap copies the host's hostname and resolver settings: nothing of the host's
  // identity should be visible inside.
  RETURN_IF_ERROR(write_file_atomic(rootfs / "etc/hostname", "sandbox\n"));
  RETURN_IF_ERROR(write_file_atomic(rootfs / "etc/hosts",
                                    "127.0.0.1\tlocalhost\n::1\t\tlocalhost ip6-localhost\n"));
  RETURN_IF_ERROR(write_file_atomic(rootfs / "etc/resolv.conf", ""));
  RETURN_IF_ERROR(make_directories(rootfs / "home" / kSandboxUserName, 0755));
  ::chown((rootfs / "home" / kSandboxUserName).c_str(), kSandboxUser, kSandboxUser);
  RETURN_IF_ERROR(in_chroot(rootfs, {"python3", "-m", "venv", std::string(kVenvDir)}, progress));
  ASSIGN_OR_RETURN(
      auto version_output,
      in_chroot(rootfs, {"python3", "-c", "import sys; print('%d.%d' % sys.version_info[:2])"},
                progress));
  std::string python_version = words(version_output.output).back();

  progress.step(fmt::format("downloading {} Python packages and their dependencies",
                            definition.python_packages.size()));
  auto wheels = cache_dir_ / "wheels";
  RETURN_IF_ERROR(make_directories(wheels, 0755));
  {
    // The host's pip (and its configuration) fetches wheels for the image's Python; no
    // network is needed inside the image.
    std::vector<std::string> download = {"python3",
                                         "-m",
                                         "pip",
                                         "download",
                                         "--quiet",
                                         "--only-binary=:all:",
                                         "--dest",
                                         wheels.string(),
                                         "--python-version",
                                         python_version,
                                         "--implementation",
                                         "cp"};
    // manylinux tags up to glibc 2.36 (Debian bookworm's); pip needs each one named.
    download.insert(download.end(), {"--platform", "manylinux2014_x86_64", "--platform",
                                     "manylinux2010_x86_64", "--platform", "manylinux1_x86_64"});
    for (int minor = 17; minor <= 36; ++minor) {
      download.insert(download.end(), {"--platform", fmt::format("manylinux_2_{}_x86_64", minor)});
    }
    download.insert(download.end(), definition.python_packages.begin(),
                    definition.python_packages.end());
    CommandOptions options;
    options.on_line = [&](std::string_view line) { progress.detail(line); };
    auto downloaded = run_command(download, options);
    if (!downloaded) {
      return std::unexpected(downloaded.error().with_context("downloading Python packages"));
    }
  }

  progress.step("installing Python packages into the image");
  RETURN_IF_ERROR(make_directories(rootfs / "tmp/wheels", 0755));
  {
    std::vector<std::string> install = {
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        "mount --bind \"$1\" \"$2/tmp/wheels\" && shift 2 && exec chroot \"$0\" \"$@\"",
        rootfs.string(),
        wheels.string(),
        rootfs.string(),
        std::string(kVenvDir) + "/bin/pip",
        "install",
        "--quiet",
        "--no-index",
        "--no-cache-dir",
        "--disable-pip-version-check",
        "--find-links",
        "/tmp/wheels"};
    // sh -c 'script' $0 $1 $2 ...: $0 is the rootfs for chroot, $1 and $2 the bind mount.
    install.insert(install.end(), definition.python_packages.begin(),
                   definition.python_packages.end());
    CommandOptions options;
    options.environment = kBuildEnvironment;
    options.on_line = [&](std::string_view line) { progress.detail(line); };
    auto installed = run_command(install, options);
    if (!installed) {
      return std::unexpected(installed.error().with_context("installing Python packages"));
    }
  }
  std::filesystem::remove(rootfs / "tmp/wheels");
  RETURN_IF_ERROR(with_context(
      in_chroot(rootfs, {std::string(kVenvDir) + "/bin/pip", "check"}, progress), "pip check"));
  ASSIGN_OR_RETURN(auto freeze, in_chroot(rootfs,
                                          {std::string(kVenvDir) + "/bin/pip", "freeze", "--all",
                                           "--disable-pip-version-check"},
                                          progress));
  if (contains(definition.python_packages, "matplotlib")) {
    // matplotlib builds its font cache on first import, which takes seconds; do it once here.
    RETURN_IF_ERROR(
        in_chroot(rootfs, {std::string(kVenvDir) + "/bin/python", "-c", "import matplotlib.pyplot"},
                  progress, {{"MPLCONFIGDIR", std::string(kMatplotlibDir)}}));
    // matplotlib insists on a writable config directory and otherwise rebuilds its cache in
    // a temporary one on every start: give it to the sandbox user.
    RETURN_IF_ERROR(in_chroot(
        rootfs,
        {"chown", "-R", fmt::format("{0}:{0}", kSandboxUserName), std::string(kMatplotlibDir)},
        progress));
  }

  progress.step("finishing the image");
  ASSIGN_OR_RETURN(uint64_t size_bytes, shift_owners(rootfs, definition.id_base));

  nlohmann::json packages = nlohmann::json::object();
  for (const auto& line : words(freeze.output)) {
    auto separator = line.find("==");
    if (separator != std::string::npos)
      packages[line.substr(0, separator)] = line.substr(separator + 2);
  }
  nlohmann::json manifest = {
      {"hash", hash},
      {"definition", definition.to_json()},
      {"python_version", python_version},
      {"python_packages", packages},
      {"size_bytes", size_bytes},
      {"built_at_ms", std::chrono::duration_cast<std::chrono::milliseconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count()},
  };
  RETURN_IF_ERROR(write_file_atomic(work / "image.json", manifest.dump(2) + "\n", 0644));

  auto final_dir = image_dir(hash);
  if (std::filesystem::exists(final_dir)) {
    // --force: retire the old build; sandboxes started from it keep their own view of it until
    // it is removed, so rebuild only when none are running.
    auto retired = cache_dir_ / "images" / fmt::format(".retired-{}-{}", hash, ::getpid());
    std::filesystem::rename(final_dir, retired);
    (void)remove_tree(retired);
  }
  std::error_code error;
  std::filesystem::rename(work, final_dir, error);
  if (error) {
    return make_error(ErrorCode::kInternal, "moving the image into '{}' failed: {}",
                      final_dir.string(), error.message());
  }
  cleanup.armed = false;
  progress.finish(
      fmt::format("built image {} ({}, Python {})", hash, format_size(size_bytes), python_version));
  return Image{hash, final_dir / "rootfs", std::move(manifest)};
}

}  // namespace quarry::sandbox::local

#include "sandbox/local/image.h"

#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include "common/command.h"
#include "common/file_util.h"
#include "common/sha256.h"
#include "common/text.h"
#include "common/units.h"
#include "sandbox/local/pip.h"

namespace quarry::sandbox::local {
namespace {

// What to do when the index serves other files than an image's lock pins.
constexpr std::string_view kRelockImage = "run quarry image lock to lock what it serves now";

// What analysis code needs from Debian besides Python: time zone data for zoneinfo.
const std::vector<std::string> kDebianPackages = {"python3", "python3-venv", "tzdata"};

// The environment for commands run inside an image being built: nothing of ours leaks in
// (notably no PIP_* settings meant for the host's pip).
const std::map<std::string, std::string> kBuildEnvironment = {
    {"PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
    {"HOME", "/root"},
    {"LANG", "C.UTF-8"},
};

// The value of `key` in the text of /etc/os-release.
Result<std::string> os_release_value(const std::string& text, std::string_view key) {
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

// The major.minor of the Python in a root filesystem.
Result<std::string> python_version_in(const std::filesystem::path& rootfs, Progress& progress) {
  // -I -B: nothing from the environment, no bytecode written into the shared base.
  ASSIGN_OR_RETURN(auto output, in_chroot(rootfs,
                                          {"python3", "-I", "-B", "-c",
                                           "import sys; print('%d.%d' % sys.version_info[:2])"},
                                          progress));
  auto parts = words(output.output);
  if (parts.empty()) {
    return make_error(ErrorCode::kInternal, "the image's python3 did not say its version");
  }
  return parts.back();
}

}  // namespace

nlohmann::json ImageDefinition::to_json() const {
  return {{"format", format},
          {"suite", suite},
          {"debian_packages", debian_packages},
          {"python_packages", python_packages},
          {"python_lock", lock.sha256()},
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

Result<std::optional<std::filesystem::path>> lock_file_for(const SandboxConfig& config) {
  if (config.lock_named) return config.lock_file;
  auto wanted = config.packages;
  auto built_in = SandboxConfig{}.packages;
  std::sort(wanted.begin(), wanted.end());
  std::sort(built_in.begin(), built_in.end());
  std::error_code error;
  if (!config.lock_file.empty() &&
      (wanted != built_in || std::filesystem::exists(config.lock_file, error))) {
    return config.lock_file;
  }
  if (wanted == built_in) return std::nullopt;
  return make_error(ErrorCode::kFailedPrecondition,
                    "sandbox.packages is not the built-in set, so its image needs a lock of its "
                    "own: put the packages in a configuration file (its lock goes beside it) or "
                    "name the lock in sandbox.lock");
}

Result<ImageDefinition> default_image_definition(const SandboxConfig& config) {
  ASSIGN_OR_RETURN(auto definition, unlocked_image_definition(config));
  ASSIGN_OR_RETURN(auto file, lock_file_for(config));
  std::string text;
  if (file) {
    definition.lock_source = file->string();
    std::error_code error;
    if (!std::filesystem::exists(*file, error)) {
      return make_error(ErrorCode::kNotFound,
                        "the lock of the sandbox image's Python packages, {}, does not exist yet; "
                        "run: quarry image build (it resolves the packages, writes the lock and "
                        "builds the image)",
                        file->string());
    }
    ASSIGN_OR_RETURN(text, with_context(read_file(*file), "reading the image's lock"));
  } else {
    definition.lock_source = kBuiltInLock;
    text = built_in_python_lock();
  }
  ASSIGN_OR_RETURN(definition.lock, parse_python_lock(text, definition.lock_source));
  RETURN_IF_ERROR(check_lock_covers(definition.lock, config.packages, definition.lock_source));
  return definition;
}

Result<ImageDefinition> unlocked_image_definition(const SandboxConfig& config) {
  const std::string text = read_file("/etc/os-release").value_or("");
  auto id = os_release_value(text, "ID");
  auto codename = os_release_value(text, "VERSION_CODENAME");
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
  std::sort(definition.python_packages.begin(), definition.python_packages.end());
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

std::map<std::string, std::string> installed_python_packages(const nlohmann::json& manifest) {
  std::map<std::string, std::string> out;
  auto packages = manifest.find("python_packages");
  if (packages == manifest.end() || !packages->is_object()) return out;
  for (const auto& [name, version] : packages->items()) {
    if (version.is_string()) out[normalize_package_name(name)] = version.get<std::string>();
  }
  return out;
}

std::string describe_python_packages(const nlohmann::json& manifest,
                                     const std::vector<std::string>& requirements) {
  const auto installed = installed_python_packages(manifest);
  std::vector<std::string> parts;
  for (const auto& requirement : requirements) {
    const std::string name = requirement_name(requirement);
    auto found = installed.find(name);
    parts.push_back(found == installed.end() ? name : fmt::format("{} {}", name, found->second));
  }
  return fmt::format("{}", fmt::join(parts, ", "));
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
                      "the sandbox image for this configuration (Debian {}, Python packages: {}, "
                      "{} {}) is not built yet; run: quarry image build",
                      definition.suite, fmt::join(definition.python_packages, ", "),
                      definition.lock_source, definition.lock.sha256().substr(0, 12));
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
  ASSIGN_OR_RETURN(std::string python_version, python_version_in(base, progress));
  if (python_version != definition.lock.python) {
    return make_error(ErrorCode::kFailedPrecondition,
                      "{} is for Python {}, but the image's Debian {} has Python {}; run: quarry "
                      "image lock (it resolves the packages for this Python)",
                      definition.lock_source, definition.lock.python, definition.suite,
                      python_version);
  }
  progress.step(fmt::format("{} locked Python packages ({} {})", definition.lock.packages.size(),
                            definition.lock_source, definition.lock.sha256().substr(0, 12)));
  ASSIGN_OR_RETURN(auto wheels, fetch_locked_wheels(definition.lock, definition.lock_source,
                                                    kRelockImage, cache_dir_ / "wheels", progress));

  progress.step("copying the base system");
  auto work = cache_dir_ / "images" / fmt::format(".build-{}-{}", hash, ::getpid());
  RETURN_IF_ERROR(remove_tree(work));
  RETURN_IF_ERROR(make_directories(work, 0755));
  // Whatever fails below, leave no half-built image behind.
  ScopedTree cleanup(work);
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

  progress.step("installing the locked Python packages into the image");
  if (!definition.lock.packages.empty()) {
    // Exactly the locked wheels, beside the lock as a requirements file: pip checks each hash,
    // finds nothing else to choose from and resolves nothing (--no-deps; pip check below).
    auto staged = rootfs / "tmp/wheels";
    RETURN_IF_ERROR(make_directories(staged, 0755));
    for (const auto& [name, wheel] : wheels) {
      std::error_code error;
      std::filesystem::create_hard_link(wheel, staged / wheel.filename(), error);
      if (error) std::filesystem::copy_file(wheel, staged / wheel.filename(), error);
      if (error) {
        return make_error(ErrorCode::kInternal, "copying '{}' into the image failed: {}",
                          wheel.string(), error.message());
      }
    }
    RETURN_IF_ERROR(write_file_atomic(staged / "requirements.txt", definition.lock.text(), 0644));
    auto installed =
        in_chroot(rootfs,
                  {std::string(kVenvDir) + "/bin/pip", "install", "--quiet", "--no-index",
                   "--no-deps", "--require-hashes", "--no-cache-dir", "--disable-pip-version-check",
                   "--find-links", "/tmp/wheels", "-r", "/tmp/wheels/requirements.txt"},
                  progress);
    if (!installed) {
      return std::unexpected(installed.error().with_context("installing Python packages"));
    }
    RETURN_IF_ERROR(remove_tree(staged));
  }
  RETURN_IF_ERROR(with_context(
      in_chroot(rootfs, {std::string(kVenvDir) + "/bin/pip", "check"}, progress), "pip check"));
  ASSIGN_OR_RETURN(auto freeze, in_chroot(rootfs,
                                          {std::string(kVenvDir) + "/bin/pip", "freeze", "--all",
                                           "--disable-pip-version-check"},
                                          progress));
  RETURN_IF_ERROR(check_installed(definition.lock, freeze.output, definition.lock_source));
  if (definition.lock.find("matplotlib")) {
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
      {"lock",
       {{"source", definition.lock_source},
        {"sha256", definition.lock.sha256()},
        {"file", "python.lock"}}},
      {"size_bytes", size_bytes},
      {"built_at_ms", std::chrono::duration_cast<std::chrono::milliseconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count()},
  };
  RETURN_IF_ERROR(write_file_atomic(work / "python.lock", definition.lock.text(), 0644));
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
  cleanup.release();
  progress.finish(fmt::format("built image {} ({}, Python {}, from {} {})", hash,
                              format_size(size_bytes), python_version, definition.lock_source,
                              definition.lock.sha256().substr(0, 12)));
  return Image{hash, final_dir / "rootfs", std::move(manifest)};
}

Result<PythonLock> ImageStore::lock(const ImageDefinition& definition, Progress& progress) const {
  ASSIGN_OR_RETURN(auto base, build_base(definition, progress));
  ASSIGN_OR_RETURN(std::string python, python_version_in(base, progress));
  progress.step(fmt::format("resolving {} Python packages for Python {}",
                            definition.python_packages.size(), python));
  return resolve_requirements(definition.python_packages, python, {}, cache_dir_ / "wheels",
                              progress);
}

}  // namespace quarry::sandbox::local

// quarry image build | lock | ls
#include <iostream>

#include "cli/commands.h"
#include "common/file_util.h"
#include "common/progress.h"
#include "common/units.h"
#include "sandbox/local/image.h"

namespace quarry::cli {

namespace {

namespace local = sandbox::local;

// What the image subcommands parse into.
struct ImageOptions final : CommandGroup {
  bool force = false;
  bool json = false;
  std::string output;
};

// What changed from `before` to `after`, one line per package ("polars 1.35.1 -> 1.35.2").
std::vector<std::string> lock_changes(const local::PythonLock& before,
                                      const local::PythonLock& after) {
  std::vector<std::string> changes;
  for (const auto& package : after.packages) {
    const auto* old = before.find(package.name);
    if (!old) {
      changes.push_back(fmt::format("  + {} {}", package.name, package.version));
    } else if (old->version != package.version) {
      changes.push_back(
          fmt::format("    {} {} -> {}", package.name, old->version, package.version));
    } else if (old->sha256 != package.sha256) {
      changes.push_back(
          fmt::format("    {} {}: another wheel (hash)", package.name, package.version));
    }
  }
  for (const auto& package : before.packages) {
    if (!after.find(package.name)) {
      changes.push_back(fmt::format("  - {} {}", package.name, package.version));
    }
  }
  return changes;
}

// Resolves the configuration's packages anew and writes their lock to `path`; returns the lock.
Result<local::PythonLock> write_lock(const local::ImageStore& store, const SandboxConfig& sandbox,
                                     const std::filesystem::path& path) {
  ASSIGN_OR_RETURN(auto definition, local::unlocked_image_definition(sandbox));
  Progress progress("image lock", 2);
  ASSIGN_OR_RETURN(auto lock, with_context(store.lock(definition, progress), "image lock"));
  RETURN_IF_ERROR(write_then_rename(
      path, [&](const std::filesystem::path& file) { return write_file(file, lock.text()); }));
  progress.finish(
      fmt::format("locked {} Python packages in {}", lock.packages.size(), path.string()));
  return lock;
}

}  // namespace

std::unique_ptr<CommandGroup> add_image_commands(CLI::App& group, Context& context, int& exit_code,
                                                 DataCommands&) {
  auto options = std::make_unique<ImageOptions>();
  auto& [force, json, output] = *options;
  group.require_subcommand(1);

  auto* build = group.add_subcommand(
      "build",
      "build the sandbox image for this configuration from its lock (cached by its definition)");
  build->add_flag("--force", force, "rebuild even if a cached image exists");
  build->callback([&] {
    auto config = context.config();
    if (!config) return void(exit_code = report(config.error()));
    const auto& sandbox = (*config)->sandbox;
    local::ImageStore store(context.cache_dir());
    auto lock_file = local::lock_file_for(sandbox);
    if (!lock_file) return void(exit_code = report(lock_file.error()));
    std::error_code error;
    if (*lock_file && !std::filesystem::exists(**lock_file, error)) {
      // The first build of a package set makes its lock; from then on every build installs it.
      auto lock = write_lock(store, sandbox, **lock_file);
      if (!lock) return void(exit_code = report(lock.error()));
      std::cerr << fmt::format(
          "quarry: {} had no lock yet: resolved sandbox.packages ({} packages) and wrote it. "
          "Keep it beside the configuration (commit it with it) so that other machines and later "
          "builds install the same versions; quarry image lock resolves them again.\n",
          (*lock_file)->string(), lock->packages.size());
    }
    auto definition = local::default_image_definition(sandbox);
    if (!definition) {
      return void(exit_code = report(definition.error().with_context("image build")));
    }
    Progress progress("image build", 6);
    auto image = store.build(*definition, force, progress);
    if (!image) return void(exit_code = report(image.error().with_context("image build")));
    std::cerr << fmt::format("image {}: Python {}, {} ({} {})\n", image->hash,
                             image->manifest.value("python_version", "?"),
                             local::describe_python_packages(image->manifest, sandbox.packages),
                             definition->lock_source, definition->lock.sha256().substr(0, 12));
    std::cout << image->hash << std::endl;
  });

  auto* lock = group.add_subcommand(
      "lock",
      "resolve sandbox.packages again (each to the newest version they allow) and write the lock "
      "the image is built from");
  lock->add_option("--output", output,
                   "write the lock here (default: sandbox.lock, else <config name>.lock beside "
                   "the configuration)");
  lock->callback([&] {
    auto config = context.config();
    if (!config) return void(exit_code = report(config.error()));
    const auto& sandbox = (*config)->sandbox;
    auto lock_file = local::lock_file_for(sandbox);
    // The built-in packages without a lock of the configuration's own use the built-in lock.
    const bool built_in = lock_file && !*lock_file;
    std::filesystem::path path = output;
    if (path.empty()) {
      if (!lock_file) return void(exit_code = report(lock_file.error()));
      // A configuration on the built-in lock gets one of its own now, beside it.
      path = lock_file->value_or(sandbox.lock_file);
    }
    if (path.empty()) {
      return void(exit_code = report(
                      Error{ErrorCode::kFailedPrecondition,
                            "quarry runs on its built-in configuration, whose lock is built in; to "
                            "resolve the packages again, write a configuration file (its lock goes "
                            "beside it: config.yml -> config.lock) or give --output FILE"}));
    }
    // What the image was installed from until now, to say what changes.
    local::PythonLock before;
    std::error_code error;
    if (std::filesystem::exists(path, error)) {
      if (auto text = read_file(path)) {
        if (auto parsed = local::parse_python_lock(*text, path.string())) before = *parsed;
      }
    } else if (built_in) {
      if (auto parsed =
              local::parse_python_lock(local::built_in_python_lock(), local::kBuiltInLock)) {
        before = *parsed;
      }
    }
    local::ImageStore store(context.cache_dir());
    auto written = write_lock(store, sandbox, path);
    if (!written) return void(exit_code = report(written.error()));
    auto changes = lock_changes(before, *written);
    if (changes.empty()) {
      std::cerr << fmt::format("{}: no package changed\n", path.string());
    } else {
      std::cerr << fmt::format("{}: {} package(s) changed:\n{}\n", path.string(), changes.size(),
                               fmt::join(changes, "\n"));
    }
    std::cerr << "build the image from it with: quarry image build\n";
    std::cout << path.string() << std::endl;
  });

  auto* ls = group.add_subcommand("ls", "list built images");
  ls->add_flag("--json", json, "print a JSON array of image manifests");
  ls->callback([&] {
    local::ImageStore store(context.cache_dir());
    auto images = store.list();
    if (!images) return void(exit_code = report(images.error()));
    if (json) {
      nlohmann::json list = nlohmann::json::array();
      for (const auto& image : *images)
        list.push_back(image.manifest);
      std::cout << list.dump(2) << std::endl;
      return;
    }
    std::cout << fmt::format("{:<18}{:<10}{:<8}{:<10}{:<14}{}\n", "IMAGE", "DEBIAN", "PYTHON",
                             "SIZE", "LOCK", "PACKAGES");
    for (const auto& image : *images) {
      const auto& manifest = image.manifest;
      const auto definition = manifest.value("definition", nlohmann::json::object());
      const auto lock = manifest.value("lock", nlohmann::json::object());
      std::cout << fmt::format(
          "{:<18}{:<10}{:<8}{:<10}{:<14}{}\n", image.hash, definition.value("suite", "?"),
          manifest.value("python_version", "?"),
          format_size(manifest.value("size_bytes", uint64_t{0})),
          lock.value("sha256", std::string("-")).substr(0, 12),
          local::describe_python_packages(
              manifest, definition.value("python_packages", std::vector<std::string>{})));
    }
  });
  return options;
}

}  // namespace quarry::cli

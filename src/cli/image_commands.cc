// quarry image build | ls
#include <iostream>

#include "cli/commands.h"
#include "common/progress.h"
#include "common/units.h"
#include "sandbox/local/image.h"

namespace quarry::cli {

namespace {

// What the image subcommands parse into.
struct ImageOptions final : CommandGroup {
  bool force = false;
  bool json = false;
};

}  // namespace

std::unique_ptr<CommandGroup> add_image_commands(CLI::App& app, Context& context, int& exit_code) {
  auto options = std::make_unique<ImageOptions>();
  auto& [force, json] = *options;
  auto* group = app.add_subcommand("image", "build and list sandbox images");
  group->require_subcommand(1);

  auto* build = group->add_subcommand(
      "build", "build the sandbox image for this configuration (cached by its definition)");
  build->add_flag("--force", force, "rebuild even if a cached image exists");
  build->callback([&] {
    auto config = context.config();
    if (!config) return void(exit_code = report(config.error()));
    auto definition = sandbox::local::default_image_definition((*config)->sandbox);
    if (!definition) return void(exit_code = report(definition.error()));
    sandbox::local::ImageStore store(context.cache_dir());
    Progress progress("image build", 6);
    auto image = store.build(*definition, force, progress);
    if (!image) return void(exit_code = report(image.error().with_context("image build")));
    std::cout << image->hash << std::endl;
  });

  auto* ls = group->add_subcommand("ls", "list built images");
  ls->add_flag("--json", json, "print a JSON array of image manifests");
  ls->callback([&] {
    sandbox::local::ImageStore store(context.cache_dir());
    auto images = store.list();
    if (!images) return void(exit_code = report(images.error()));
    if (json) {
      nlohmann::json list = nlohmann::json::array();
      for (const auto& image : *images)
        list.push_back(image.manifest);
      std::cout << list.dump(2) << std::endl;
      return;
    }
    std::cout << fmt::format("{:<18}{:<10}{:<8}{:<10}{}\n", "IMAGE", "DEBIAN", "PYTHON", "SIZE",
                             "PACKAGES");
    for (const auto& image : *images) {
      const auto& manifest = image.manifest;
      std::cout << fmt::format(
          "{:<18}{:<10}{:<8}{:<10}{}\n", image.hash, manifest["definition"].value("suite", "?"),
          manifest.value("python_version", "?"),
          format_size(manifest.value("size_bytes", uint64_t{0})),
          fmt::join(manifest["definition"].value("python_packages", std::vector<std::string>{}),
                    ","));
    }
  });
  return options;
}

}  // namespace quarry::cli

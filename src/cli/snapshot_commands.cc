// quarry snapshot create | ls | rm | gc
#include <iostream>

#include "cli/commands.h"
#include "common/units.h"
#include "sandbox/local/image.h"

namespace quarry::cli {
namespace {

namespace local = sandbox::local;

int64_t milliseconds(std::chrono::system_clock::time_point when) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(when.time_since_epoch()).count();
}

nlohmann::json to_json(const local::SnapshotInfo& info) {
  const auto& snapshot = info.snapshot;
  return {{"name", snapshot.name},
          {"kind", snapshot.is_package_snapshot() ? "packages" : "named"},
          {"image", snapshot.image},
          {"parent", snapshot.parent.empty() ? nlohmann::json() : nlohmann::json(snapshot.parent)},
          {"sandbox", snapshot.sandbox},
          {"packages", snapshot.packages},
          {"size_bytes", snapshot.size_bytes},
          {"created_at_ms", milliseconds(snapshot.created_at)},
          {"last_used_at_ms", milliseconds(snapshot.last_used_at)},
          {"used_by", {{"sandboxes", info.users.sandboxes}, {"snapshots", info.users.snapshots}}}};
}

// What made it: the sandbox it was frozen from, or the packages installed.
std::string made_from(const local::SnapshotRecord& snapshot) {
  std::string text = snapshot.is_package_snapshot()
                         ? fmt::format("packages {}", fmt::join(snapshot.packages, " "))
                         : fmt::format("sandbox {}", snapshot.sandbox);
  if (!snapshot.parent.empty()) text += fmt::format(", on {}", snapshot.parent);
  return text;
}

std::string users_text(const local::SnapshotUsers& users) {
  std::vector<std::string> all = users.sandboxes;
  all.insert(all.end(), users.snapshots.begin(), users.snapshots.end());
  return all.empty() ? "-" : fmt::format("{}", fmt::join(all, ","));
}

}  // namespace

// What the snapshot subcommands parse into.
struct SnapshotOptions final : CommandGroup {
  std::string create_sandbox, create_name;
  bool create_stop = false;
  bool ls_json = false;
  std::vector<std::string> rm_names;
};

std::unique_ptr<CommandGroup> add_snapshot_commands(CLI::App& group, Context& context,
                                                    int& exit_code, DataCommands&) {
  auto options = std::make_unique<SnapshotOptions>();
  auto& [create_sandbox, create_name, create_stop, ls_json, rm_names] = *options;
  group.require_subcommand(1);

  auto* create = group.add_subcommand(
      "create",
      "freeze a sandbox's files (what it wrote, installed and deleted) as snapshot NAME; start "
      "others from it with quarry sandbox create --snapshot NAME");
  create->add_option("sandbox", create_sandbox, "sandbox id")->required();
  create->add_option("name", create_name, "the snapshot's name")->required();
  create->add_flag("--stop-commands", create_stop,
                   "stop the commands running in the sandbox first (they could be writing)");
  create->callback([&] {
    auto provider = context.local_provider();
    if (!provider) return void(exit_code = report(provider.error()));
    auto made = (*provider)->snapshot(create_sandbox, create_name, create_stop);
    if (!made) return void(exit_code = report(made.error()));
    std::cerr << fmt::format("snapshot {}: {} from sandbox {}\n", made->snapshot.name,
                             format_size(made->snapshot.size_bytes), create_sandbox);
    std::cout << made->snapshot.name << std::endl;
  });

  auto* ls = group.add_subcommand("ls", "list snapshots");
  ls->add_flag("--json", ls_json, "print a JSON array");
  ls->callback([&] {
    auto provider = context.local_provider();
    if (!provider) return void(exit_code = report(provider.error()));
    auto found = (*provider)->snapshots();
    if (!found) return void(exit_code = report(found.error()));
    if (ls_json) {
      nlohmann::json list = nlohmann::json::array();
      for (const auto& info : *found)
        list.push_back(to_json(info));
      std::cout << list.dump(2) << std::endl;
      return;
    }
    // The image this configuration starts sandboxes from: a snapshot of another is unusable.
    std::string current;
    if (auto definition = local::default_image_definition((*context.config())->sandbox)) {
      current = definition->hash();
    }
    std::cout << fmt::format("{:<28}{:<19}{:<10}{:<9}{:<11}{:<28}{}\n", "NAME", "IMAGE", "SIZE",
                             "CREATED", "LAST USED", "IN USE BY", "MADE FROM");
    for (const auto& info : *found) {
      const auto& snapshot = info.snapshot;
      std::cout << fmt::format("{:<28}{:<19}{:<10}{:<9}{:<11}{:<28}{}\n", snapshot.name,
                               snapshot.image == current ? snapshot.image : snapshot.image + "*",
                               format_size(snapshot.size_bytes), age(snapshot.created_at),
                               age(snapshot.last_used_at), users_text(info.users),
                               made_from(snapshot));
    }
    if (std::any_of(found->begin(), found->end(),
                    [&](const auto& info) { return info.snapshot.image != current; })) {
      std::cout << "* not this configuration's image: sandboxes cannot start from it\n";
    }
  });

  auto* rm = group.add_subcommand("rm", "remove snapshots no sandbox uses");
  rm->add_option("names", rm_names, "snapshot names")->required();
  rm->callback([&] {
    auto provider = context.local_provider();
    if (!provider) return void(exit_code = report(provider.error()));
    for (const auto& name : rm_names) {
      if (auto removed = (*provider)->remove_snapshot(name); !removed) {
        exit_code = report(removed.error());
      } else {
        std::cout << name << std::endl;
      }
    }
  });

  auto* gc = group.add_subcommand(
      "gc",
      "remove the snapshots no sandbox has used for longer than sandbox.snapshots keeps them "
      "(keep_unused for package snapshots, keep_unused_named for the others)");
  gc->callback([&] {
    auto provider = context.local_provider();
    if (!provider) return void(exit_code = report(provider.error()));
    auto collected = (*provider)->collect_snapshots();
    if (!collected) return void(exit_code = report(collected.error()));
    for (const auto& name : *collected)
      std::cout << name << std::endl;
  });
  return options;
}

}  // namespace quarry::cli

// quarry token create | ls | rm: the API tokens of quarry serve (README "Users and tokens").
#include <iostream>

#include "cli/commands.h"
#include "conversation/history_json.h"
#include "server/auth.h"
#include "server/server.h"

namespace quarry::cli {
namespace {

struct TokenOptions final : CommandGroup {
  std::string name;
  bool json = false;
};

}  // namespace

std::unique_ptr<CommandGroup> add_token_commands(CLI::App& group, Context& context, int& exit_code,
                                                 DataCommands&) {
  auto options = std::make_unique<TokenOptions>();
  auto& opts = *options;
  group.require_subcommand(1);
  auto path = [&context]() -> Result<std::filesystem::path> {
    ASSIGN_OR_RETURN(const Config* config, context.config());
    return server::tokens_path(*config, context.state_dir());
  };

  auto* create = group.add_subcommand(
      "create", "make a token for user NAME and print it (once: it is not kept)");
  create->add_option("name", opts.name, "the user the token is for")->required();
  create->callback([&, path] {
    auto file = path();
    if (!file) return void(exit_code = report(file.error()));
    SystemClock clock;
    auto token = server::token_file::create(*file, opts.name, clock);
    if (!token) return void(exit_code = report(token.error()));
    std::cout << *token << std::endl;
    std::cerr << fmt::format(
        "token for '{}' added to {}; it is shown only now. Send it as 'Authorization: Bearer "
        "TOKEN'. A server started without a tokens file must be restarted to require tokens.\n",
        opts.name, file->string());
  });

  auto* ls = group.add_subcommand("ls", "list the tokens' users and when they were made");
  ls->add_flag("--json", opts.json, "print a JSON array");
  ls->callback([&, path] {
    auto file = path();
    if (!file) return void(exit_code = report(file.error()));
    auto entries = server::token_file::read(*file);
    if (!entries && entries.error().code != ErrorCode::kNotFound) {
      return void(exit_code = report(entries.error()));
    }
    std::vector<server::TokenEntry> list = entries ? *entries : std::vector<server::TokenEntry>{};
    if (opts.json) {
      nlohmann::json json = nlohmann::json::array();
      for (const auto& entry : list) {
        json.push_back(
            {{"name", entry.name}, {"created_at", conversation::format_time(entry.created_at)}});
      }
      std::cout << json.dump(2) << std::endl;
      return;
    }
    if (list.empty()) {
      std::cout << fmt::format("no tokens ({}); quarry serve has one user, 'local', on loopback\n",
                               file->string());
      return;
    }
    std::cout << fmt::format("{:<24}{}\n", "NAME", "CREATED");
    for (const auto& entry : list) {
      std::cout << fmt::format("{:<24}{}\n", entry.name,
                               conversation::format_time(entry.created_at));
    }
  });

  auto* rm = group.add_subcommand("rm", "remove a user's token: it stops working at once");
  rm->add_option("name", opts.name, "the user whose token goes")->required();
  rm->callback([&, path] {
    auto file = path();
    if (!file) return void(exit_code = report(file.error()));
    if (auto removed = server::token_file::remove(*file, opts.name); !removed) {
      return void(exit_code = report(removed.error()));
    }
    std::cout << fmt::format("removed the token of '{}'\n", opts.name);
  });
  return options;
}

}  // namespace quarry::cli

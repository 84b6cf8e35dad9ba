// quarry's command line, built the same way by both executables (commands.h).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <optional>
#include <string>

#include "cli/commands.h"
#include "cli/data_commands.h"
#include "common/log.h"

namespace quarry::cli {
namespace {

// The command groups (and single commands) in the order `quarry --help` lists them.
struct Command {
  std::string_view name;
  const char* description;
  std::unique_ptr<CommandGroup> (*add)(CLI::App& group, Context& context, int& exit_code,
                                       DataCommands& data);
};

constexpr Command kCommands[] = {
    {"sandbox", "create, use and remove sandboxes", add_sandbox_commands},
    {"snapshot", "freeze sandboxes into snapshots that new sandboxes start from; list, remove",
     add_snapshot_commands},
    {"image", "build, lock and list sandbox images", add_image_commands},
    {"db", "quarry's PostgreSQL: start, stop, seed, query, export", add_db_commands},
    {"conversations", "list and read conversations", add_conversation_commands},
    {"ask", "ask the agent a question about the data; streams its work and answer",
     add_ask_command},
    {"serve", "run the HTTP API and the web UI until SIGTERM or Ctrl-C", add_serve_command},
    {"token", "API tokens for quarry serve: one per user; the file keeps only their hashes",
     add_token_commands},
};

// Where argv names the command: its first argument that is neither an option nor the value of
// one of `app`'s own options (argc if there is none, as in `quarry --help`).
int named_command(const CLI::App& app, int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--") break;
    if (!arg.starts_with('-')) return i;
    if (arg.find('=') != std::string_view::npos) continue;
    const CLI::Option* option = app.get_option_no_throw(std::string(arg));
    if (option != nullptr && option->get_type_size_min() > 0) ++i;  // its value
  }
  return argc;
}

// The first option before "--" that neither the command argv named nor the commands above it
// know, if any. CLI11 reports an unknown option after reading the whole line, and with a "--"
// after it names what follows the "--" instead ("The following argument was not expected:
// true" for `quarry sandbox exec --timout 1s ID -- true`).
std::optional<std::string> unknown_option(const CLI::App& app, int argc, char** argv) {
  const CLI::App* command = &app;
  while (!command->get_subcommands().empty())
    command = command->get_subcommands().front();
  auto find = [&](const std::string& name) -> const CLI::Option* {
    for (const CLI::App* in = command; in != nullptr; in = in->get_parent()) {
      if (const CLI::Option* option = in->get_option_no_throw(name)) return option;
    }
    return nullptr;
  };
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--") break;
    if (arg.size() < 2 || arg[0] != '-') continue;
    // --name=value, and -xyz: -x with its value or more flags after it
    const std::string name(arg.starts_with("--") ? arg.substr(0, arg.find('=')) : arg.substr(0, 2));
    const CLI::Option* option = find(name);
    if (option == nullptr) return name;
    if (option->get_type_size_min() > 0 && name == arg) ++i;  // its value, e.g. --cpus -1
  }
  return std::nullopt;
}

// Prints `error` as CLI11 does (help and --version are such "errors" too, with exit 0) and
// returns the status of a command line that was wrong: 2, as most command-line tools give, where
// CLI11 would give 105 to 109, or what the command named (`chosen`, if any) gives instead.
int usage_error(const CLI::App& app, const CLI::Error& error, const CommandGroup* chosen) {
  if (app.exit(error) == 0) return 0;
  return chosen != nullptr ? chosen->usage_exit() : kUsageExit;
}

}  // namespace

int run(int argc, char** argv, DataCommands& data) {
  GlobalOptions options;
  CLI::App app{"quarry: safe data analysis by AI agents, in isolated, metered sandboxes"};
  app.set_version_flag("--version", "quarry 0.1.0");
  app.require_subcommand(1);
  app.add_option("--config", options.config_path,
                 "configuration file (default: $QUARRY_CONFIG, else ./config.yml, else built-in "
                 "defaults)");
  // The shell expands no '~' after "--state-dir=": quarry would make a directory named "~".
  const CLI::Validator directory(
      [](const std::string& value) -> std::string {
        if (value.empty()) return "is empty: name a directory";
        if (value.starts_with('~')) {
          return "'" + value + "': quarry does not expand '~'; write the whole path";
        }
        return "";
      },
      "DIR");
  app.add_option("--state-dir", options.state_dir,
                 "state directory (default: $QUARRY_STATE_DIR, else /var/lib/quarry as root)")
      ->check(directory);
  app.add_option("--cache-dir", options.cache_dir,
                 "cache directory for images (default: $QUARRY_CACHE_DIR, else /var/cache/quarry "
                 "as root)")
      ->check(directory);
  app.add_option("--log-level", options.log_level, "trace, debug, info, warn, error or off")
      ->capture_default_str();

  Context context(options, data);
  int exit_code = 0;
  // Every command is listed, but only the one argv names gets its subcommands and options:
  // building all of them took CLI11 more instructions than the rest of `quarry --version`
  // (bench/README.md, "Command line start").
  const int at = named_command(app, argc, argv);
  const std::string_view name = at < argc ? argv[at] : "";
  const Command* named = std::ranges::find(kCommands, name, &Command::name);
  if (!name.empty() && named == std::end(kCommands)) {
    // `quarry --log-levl info sandbox ls`: what is wrong is the option, not its value.
    const auto option = unknown_option(app, at, argv);
    return usage_error(app,
                       CLI::ExtrasError(option ? "unknown option '" + *option + "'"
                                               : "unknown command '" + std::string(name) + "'",
                                        CLI::ExitCodes::ExtrasError),
                       nullptr);
  }
  std::unique_ptr<CommandGroup> chosen;
  for (const Command& command : kCommands) {
    CLI::App* group = app.add_subcommand(std::string(command.name), command.description);
    if (&command == named) chosen = command.add(*group, context, exit_code, data);
  }
  app.parse_complete_callback([&] {
    if (auto logging = setup_logging(options.log_level); !logging) {
      throw CLI::ValidationError("--log-level", logging.error().message);
    }
    // Set where no shell expands '~' (a service's environment, a quoted export), it would name
    // a directory "~" in the working directory.
    for (auto [variable, flag_given] :
         {std::pair{"QUARRY_STATE_DIR", options.state_dir.has_value()},
          {"QUARRY_CACHE_DIR", options.cache_dir.has_value()},
          {"QUARRY_CONFIG", options.config_path.has_value()}}) {
      const char* value = std::getenv(variable);
      if (!flag_given && value != nullptr && value[0] == '~') {
        throw CLI::ValidationError(variable, fmt::format("'{}': quarry does not expand '~'; set "
                                                         "it to the whole path",
                                                         value));
      }
    }
  });
  try {
    app.parse(argc, argv);
  } catch (const CLI::ExtrasError& error) {
    const auto option = unknown_option(app, argc, argv);
    if (!option) return usage_error(app, error, chosen.get());
    return usage_error(app,
                       CLI::ExtrasError("unknown option '" + *option + "'", error.get_exit_code()),
                       chosen.get());
  } catch (const CLI::ParseError& error) {
    return usage_error(app, error, chosen.get());
  }
  return exit_code;
}

}  // namespace quarry::cli

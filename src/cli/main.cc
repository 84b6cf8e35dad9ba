// quarry: the command line. `quarry --help` lists the commands; README.md documents them.
#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "common/log.h"

int main(int argc, char** argv) {
  quarry::cli::GlobalOptions options;
  CLI::App app{"quarry: safe data analysis by AI agents, in isolated, metered sandboxes"};
  app.set_version_flag("--version", "quarry 0.1.0");
  app.require_subcommand(1);
  app.add_option("--config", options.config_path,
                 "configuration file (default: $QUARRY_CONFIG, else ./config.yml, else built-in "
                 "defaults)");
  app.add_option("--state-dir", options.state_dir,
                 "state directory (default: $QUARRY_STATE_DIR, else /var/lib/quarry as root)");
  app.add_option("--cache-dir", options.cache_dir,
                 "cache directory for images (default: $QUARRY_CACHE_DIR, else /var/cache/quarry "
                 "as root)");
  app.add_option("--log-level", options.log_level, "trace, debug, info, warn, error or off")
      ->capture_default_str();

  quarry::cli::Context context(options);
  int exit_code = 0;
  auto sandbox_commands = quarry::cli::add_sandbox_commands(app, context, exit_code);
  auto image_commands = quarry::cli::add_image_commands(app, context, exit_code);
  auto db_commands = quarry::cli::add_db_commands(app, context, exit_code);
  auto conversation_commands = quarry::cli::add_conversation_commands(app, context, exit_code);
  auto ask_command = quarry::cli::add_ask_command(app, context, exit_code);
  auto serve_command = quarry::cli::add_serve_command(app, context, exit_code);
  auto token_commands = quarry::cli::add_token_commands(app, context, exit_code);
  app.parse_complete_callback([&] {
    if (auto logging = quarry::setup_logging(options.log_level); !logging) {
      throw CLI::ValidationError("--log-level", logging.error().message);
    }
  });
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    return app.exit(error);
  }
  return exit_code;
}

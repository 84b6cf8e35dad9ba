// quarry's command line, built the same way by both executables (commands.h).
#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "cli/data_commands.h"
#include "common/log.h"

namespace quarry::cli {

int run(int argc, char** argv, DataCommands& data) {
  GlobalOptions options;
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

  Context context(options, data);
  int exit_code = 0;
  auto sandbox_commands = add_sandbox_commands(app, context, exit_code);
  auto snapshot_commands = add_snapshot_commands(app, context, exit_code);
  auto image_commands = add_image_commands(app, context, exit_code);
  auto db_commands = add_db_commands(app, context, exit_code, data);
  auto conversation_commands = add_conversation_commands(app, context, exit_code);
  auto ask_command = add_ask_command(app, context, exit_code, data);
  auto serve_command = add_serve_command(app, context, exit_code, data);
  auto token_commands = add_token_commands(app, context, exit_code);
  app.parse_complete_callback([&] {
    if (auto logging = setup_logging(options.log_level); !logging) {
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

}  // namespace quarry::cli

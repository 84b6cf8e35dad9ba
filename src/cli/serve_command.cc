// quarry serve [--listen HOST:PORT]: what it parses. What it does is in data/serve.cc
// (quarry-data; data_commands.h).
#include "cli/data_commands.h"

namespace quarry::cli {

std::unique_ptr<CommandGroup> add_serve_command(CLI::App& command, Context& context, int& exit_code,
                                                DataCommands& data) {
  auto options = std::make_unique<ServeOptions>();
  command.add_option("--listen", options->listen,
                     "host:port to listen on (default: server.listen, 127.0.0.1:8080)");
  auto* log_level = command.get_parent()->get_option("--log-level");
  command.callback([&context, &exit_code, &data, &opts = *options, log_level] {
    opts.log_level_given = log_level->count() > 0;
    exit_code = data.serve(context, opts);
  });
  return options;
}

}  // namespace quarry::cli

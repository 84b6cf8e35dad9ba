// quarry serve [--listen HOST:PORT]: the HTTP API (README "The server").
#include <spdlog/spdlog.h>

#include <iostream>

#include "cli/commands.h"
#include "server/server.h"

namespace quarry::cli {
namespace {

struct ServeOptions final : CommandGroup {
  std::string listen;
};

}  // namespace

std::unique_ptr<CommandGroup> add_serve_command(CLI::App& app, Context& context, int& exit_code) {
  auto options = std::make_unique<ServeOptions>();
  auto* command =
      app.add_subcommand("serve", "run the HTTP API and the web UI until SIGTERM or Ctrl-C");
  command->add_option("--listen", options->listen,
                      "host:port to listen on (default: server.listen, 127.0.0.1:8080)");
  auto* log_level = app.get_option("--log-level");
  command->callback([&context, &exit_code, &opts = *options, log_level] {
    // A server's log is its record: requests and what happened to sandboxes, unless asked not.
    if (log_level->count() == 0) spdlog::set_level(spdlog::level::info);
    auto config = context.config();
    if (!config) return void(exit_code = report(config.error()));
    server::ServeOptions serve;
    serve.state_dir = context.state_dir();
    serve.cache_dir = context.cache_dir();
    if (!opts.listen.empty()) serve.listen = opts.listen;
    serve.version = "0.1.0";
    serve.on_listening = [](const std::string& url) {
      std::cout << "quarry is serving on " << url << std::endl;
    };
    if (auto served = server::serve(**config, serve); !served) {
      exit_code = report(served.error());
    }
  });
  return options;
}

}  // namespace quarry::cli

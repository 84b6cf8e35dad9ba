// quarry serve, as it runs (the options: serve_command.cc): the HTTP API (README "The server").
#include <spdlog/spdlog.h>

#include <iostream>

#include "cli/data/data_room.h"
#include "server/server.h"

namespace quarry::cli {

int DataRoom::serve(Context& context, const ServeOptions& options) {
  // A server's log is its record: requests and what happened to sandboxes, unless asked not.
  if (!options.log_level_given) spdlog::set_level(spdlog::level::info);
  ASSIGN_OR_RETURN_CLI(const Config* config, context.config());
  server::ServeOptions serve;
  serve.state_dir = context.state_dir();
  serve.cache_dir = context.cache_dir();
  if (!options.listen.empty()) serve.listen = options.listen;
  serve.version = "0.1.0";
  serve.on_listening = [](const std::string& url) {
    std::cout << "quarry is serving on " << url << std::endl;
  };
  Config resolved = *config;
  ASSIGN_OR_RETURN_CLI(resolved.conversations, history_config(*config, context.state_dir()));
  if (auto served = server::serve(resolved, serve); !served) return report(served.error());
  return 0;
}

}  // namespace quarry::cli

// quarry serve: the server's life from start to exit. At start it destroys the sandboxes an
// earlier run of this instance left (orphans), records turns that lost their process as
// interrupted, and reaps idle sandboxes on a timer from then on. On SIGTERM or SIGINT it stops
// accepting, lets running turns finish within server.shutdown_grace, cancels the rest (recorded
// in their history), destroys this run's sandboxes and returns; a second signal ends it at once.
#pragma once

#include <filesystem>
#include <functional>
#include <optional>
#include <string>

#include "common/error.h"
#include "config/config.h"

namespace quarry::server {

struct ServeOptions {
  std::filesystem::path state_dir;
  std::filesystem::path cache_dir;
  std::optional<std::string> listen;  // instead of server.listen
  std::string version;
  // Called once the server listens, with its URL ("http://127.0.0.1:8080").
  std::function<void(const std::string& url)> on_listening;
};

// Runs until a signal stops it; an error if it could not start.
Result<void> serve(const Config& config, const ServeOptions& options);

}  // namespace quarry::server

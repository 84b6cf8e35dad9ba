#include "cli/context.h"

#include <cstdio>

#include "cli/data_commands.h"
#include "config/paths.h"

namespace quarry::cli {

Result<const Config*> Context::config() {
  if (!config_) {
    ASSIGN_OR_RETURN(auto loaded, load_config(options_.config_path));
    config_ = std::move(loaded);
  }
  return &*config_;
}

std::filesystem::path Context::state_dir() const {
  return resolve_state_dir(options_.state_dir);
}

std::filesystem::path Context::cache_dir() const {
  return resolve_cache_dir(options_.cache_dir);
}

Result<sandbox::local::LocalProvider*> Context::local_provider() {
  if (!local_provider_) {
    ASSIGN_OR_RETURN(const Config* config, this->config());
    ASSIGN_OR_RETURN(
        local_provider_,
        sandbox::local::LocalProvider::open(
            config->sandbox, {state_dir(), cache_dir(), {}, config->capacity.overcommit, {}}));
  }
  return local_provider_.get();
}

Result<sandbox::SandboxProvider*> Context::provider() {
  ASSIGN_OR_RETURN(const Config* config, this->config());
  if (config->sandbox.provider == "local") return local_provider();
  if (!remote_provider_) {
    ASSIGN_OR_RETURN(remote_provider_, data_.remote_provider(*this));
  }
  return remote_provider_.get();
}

Result<conversation::HistoryStore*> Context::history() {
  if (!history_) {
    ASSIGN_OR_RETURN(history_, data_.open_history(*this));
  }
  return history_.get();
}

int report(const Error& error) {
  std::fprintf(stderr, "quarry: %s\n", error.message.c_str());
  return 1;
}

std::string age(std::chrono::system_clock::time_point when) {
  auto seconds =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now() - when)
          .count();
  if (seconds < 120) return fmt::format("{}s", seconds);
  if (seconds < 7200) return fmt::format("{}m", seconds / 60);
  if (seconds < 172800) return fmt::format("{}h", seconds / 3600);
  return fmt::format("{}d", seconds / 86400);
}

}  // namespace quarry::cli

// What every command needs: the global options, the configuration and the sandbox provider,
// loaded on first use so that `quarry --help` works anywhere.
#pragma once

#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include "common/clock.h"
#include "common/error.h"
#include "config/config.h"
#include "conversation/sqlite_history_store.h"
#include "sandbox/local/local_provider.h"

namespace quarry::cli {

struct GlobalOptions {
  std::optional<std::filesystem::path> config_path;
  std::optional<std::filesystem::path> state_dir;
  std::optional<std::filesystem::path> cache_dir;
  std::string log_level = "warn";
};

class Context {
 public:
  explicit Context(const GlobalOptions& options) : options_(options) {}

  Result<const Config*> config();
  Result<sandbox::local::LocalProvider*> provider();
  // The conversation history, <state>/history.db.
  Result<conversation::HistoryStore*> history();
  std::filesystem::path state_dir() const;
  std::filesystem::path cache_dir() const;

 private:
  const GlobalOptions& options_;
  std::optional<Config> config_;
  std::unique_ptr<sandbox::local::LocalProvider> provider_;
  SystemClock clock_;
  std::unique_ptr<conversation::SqliteHistoryStore> history_;
};

// Prints "quarry: <message>" on stderr and returns the exit status for a failed command.
int report(const Error& error);

}  // namespace quarry::cli

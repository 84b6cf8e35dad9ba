// What every command needs: the global options, the configuration and the sandbox provider,
// loaded on first use so that `quarry --help` works anywhere.
#pragma once

#include <chrono>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include "common/clock.h"
#include "common/error.h"
#include "config/config.h"
#include "conversation/history_store.h"
#include "sandbox/local/local_provider.h"

namespace quarry::cli {

struct GlobalOptions {
  std::optional<std::filesystem::path> config_path;
  std::optional<std::filesystem::path> state_dir;
  std::optional<std::filesystem::path> cache_dir;
  std::string log_level = "warn";
};

class DataCommands;

class Context {
 public:
  // `data` opens the history (DataCommands::open_history) and a remote provider
  // (DataCommands::remote_provider).
  Context(const GlobalOptions& options, DataCommands& data) : options_(options), data_(data) {}

  Result<const Config*> config();
  // The provider sandbox.provider names: where sandbox commands and conversations run. In quarry
  // a remote one hands the command to quarry-data (which links the HTTP client) and does not
  // return.
  Result<sandbox::SandboxProvider*> provider();
  // The local provider, whichever is configured: images and snapshots are the local ones.
  Result<sandbox::local::LocalProvider*> local_provider();
  // The conversation history conversations.store names. In quarry, a PostgreSQL history hands
  // the command to quarry-data (which links libpq) and does not return; so a command opens the
  // history before it does or prints anything else.
  Result<conversation::HistoryStore*> history();
  std::filesystem::path state_dir() const;
  std::filesystem::path cache_dir() const;

 private:
  const GlobalOptions& options_;
  DataCommands& data_;
  std::optional<Config> config_;
  std::unique_ptr<sandbox::local::LocalProvider> local_provider_;
  std::unique_ptr<sandbox::SandboxProvider> remote_provider_;
  SystemClock clock_;
  std::unique_ptr<conversation::HistoryStore> history_;
};

// Prints "quarry: <message>" on stderr and returns the exit status for a failed command.
int report(const Error& error);

// How long ago `when` was, coarsely, for tables: 45s, 12m, 3h, 2d.
std::string age(std::chrono::system_clock::time_point when);

}  // namespace quarry::cli

// In a command returning its exit status: on error, report it and return 1.
#define ASSIGN_OR_RETURN_CLI(lhs, expr) \
  QUARRY_ASSIGN_OR_RETURN_CLI_IMPL(QUARRY_CONCAT(quarry_cli_result_, __LINE__), lhs, expr)
#define QUARRY_ASSIGN_OR_RETURN_CLI_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                     \
  if (!tmp) return ::quarry::cli::report(tmp.error());   \
  lhs = std::move(*tmp)

namespace quarry::cli {}  // namespace quarry::cli

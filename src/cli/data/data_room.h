// quarry-data's side of data_commands.h: db, ask and serve as they run, with Arrow, Parquet and
// libpq linked (one file per command group: db.cc, ask.cc, serve.cc; history.cc opens either
// history store).
#pragma once

#include <filesystem>

#include "cli/data_commands.h"
#include "config/config.h"

namespace quarry::cli {

// The conversations' configuration with its history found: conversations.store postgres
// without a url is the database quarry_history of quarry's private PostgreSQL (made on first
// use; the server must be up: `quarry db up`), as database.url empty is its analytics.
Result<ConversationsConfig> history_config(const Config& config,
                                           const std::filesystem::path& state_dir);

class DataRoom final : public DataCommands {
 public:
  int db_up(Context& context) override;
  int db_down(Context& context) override;
  int db_seed_demo(Context& context, const DbOptions& options) override;
  int db_query(Context& context, const DbOptions& options) override;
  int db_export(Context& context, const DbOptions& options) override;
  int ask(Context& context, const AskOptions& options) override;
  int serve(Context& context, const ServeOptions& options) override;
  Result<std::unique_ptr<sandbox::SandboxProvider>> remote_provider(Context& context) override;
  Result<std::unique_ptr<conversation::HistoryStore>> open_history(Context& context) override;

 private:
  SystemClock clock_;
};

}  // namespace quarry::cli

// The commands of the data room: db, ask and serve. What they parse is defined with the rest of
// the command line (db_commands.cc, ask_command.cc, serve_command.cc), in both executables, so
// `quarry` checks and explains them exactly as it does every other command. What they do needs
// Arrow, Parquet and libpq, which the sandbox commands never use and should not pay to load: it
// is in quarry-data (cli/data/), and `quarry` hands these commands to it (cli/main.cc).
#pragma once

#include <string>

#include "cli/commands.h"
#include "conversation/history_store.h"
#include "data/demo_data.h"

namespace quarry::cli {

// What the db subcommands parse into.
struct DbOptions final : CommandGroup {
  data::DemoOptions demo;
  std::string query_sql;
  bool query_json = false;
  std::string export_sql, export_file, export_sandbox;
  bool export_json = false;
};

struct AskOptions final : CommandGroup {
  std::string question;
  std::string conversation_id;
  std::vector<std::string> packages;  // of a new conversation
};

struct ServeOptions final : CommandGroup {
  std::string listen;
  bool log_level_given = false;  // --log-level: else a server logs at info
};

// Runs a command of the data room once its command line is parsed; returns its exit status.
class DataCommands {
 public:
  virtual ~DataCommands() = default;
  virtual int db_up(Context& context) = 0;
  virtual int db_down(Context& context) = 0;
  virtual int db_seed_demo(Context& context, const DbOptions& options) = 0;
  virtual int db_query(Context& context, const DbOptions& options) = 0;
  virtual int db_export(Context& context, const DbOptions& options) = 0;
  virtual int ask(Context& context, const AskOptions& options) = 0;
  virtual int serve(Context& context, const ServeOptions& options) = 0;
  // The provider sandbox.provider names when it is remote (Context::provider).
  virtual Result<std::unique_ptr<sandbox::SandboxProvider>> remote_provider(Context& context) = 0;
  // The history conversations.store names (Context::history). quarry opens SQLite itself and
  // hands the command to quarry-data for PostgreSQL, returning only if that fails.
  virtual Result<std::unique_ptr<conversation::HistoryStore>> open_history(Context& context) = 0;
};

}  // namespace quarry::cli

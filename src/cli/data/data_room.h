// quarry-data's side of data_commands.h: db, ask and serve as they run, with Arrow, Parquet and
// libpq linked (one file per command group: db.cc, ask.cc, serve.cc; history.cc opens either
// history store).
#pragma once

#include "cli/data_commands.h"

namespace quarry::cli {

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

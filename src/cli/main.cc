// quarry: the command line (README "Command line"). It runs the sandbox, image, conversations
// and token commands itself and hands db, ask and serve (and the conversations commands of a
// PostgreSQL history), once their command line is parsed, to quarry-data beside it (the same argv,
// by exec: the same process, its pid and its signals), so that the commands which never touch data
// do not map Arrow, Parquet and libpq at every start (docs/architecture.md, "The command line").
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "cli/data_commands.h"
#include "common/file_util.h"
#include "conversation/sqlite_history_store.h"

namespace quarry::cli {
namespace {

class HandOver final : public DataCommands {
 public:
  explicit HandOver(char** argv) : argv_(argv) {}

  int db_up(Context&) override { return hand_over(); }
  int db_down(Context&) override { return hand_over(); }
  int db_seed_demo(Context&, const DbOptions&) override { return hand_over(); }
  int db_query(Context&, const DbOptions&) override { return hand_over(); }
  int db_export(Context&, const DbOptions&) override { return hand_over(); }
  int ask(Context&, const AskOptions&) override { return hand_over(); }
  int serve(Context&, const ServeOptions&) override { return hand_over(); }
  // A remote provider's commands (sandbox.provider: daytona) run in quarry-data too, which
  // links the HTTP client.
  Result<std::unique_ptr<sandbox::SandboxProvider>> remote_provider(Context&) override {
    return std::unexpected(exec_data());
  }

  // A PostgreSQL history needs libpq: the whole command goes to quarry-data, which opens it.
  Result<std::unique_ptr<conversation::HistoryStore>> open_history(Context& context) override {
    ASSIGN_OR_RETURN(const Config* config, context.config());
    if (config->conversations.store == "postgres") return std::unexpected(exec_data());
    RETURN_IF_ERROR(make_directories(context.state_dir(), 0755));
    ASSIGN_OR_RETURN(auto store, conversation::SqliteHistoryStore::open(
                                     context.state_dir() / "history.db", clock_));
    return store;
  }

 private:
  int hand_over() const { return report(exec_data()); }

  // Returns only if quarry-data could not be run.
  Error exec_data() const {
    const auto data_binary = this_executable().parent_path() / "quarry-data";
    ::execv(data_binary.c_str(), argv_);
    const int error = errno;
    return Error{ErrorCode::kFailedPrecondition,
                 fmt::format("cannot run '{}': {}; quarry runs db, ask, serve, the commands "
                             "of a remote sandbox provider and (with conversations.store: "
                             "postgres) conversations through quarry-data, which the build puts "
                             "beside quarry",
                             data_binary.string(), strerrordesc_np(error))};
  }

  SystemClock clock_;

  char** argv_;
};

}  // namespace
}  // namespace quarry::cli

int main(int argc, char** argv) {
  quarry::cli::HandOver hand_over(argv);
  return quarry::cli::run(argc, argv, hand_over);
}

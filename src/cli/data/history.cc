// The history quarry-data opens for any command: the store conversations.store names (quarry
// hands the conversations commands over when that is PostgreSQL).
#include "cli/data/data_room.h"
#include "conversation/open_history_store.h"
#include "data/postgres_server.h"

namespace quarry::cli {

Result<ConversationsConfig> history_config(const Config& config,
                                           const std::filesystem::path& state_dir) {
  ConversationsConfig conversations = config.conversations;
  if (conversations.store != "postgres" || !conversations.url.empty()) return conversations;
  data::PostgresServer server(state_dir, config.database.port);
  if (!server.running()) {
    return make_error(ErrorCode::kFailedPrecondition,
                      "conversations.store is postgres without conversations.url, so the history "
                      "is in quarry's private PostgreSQL, which is not running: start it with "
                      "`quarry db up`, or set conversations.url to another server");
  }
  auto url = server.history_conninfo();
  if (!url) {
    return std::unexpected(
        std::move(url).error().with_context("opening the history in quarry's private PostgreSQL"));
  }
  conversations.url = std::move(*url);
  return conversations;
}

Result<std::unique_ptr<conversation::HistoryStore>> DataRoom::open_history(Context& context) {
  ASSIGN_OR_RETURN(const Config* config, context.config());
  ASSIGN_OR_RETURN(auto conversations, history_config(*config, context.state_dir()));
  return conversation::open_history_store(conversations, context.state_dir(), clock_);
}

}  // namespace quarry::cli

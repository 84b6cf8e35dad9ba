#include "conversation/open_history_store.h"

#include "common/file_util.h"
#include "conversation/postgres_history_store.h"
#include "conversation/sqlite_history_store.h"

namespace quarry::conversation {

Result<std::unique_ptr<HistoryStore>> open_history_store(const ConversationsConfig& config,
                                                         const std::filesystem::path& state_dir,
                                                         const Clock& clock) {
  if (config.store == "postgres") {
    ASSIGN_OR_RETURN(auto store, PostgresHistoryStore::open(config.url, clock));
    return store;
  }
  RETURN_IF_ERROR(make_directories(state_dir, 0755));
  ASSIGN_OR_RETURN(auto store, SqliteHistoryStore::open(state_dir / "history.db", clock));
  return store;
}

}  // namespace quarry::conversation

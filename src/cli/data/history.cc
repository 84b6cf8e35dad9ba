// The history quarry-data opens for any command: the store conversations.store names (quarry
// hands the conversations commands over when that is PostgreSQL).
#include "cli/data/data_room.h"
#include "conversation/open_history_store.h"

namespace quarry::cli {

Result<std::unique_ptr<conversation::HistoryStore>> DataRoom::open_history(Context& context) {
  ASSIGN_OR_RETURN(const Config* config, context.config());
  return conversation::open_history_store(config->conversations, context.state_dir(), clock_);
}

}  // namespace quarry::cli

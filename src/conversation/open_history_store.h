// The history store conversations.store names: SQLite in <state>/history.db, or PostgreSQL at
// conversations.url. It links libpq, so only what may use either links it (quarry-data: serve,
// ask, and the conversations commands that quarry hands over for a PostgreSQL history).
#pragma once

#include <filesystem>
#include <memory>

#include "common/clock.h"
#include "config/config.h"
#include "conversation/history_store.h"

namespace quarry::conversation {

Result<std::unique_ptr<HistoryStore>> open_history_store(const ConversationsConfig& config,
                                                         const std::filesystem::path& state_dir,
                                                         const Clock& clock);

}  // namespace quarry::conversation

#include "data/database.h"

#include "data/postgres_server.h"

namespace quarry::data {

Result<DatabaseTarget> resolve_database(const DatabaseConfig& config,
                                        const std::filesystem::path& state_dir) {
  if (!config.url.empty()) return DatabaseTarget{config.url, config.url, true};
  ASSIGN_OR_RETURN(auto server, PostgresServer(state_dir, config.port).running());
  return DatabaseTarget{server.reader_conninfo, server.admin_conninfo, false};
}

}  // namespace quarry::data

// Which PostgreSQL quarry talks to: database.url when it is set, else the private server of
// `quarry db up` (its credentials come from the state directory).
#pragma once

#include <filesystem>
#include <string>

#include "common/error.h"
#include "config/config.h"

namespace quarry::data {

struct DatabaseTarget {
  std::string reader;  // conninfo for query_database and export_query
  std::string admin;   // conninfo that may create tables (seed-demo)
  bool external = false;
};

Result<DatabaseTarget> resolve_database(const DatabaseConfig& config,
                                        const std::filesystem::path& state_dir);

}  // namespace quarry::data

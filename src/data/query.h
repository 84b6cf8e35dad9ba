// query_database: a small answer the model can read. The SQL runs in a READ ONLY transaction
// with a statement timeout, and at most `max_rows` rows come back, with a plain note when
// there were more.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/units.h"
#include "data/statement.h"

namespace quarry::data {

struct QueryOptions {
  uint64_t max_rows = 200;
  Duration statement_timeout = std::chrono::seconds(30);
};

struct QueryResult {
  std::vector<ColumnDescription> columns;
  // Values in PostgreSQL's text form; nullopt is NULL.
  std::vector<std::vector<std::optional<std::string>>> rows;
  bool truncated = false;  // the query had more rows than max_rows
  uint64_t max_rows = 0;
  double elapsed_ms = 0;
};

Result<QueryResult> query_database(const std::string& conninfo, std::string_view sql,
                                   const QueryOptions& options);

// {"columns": [{"name", "type"}], "rows": [[...]], "row_count", "truncated", "max_rows",
//  "elapsed_ms"}; integers, floats and booleans as JSON numbers and booleans, the rest as text.
nlohmann::json to_json(const QueryResult& result);

// An aligned text table with a last line that says how many rows there are and whether the
// result was cut (what the model reads).
std::string to_text(const QueryResult& result);

}  // namespace quarry::data

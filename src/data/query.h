// query_database: a small answer the model can read. The SQL runs in a READ ONLY transaction
// with a statement timeout, and at most `max_rows` rows come back, with a plain note when
// there were more. Only the start of each value is kept, and the rows stop at a bound of bytes,
// so what one query keeps is small whatever its values are.
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
  // The start of each value that is kept (to_text shows 80 bytes of it, to_json all).
  uint64_t max_value_bytes = 4096;
  // The values' bytes kept in all: the rows stop before the one that would pass it.
  uint64_t max_bytes = 16 << 20;
  // Readable (a Stop, Ctrl-C or shutdown): the running query is cancelled on the server and
  // the call returns kCancelled. -1: nothing stops it but the statement timeout.
  int cancel_fd = -1;
};

struct QueryResult {
  std::vector<ColumnDescription> columns;
  // Values in PostgreSQL's text form, at most max_value_bytes of each (cut where a UTF-8
  // character ends); nullopt is NULL.
  std::vector<std::vector<std::optional<std::string>>> rows;
  bool truncated = false;  // the query had more rows than max_rows, or more bytes than max_bytes
  bool bytes_cut = false;  // cut at max_bytes
  uint64_t max_rows = 0;
  uint64_t max_bytes = 0;
  uint64_t values_cut = 0;  // values of which only the start is kept
  uint64_t max_value_bytes = 0;
  double elapsed_ms = 0;
};

Result<QueryResult> query_database(const std::string& conninfo, std::string_view sql,
                                   const QueryOptions& options);

// {"columns": [{"name", "type"}], "rows": [[...]], "row_count", "truncated", "max_rows",
//  "max_bytes", "values_cut", "max_value_bytes", "elapsed_ms"}; integers, floats and booleans
//  as JSON numbers and booleans, the rest as text.
nlohmann::json to_json(const QueryResult& result);

// An aligned text table with a last line that says how many rows there are and whether the
// result was cut (what the model reads).
std::string to_text(const QueryResult& result);

}  // namespace quarry::data

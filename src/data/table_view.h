// A page of a table file (CSV or Parquet, as analyses save them), sorted by a column, as JSON:
// what a client shows of an artifact without downloading all of it. Read with Arrow C++.
#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "common/error.h"

namespace quarry::data {

struct TablePageRequest {
  uint64_t offset = 0;
  uint64_t limit = 50;
  std::string sort;  // a column name; empty: the file's order
  bool descending = false;
  uint64_t max_file_bytes = 64ull << 20;  // the whole file is read: larger ones are refused
  // What reading (and sorting) the table may take in memory: a small file can hold many values.
  uint64_t max_memory_bytes = 1ull << 30;
};

// {"columns": [{"name", "type"}], "rows": [[...], ...], "total_rows", "offset", "limit"}.
// Values are JSON numbers, strings, booleans or null; other types are written as text, and
// numbers a JavaScript client cannot hold exactly (NaN, infinities, integers beyond 2^53) as
// text too. `type` is "csv" or "parquet". kInvalidArgument for an unknown sort column;
// kFailedPrecondition for a file that is not a readable table of that type;
// kResourceExhausted for a file larger than `max_file_bytes`, or one whose table takes more than
// `max_memory_bytes` to read and sort.
Result<nlohmann::json> read_table_page(const std::filesystem::path& path, std::string_view type,
                                       const TablePageRequest& request);

}  // namespace quarry::data

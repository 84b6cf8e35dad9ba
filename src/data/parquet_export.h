// The export itself: streams a query's rows from PostgreSQL (binary COPY) through Arrow
// builders into a Parquet file (zstd), one row group at a time, so memory stays bounded by
// one row group whatever the row count.
#pragma once

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/units.h"
#include "config/config.h"

namespace quarry::data {

struct ExportOptions {
  uint64_t max_rows = 100000;  // sandbox.export_max_rows
  Duration statement_timeout = std::chrono::seconds(30);
  uint64_t row_group_rows = 131072;
  // A row group also ends when its values reach this many bytes as PostgreSQL sent them (each
  // with its 4-byte length, so that NULLs count too).
  uint64_t row_group_bytes = 64 * kMiB;
  // Called after each row group with the rows written so far (for progress lines).
  std::function<void(uint64_t rows)> on_progress;
  // Readable: the export stops, its query cancelled on the server (kCancelled). -1: none.
  int cancel_fd = -1;
};

// The options config.yml sets: sandbox.export_max_rows, database.statement_timeout and
// database.export_row_group_rows.
ExportOptions export_options(const Config& config);

struct ExportedColumn {
  std::string name;
  std::string sql_type;      // as PostgreSQL names it: "numeric(12,2)"
  std::string parquet_type;  // as Arrow names it: "decimal128(12, 2)"
  std::string note;          // how the type was mapped, where a reader should know (pg_types.h)
};

struct ExportSummary {
  std::vector<ExportedColumn> columns;
  uint64_t rows = 0;
  bool truncated = false;  // the query had more rows than max_rows
  uint64_t max_rows = 0;
  uint64_t bytes = 0;  // size of the Parquet file
  double elapsed_ms = 0;
  int runs = 1;  // how often the query ran: again when later values needed wider types
};

// Runs `sql` read-only on `conninfo` and writes its rows to `file` (replaced if it exists).
// On error the file is removed: it is either complete or absent.
Result<ExportSummary> export_parquet(const std::string& conninfo, std::string_view sql,
                                     const std::filesystem::path& file,
                                     const ExportOptions& options);

}  // namespace quarry::data

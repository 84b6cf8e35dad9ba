// export_query(sql, filename): a query's rows as a Parquet file in a sandbox's data_dir, for
// the analysis code to read without the data passing through the model. The file is written
// on the host first and uploaded only when complete.
#pragma once

#include <filesystem>
#include <functional>
#include <iosfwd>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "common/error.h"
#include "data/parquet_export.h"
#include "sandbox/provider.h"

namespace quarry::data {

// A plain file name: a letter or digit, then up to 99 letters, digits, '.', '_' or '-', ending
// in ".parquet". No paths, no "..", no hidden files.
Result<void> validate_export_filename(std::string_view filename);

// Puts the finished file at `path` inside the sandbox: a provider's write_file for a sandbox
// id, or a conversation's LazySandbox, which knows no id.
using Upload = std::function<Result<void>(std::string_view path, std::istream& content)>;

struct SandboxExportRequest {
  std::string data_dir;  // sandbox.data_dir
  std::string conninfo;
  std::string sql;
  std::string filename;
  ExportOptions options;
  std::filesystem::path temp_dir;  // where the file is written before upload; made if missing
};

struct SandboxExport {
  std::string path;  // inside the sandbox
  ExportSummary summary;
};

Result<SandboxExport> export_to_sandbox(const SandboxExportRequest& request, const Upload& upload);

// The upload into sandbox `id` of `provider`, refusing a stopped sandbox before any query runs;
// stopped with kCancelled once `cancel_fd` (-1: none) is readable.
Result<Upload> upload_to(sandbox::SandboxProvider& provider, std::string id, int cancel_fd);

// What the tool returns: {"path", "rows", "truncated", "max_rows", "bytes", "elapsed_ms",
// "columns": [{"name", "type", "parquet_type"}], "message"}; the message says in words when
// rows were cut.
nlohmann::json to_json(const SandboxExport& result);
nlohmann::json to_json(const ExportSummary& summary);

}  // namespace quarry::data

// quarry db up | down | seed-demo | query | export, as they run (the options: db_commands.cc).
#include <iostream>

#include "cli/cancel_signals.h"
#include "cli/data/data_room.h"
#include "common/file_util.h"
#include "common/progress.h"
#include "common/units.h"
#include "data/database.h"
#include "data/demo_data.h"
#include "data/postgres_server.h"
#include "data/query.h"
#include "data/sandbox_export.h"

namespace quarry::cli {
namespace {

// A failed query or export; after Ctrl-C (its query cancelled on the server) as the other long
// commands say it.
int report_stopped(const Error& error) {
  if (error.code != ErrorCode::kCancelled) return report(error);
  std::cerr << "quarry: cancelled\n";
  return kCancelledExit;
}

// Progress lines for a long export: at most one per million rows.
std::function<void(uint64_t)> export_progress(Progress& progress) {
  return [&progress, last = uint64_t{0}](uint64_t rows) mutable {
    if (rows - last < 1'000'000) return;
    last = rows;
    progress.step(fmt::format("{} rows", rows));
  };
}

void print_export(const data::ExportSummary& summary, std::string_view where) {
  std::cout << fmt::format("{}: {} rows, {}, {}\n", where, summary.rows, format_size(summary.bytes),
                           format_elapsed(summary.elapsed_ms));
  for (const auto& column : summary.columns) {
    std::cout << fmt::format("  {}: {} -> {}{}\n", column.name, column.sql_type,
                             column.parquet_type, column.note.empty() ? "" : ": " + column.note);
  }
  if (summary.truncated) {
    std::cout << fmt::format("cut at sandbox.export_max_rows = {}: the query returns more rows\n",
                             summary.max_rows);
  }
}

// A host file the export can be written to, said before any query runs: a Parquet name, in a
// directory that exists, and not a directory itself.
Result<void> check_host_file(const std::filesystem::path& file) {
  if (file.extension() != ".parquet") {
    return make_error(ErrorCode::kInvalidArgument,
                      "'{}': quarry db export writes Parquet; give the file a name ending in "
                      ".parquet, e.g. result.parquet",
                      file.string());
  }
  std::error_code error;
  if (std::filesystem::is_directory(file, error)) {
    return make_error(ErrorCode::kInvalidArgument, "'{}' is a directory; name a file in it",
                      file.string());
  }
  const auto directory = file.parent_path().empty() ? "." : file.parent_path();
  if (!std::filesystem::is_directory(directory, error)) {
    return make_error(ErrorCode::kNotFound,
                      "cannot write '{}': there is no directory '{}' (make it first)",
                      file.string(), directory.string());
  }
  return {};
}

// Host export: written beside FILE and renamed over it once complete.
Result<data::ExportSummary> export_to_host(const std::string& conninfo, const std::string& sql,
                                           const std::filesystem::path& file,
                                           data::ExportOptions options) {
  RETURN_IF_ERROR(check_host_file(file));
  return write_then_rename(file, [&](const std::filesystem::path& partial) {
    return data::export_parquet(conninfo, sql, partial, options);
  });
}

Result<data::PostgresServer> private_server(Context& context) {
  ASSIGN_OR_RETURN(const Config* config, context.config());
  if (!config->database.url.empty()) {
    return make_error(ErrorCode::kFailedPrecondition,
                      "database.url is set in {}, so quarry uses that server and runs none of "
                      "its own",
                      config->source);
  }
  return data::PostgresServer(context.state_dir(), config->database.port);
}

}  // namespace

int DataRoom::db_up(Context& context) {
  ASSIGN_OR_RETURN_CLI(auto server, private_server(context));
  Progress progress("db up", 0);
  auto info = server.up(&progress);
  if (!info) return report(info.error().with_context("db up"));
  progress.finish(
      fmt::format("running on 127.0.0.1:{} and {}", info->port, info->socket_dir.string()));
  std::cout << info->reader_url << std::endl;
  return 0;
}

int DataRoom::db_down(Context& context) {
  ASSIGN_OR_RETURN_CLI(auto server, private_server(context));
  auto stopped = server.down();
  if (!stopped) return report(stopped.error().with_context("db down"));
  std::cerr << (*stopped ? "stopped" : "was not running") << std::endl;
  return 0;
}

int DataRoom::db_seed_demo(Context& context, const DbOptions& options) {
  ASSIGN_OR_RETURN_CLI(const Config* config, context.config());
  ASSIGN_OR_RETURN_CLI(auto target, data::resolve_database(config->database, context.state_dir()));
  Progress progress("seed-demo", 3);
  auto summary = data::seed_demo(target.admin, options.demo, progress);
  if (!summary) return report(summary.error().with_context("seed-demo"));
  progress.finish(fmt::format("{} videos in {} daily rows, {} events", summary->videos,
                              summary->video_rows, summary->events));
  return 0;
}

int DataRoom::db_query(Context& context, const DbOptions& options) {
  ASSIGN_OR_RETURN_CLI(const Config* config, context.config());
  ASSIGN_OR_RETURN_CLI(auto target, data::resolve_database(config->database, context.state_dir()));
  CancelSignals cancel;
  data::QueryOptions query_options{config->database.query_max_rows,
                                   config->database.statement_timeout};
  query_options.cancel_fd = cancel.fd();
  auto result = data::query_database(target.reader, options.query_sql, query_options);
  if (!result) return report_stopped(result.error());
  if (options.query_json) {
    std::cout << data::to_json(*result).dump(2, ' ', false,
                                             nlohmann::json::error_handler_t::replace)
              << std::endl;
  } else {
    std::cout << data::to_text(*result);
  }
  return 0;
}

int DataRoom::db_export(Context& context, const DbOptions& options) {
  ASSIGN_OR_RETURN_CLI(const Config* config, context.config());
  ASSIGN_OR_RETURN_CLI(auto target, data::resolve_database(config->database, context.state_dir()));
  Progress progress("export", 0);
  CancelSignals cancel;
  auto export_options = data::export_options(*config);
  export_options.on_progress = export_progress(progress);
  export_options.cancel_fd = cancel.fd();
  if (options.export_sandbox.empty()) {
    auto exported =
        export_to_host(target.reader, options.export_sql, options.export_file, export_options);
    if (!exported) return report_stopped(exported.error());
    const auto& summary = *exported;
    progress.finish(fmt::format("{} rows", summary.rows));
    if (options.export_json) {
      auto json = data::to_json(summary);
      json["path"] = std::filesystem::absolute(options.export_file).string();
      std::cout << json.dump(2) << std::endl;
    } else {
      print_export(summary, options.export_file);
    }
    return 0;
  }
  if (auto valid = data::validate_export_filename(options.export_file); !valid) {
    return report(valid.error());
  }
  ASSIGN_OR_RETURN_CLI(auto* provider, context.provider());
  // The file waits for its upload on quarry's own disk, not in a /tmp that may be memory.
  const auto temp_dir = context.state_dir() / "tmp";
  ASSIGN_OR_RETURN_CLI(auto upload,
                       data::upload_to(*provider, options.export_sandbox, cancel.fd()));
  data::SandboxExportRequest request{config->sandbox.data_dir, target.reader,  options.export_sql,
                                     options.export_file,      export_options, temp_dir};
  auto exported = data::export_to_sandbox(request, upload);
  if (!exported) return report_stopped(exported.error());
  const auto& result = *exported;
  progress.finish(fmt::format("{} rows", result.summary.rows));
  if (options.export_json) {
    std::cout << data::to_json(result).dump(2) << std::endl;
  } else {
    print_export(result.summary, fmt::format("{}:{}", options.export_sandbox, result.path));
  }
  return 0;
}

}  // namespace quarry::cli

// quarry db up | down | seed-demo | query | export
#include <iostream>

#include "cli/commands.h"
#include "common/file_util.h"
#include "common/progress.h"
#include "data/database.h"
#include "data/demo_data.h"
#include "data/postgres_server.h"
#include "data/query.h"
#include "data/sandbox_export.h"

namespace quarry::cli {
namespace {

// Progress lines for a long export: at most one per million rows.
std::function<void(uint64_t)> export_progress(Progress& progress) {
  return [&progress, last = uint64_t{0}](uint64_t rows) mutable {
    if (rows - last < 1'000'000) return;
    last = rows;
    progress.step(fmt::format("{} rows", rows));
  };
}

void print_export(const data::ExportSummary& summary, std::string_view where) {
  std::cout << fmt::format("{}: {} rows, {}, {:.0f} ms\n", where, summary.rows,
                           format_size(summary.bytes), summary.elapsed_ms);
  for (const auto& column : summary.columns) {
    std::cout << fmt::format("  {}: {} -> {}{}\n", column.name, column.sql_type,
                             column.parquet_type, column.note.empty() ? "" : ": " + column.note);
  }
  if (summary.truncated) {
    std::cout << fmt::format("cut at sandbox.export_max_rows = {}: the query returns more rows\n",
                             summary.max_rows);
  }
}

// Host export: written beside FILE and renamed over it once complete.
Result<data::ExportSummary> export_to_host(const std::string& conninfo, const std::string& sql,
                                           const std::filesystem::path& file,
                                           data::ExportOptions options) {
  std::filesystem::path partial = file;
  partial += ".quarry-partial";
  ASSIGN_OR_RETURN(auto summary, data::export_parquet(conninfo, sql, partial, options));
  std::error_code error;
  std::filesystem::rename(partial, file, error);
  if (error) {
    std::error_code ignored;
    std::filesystem::remove(partial, ignored);
    return make_error(ErrorCode::kInternal, "renaming the export to '{}' failed: {}", file.string(),
                      error.message());
  }
  return summary;
}

// What the db subcommands parse into.
struct DbOptions final : CommandGroup {
  data::DemoOptions demo;
  std::string query_sql;
  bool query_json = false;
  std::string export_sql, export_file, export_sandbox;
  bool export_json = false;
};

}  // namespace

std::unique_ptr<CommandGroup> add_db_commands(CLI::App& app, Context& context, int& exit_code) {
  auto options = std::make_unique<DbOptions>();
  auto& [demo, query_sql, query_json, export_sql, export_file, export_sandbox, export_json] =
      *options;
  auto* group = app.add_subcommand("db", "quarry's PostgreSQL: start, stop, seed, query, export");
  group->require_subcommand(1);

  auto private_server = [&]() -> Result<data::PostgresServer> {
    ASSIGN_OR_RETURN(const Config* config, context.config());
    if (!config->database.url.empty()) {
      return make_error(ErrorCode::kFailedPrecondition,
                        "database.url is set in {}, so quarry uses that server and runs none of "
                        "its own",
                        config->source);
    }
    return data::PostgresServer(context.state_dir(), config->database.port);
  };

  auto* up = group->add_subcommand(
      "up", "start quarry's private PostgreSQL (initialised on first use); prints its URL");
  up->callback([&, private_server] {
    auto server = private_server();
    if (!server) return void(exit_code = report(server.error()));
    Progress progress("db up", 0);
    auto info = server->up(&progress);
    if (!info) return void(exit_code = report(info.error().with_context("db up")));
    progress.finish(
        fmt::format("running on 127.0.0.1:{} and {}", info->port, info->socket_dir.string()));
    std::cout << info->reader_url << std::endl;
  });

  auto* down = group->add_subcommand("down", "stop quarry's private PostgreSQL");
  down->callback([&, private_server] {
    auto server = private_server();
    if (!server) return void(exit_code = report(server.error()));
    auto stopped = server->down();
    if (!stopped) return void(exit_code = report(stopped.error().with_context("db down")));
    std::cerr << (*stopped ? "stopped" : "was not running") << std::endl;
  });

  auto* seed = group->add_subcommand(
      "seed-demo", "load the demo tables trending_videos and events (replacing them)");
  seed->add_option("--events", demo.events, "rows of the events table")
      ->capture_default_str()
      ->check(CLI::Range(uint64_t{1}, uint64_t{1'000'000'000}));
  seed->add_option("--seed", demo.seed, "seed of the pseudo-random data")->capture_default_str();
  seed->callback([&] {
    auto config = context.config();
    if (!config) return void(exit_code = report(config.error()));
    auto target = data::resolve_database((*config)->database, context.state_dir());
    if (!target) return void(exit_code = report(target.error()));
    Progress progress("seed-demo", 3);
    auto summary = data::seed_demo(target->admin, demo, progress);
    if (!summary) return void(exit_code = report(summary.error().with_context("seed-demo")));
    progress.finish(fmt::format("{} videos in {} daily rows, {} events", summary->videos,
                                summary->video_rows, summary->events));
  });

  auto* query = group->add_subcommand(
      "query", "run a read-only query as query_database does (at most database.query_max_rows)");
  query->add_option("sql", query_sql, "the SQL")->required();
  query->add_flag("--json", query_json, "print the result as JSON");
  query->callback([&] {
    auto config = context.config();
    if (!config) return void(exit_code = report(config.error()));
    auto target = data::resolve_database((*config)->database, context.state_dir());
    if (!target) return void(exit_code = report(target.error()));
    auto result = data::query_database(
        target->reader, query_sql,
        {(*config)->database.query_max_rows, (*config)->database.statement_timeout});
    if (!result) return void(exit_code = report(result.error()));
    if (query_json) {
      std::cout << data::to_json(*result).dump(2, ' ', false,
                                               nlohmann::json::error_handler_t::replace)
                << std::endl;
    } else {
      std::cout << data::to_text(*result);
    }
  });

  auto* exporter = group->add_subcommand(
      "export",
      "export a query to Parquet: to a host FILE.parquet, or with --sandbox ID to NAME.parquet "
      "in that sandbox's data_dir (as export_query does)");
  exporter->add_option("sql", export_sql, "the SQL")->required();
  exporter->add_option("file", export_file, "host file, or file name in the sandbox")->required();
  exporter->add_option("--sandbox", export_sandbox, "sandbox id");
  exporter->add_flag("--json", export_json, "print the result as JSON");
  exporter->callback([&] {
    auto config = context.config();
    if (!config) return void(exit_code = report(config.error()));
    auto target = data::resolve_database((*config)->database, context.state_dir());
    if (!target) return void(exit_code = report(target.error()));
    Progress progress("export", 0);
    auto options = data::export_options(**config);
    options.on_progress = export_progress(progress);
    if (export_sandbox.empty()) {
      auto summary = export_to_host(target->reader, export_sql, export_file, options);
      if (!summary) return void(exit_code = report(summary.error()));
      progress.finish(fmt::format("{} rows", summary->rows));
      if (export_json) {
        auto json = data::to_json(*summary);
        json["path"] = std::filesystem::absolute(export_file).string();
        std::cout << json.dump(2) << std::endl;
      } else {
        print_export(*summary, export_file);
      }
      return;
    }
    if (auto valid = data::validate_export_filename(export_file); !valid) {
      return void(exit_code = report(valid.error()));
    }
    auto provider = context.provider();
    if (!provider) return void(exit_code = report(provider.error()));
    // The file waits for its upload on quarry's own disk, not in a /tmp that may be memory.
    const auto temp_dir = context.state_dir() / "tmp";
    auto upload = data::upload_to(**provider, export_sandbox);
    if (!upload) return void(exit_code = report(upload.error()));
    data::SandboxExportRequest request{
        (*config)->sandbox.data_dir, target->reader, export_sql, export_file, options, temp_dir};
    auto result = data::export_to_sandbox(request, *upload);
    if (!result) return void(exit_code = report(result.error()));
    progress.finish(fmt::format("{} rows", result->summary.rows));
    if (export_json) {
      std::cout << data::to_json(*result).dump(2) << std::endl;
    } else {
      print_export(result->summary, fmt::format("{}:{}", export_sandbox, result->path));
    }
  });
  return options;
}

}  // namespace quarry::cli

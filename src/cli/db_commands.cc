// quarry db up | down | seed-demo | query | export: what they parse. What they do is in
// data/db.cc (quarry-data; data_commands.h).
#include "cli/data_commands.h"

namespace quarry::cli {

std::unique_ptr<CommandGroup> add_db_commands(CLI::App& group, Context& context, int& exit_code,
                                              DataCommands& data) {
  auto options = std::make_unique<DbOptions>();
  auto& opts = *options;
  group.require_subcommand(1);

  auto* up = group.add_subcommand(
      "up", "start quarry's private PostgreSQL (initialised on first use); prints its URL");
  up->callback([&] { exit_code = data.db_up(context); });

  auto* down = group.add_subcommand("down", "stop quarry's private PostgreSQL");
  down->callback([&] { exit_code = data.db_down(context); });

  auto* seed = group.add_subcommand(
      "seed-demo", "load the demo tables trending_videos and events (replacing them)");
  seed->add_option("--events", opts.demo.events, "rows of the events table")
      ->capture_default_str()
      ->check(CLI::Range(uint64_t{1}, uint64_t{1'000'000'000}));
  seed->add_option("--seed", opts.demo.seed, "seed of the pseudo-random data")
      ->capture_default_str();
  seed->callback([&] { exit_code = data.db_seed_demo(context, opts); });

  auto* query = group.add_subcommand(
      "query", "run a read-only query as query_database does (at most database.query_max_rows)");
  query->add_option("sql", opts.query_sql, "the SQL")->required();
  query->add_flag("--json", opts.query_json, "print the result as JSON");
  query->callback([&] { exit_code = data.db_query(context, opts); });

  auto* exporter = group.add_subcommand(
      "export",
      "export a query to Parquet: to a host FILE.parquet, or with --sandbox ID to NAME.parquet "
      "in that sandbox's data_dir (as export_query does)");
  exporter->add_option("sql", opts.export_sql, "the SQL")->required();
  exporter->add_option("file", opts.export_file, "host file, or file name in the sandbox")
      ->required();
  exporter->add_option("--sandbox", opts.export_sandbox, "sandbox id");
  exporter->add_flag("--json", opts.export_json, "print the result as JSON");
  exporter->callback([&] { exit_code = data.db_export(context, opts); });
  return options;
}

}  // namespace quarry::cli

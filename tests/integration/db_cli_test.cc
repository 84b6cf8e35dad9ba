// `quarry db ...` as a user runs it, against the test binary's PostgreSQL.
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "common/command.h"
#include "postgres_environment.h"
#include "sandbox_environment.h"

namespace quarry {
namespace {

using quarry::testing::PostgresEnvironment;
using quarry::testing::SandboxEnvironment;

// Runs quarry with the PostgreSQL test state directory; returns its exit code and output.
std::pair<int, std::string> quarry_db(std::vector<std::string> args,
                                      const std::string& config = "/dev/null") {
  std::vector<std::string> argv = {SandboxEnvironment::get().quarry_binary().string(),
                                   "--state-dir",
                                   PostgresEnvironment::get().state_dir().string(),
                                   "--config",
                                   config,
                                   "db"};
  argv.insert(argv.end(), args.begin(), args.end());
  auto result = run_command(argv);
  if (result) return {0, result->output};
  return {1, result.error().message};
}

TEST(DbCli, UpPrintsTheUrlOfTheRunningServer) {
  auto [code, output] = quarry_db({"up"});
  ASSERT_EQ(code, 0) << output;
  EXPECT_NE(output.find(PostgresEnvironment::get().server().reader_url), std::string::npos)
      << output;
}

TEST(DbCli, QueryPrintsATableOrJson) {
  auto [code, output] = quarry_db({"query", "SELECT n, n * 2 AS twice FROM numbers WHERE n <= 2"});
  ASSERT_EQ(code, 0) << output;
  EXPECT_NE(output.find("twice"), std::string::npos) << output;
  EXPECT_NE(output.find("(2 rows)"), std::string::npos) << output;

  auto [json_code, json_output] = quarry_db({"query", "--json", "SELECT count(*) FROM numbers"});
  ASSERT_EQ(json_code, 0) << json_output;
  auto json = nlohmann::json::parse(json_output);
  EXPECT_EQ(json["rows"][0][0], 1000);
  EXPECT_EQ(json["columns"][0]["type"], "bigint");

  auto [bad_code, bad_output] = quarry_db({"query", "DELETE FROM numbers"});
  EXPECT_EQ(bad_code, 1);
  EXPECT_NE(bad_output.find("returns no rows"), std::string::npos) << bad_output;
}

TEST(DbCli, ExportsToAHostFile) {
  const auto file =
      std::filesystem::temp_directory_path() / fmt::format("quarry-db-cli-{}.parquet", ::getpid());
  auto [code, output] = quarry_db({"export", "--json", "SELECT * FROM numbers", file.string()});
  ASSERT_EQ(code, 0) << output;
  auto json = nlohmann::json::parse(output);
  EXPECT_EQ(json["rows"], 1000);
  EXPECT_EQ(json["bytes"], std::filesystem::file_size(file));
  EXPECT_EQ(json["columns"][0]["parquet_type"], "int32");

  // A failed export leaves the earlier file as it was.
  const auto size = std::filesystem::file_size(file);
  auto [failed_code, failed_output] = quarry_db({"export", "SELECT nope", file.string()});
  EXPECT_EQ(failed_code, 1);
  EXPECT_EQ(std::filesystem::file_size(file), size);
  std::filesystem::remove(file);
}

// A host file the export cannot be written to is refused before the query runs, with why.
TEST(DbCli, RefusesAHostFileItCannotWrite) {
  const auto dir = std::filesystem::temp_directory_path();
  auto [csv_code, csv] = quarry_db({"export", "SELECT 1", (dir / "quarry-db-cli.csv").string()});
  EXPECT_EQ(csv_code, 1);
  EXPECT_NE(csv.find("quarry db export writes Parquet; give the file a name ending in .parquet"),
            std::string::npos)
      << csv;
  EXPECT_FALSE(std::filesystem::exists(dir / "quarry-db-cli.csv"));
  auto [missing_code, missing] =
      quarry_db({"export", "SELECT 1", (dir / "quarry-no-such-dir" / "x.parquet").string()});
  EXPECT_EQ(missing_code, 1);
  EXPECT_NE(missing.find(
                fmt::format("there is no directory '{}'", (dir / "quarry-no-such-dir").string())),
            std::string::npos)
      << missing;
  const auto folder = dir / fmt::format("quarry-db-cli-{}.parquet", ::getpid() + 1);
  std::filesystem::create_directory(folder);
  auto [folder_code, in_folder] = quarry_db({"export", "SELECT 1", folder.string()});
  EXPECT_EQ(folder_code, 1);
  EXPECT_NE(in_folder.find("is a directory; name a file in it"), std::string::npos) << in_folder;
  EXPECT_TRUE(std::filesystem::is_empty(folder));
  std::filesystem::remove(folder);
}

TEST(DbCli, RefusesABadSandboxFileName) {
  auto [code, output] =
      quarry_db({"export", "SELECT 1", "../escape.parquet", "--sandbox", "0123456789ab"});
  EXPECT_EQ(code, 1);
  EXPECT_NE(output.find("must not contain a path"), std::string::npos) << output;
}

// With database.url set, quarry uses that server (here the same one, over TCP) and will not
// start or stop one of its own.
TEST(DbCli, UsesAnExternalServerWhenDatabaseUrlIsSet) {
  const auto config =
      std::filesystem::temp_directory_path() / fmt::format("quarry-db-cli-{}.yml", ::getpid());
  std::ofstream(config) << "database:\n  url: \"" << PostgresEnvironment::get().server().reader_url
                        << "\"\n";
  auto [code, output] =
      quarry_db({"query", "--json", "SELECT inet_server_port() AS port"}, config.string());
  ASSERT_EQ(code, 0) << output;
  EXPECT_EQ(nlohmann::json::parse(output)["rows"][0][0], PostgresEnvironment::get().server().port);

  auto [up_code, up_output] = quarry_db({"up"}, config.string());
  EXPECT_EQ(up_code, 1);
  EXPECT_NE(up_output.find("database.url is set"), std::string::npos) << up_output;
  // The URL (with its password) is never repeated in a message.
  EXPECT_EQ(up_output.find(PostgresEnvironment::get().reader_password()), std::string::npos);
  std::filesystem::remove(config);
}

}  // namespace
}  // namespace quarry

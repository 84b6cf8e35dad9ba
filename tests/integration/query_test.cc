// query_database against a real PostgreSQL, and the walls of the read-only role itself.
#include "data/query.h"

#include <gtest/gtest.h>
#include <sys/eventfd.h>
#include <sys/resource.h>

#include "data/connection.h"
#include "postgres_environment.h"
#include "silent_server.h"

namespace quarry::data {
namespace {

using quarry::testing::PostgresEnvironment;

const std::string& reader() {
  return PostgresEnvironment::get().server().reader_conninfo;
}

QueryOptions options(uint64_t max_rows = 200) {
  return QueryOptions{max_rows, std::chrono::seconds(30)};
}

int64_t count_rows(std::string_view table) {
  auto result = query_database(reader(), fmt::format("SELECT count(*) FROM {}", table), options());
  EXPECT_TRUE(result) << result.error().message;
  return result ? std::stoll(*result->rows.at(0).at(0)) : -1;
}

TEST(QueryDatabase, ReturnsColumnsTypesAndValues) {
  auto result = query_database(
      reader(), "SELECT id, c_text, c_numeric, c_timestamptz FROM round_trip ORDER BY id LIMIT 2",
      options());
  ASSERT_TRUE(result) << result.error().message;
  ASSERT_EQ(result->columns.size(), 4u);
  EXPECT_EQ(result->columns[0].name, "id");
  EXPECT_EQ(result->columns[0].sql_type, "integer");
  EXPECT_EQ(result->columns[2].sql_type, "numeric(12,3)");
  EXPECT_EQ(result->columns[3].sql_type, "timestamp with time zone");
  ASSERT_EQ(result->rows.size(), 2u);
  EXPECT_EQ(result->rows[0][1], "plain text");
  EXPECT_EQ(result->rows[0][2], "12.340");
  EXPECT_EQ(result->rows[0][3], "2024-02-29 11:45:01.123456+00");
  EXPECT_EQ(result->rows[1][1], std::nullopt);
  EXPECT_FALSE(result->truncated);

  auto json = to_json(*result);
  EXPECT_EQ(json["rows"][0][0], 1);
  EXPECT_EQ(json["rows"][0][2], "12.340");  // numeric stays text: no digits lost
  EXPECT_TRUE(json["rows"][1][1].is_null());
  EXPECT_EQ(json["columns"][1]["type"], "text");
}

TEST(QueryDatabase, CutsAtMaxRowsAndSaysSo) {
  auto cut = query_database(reader(), "SELECT n FROM numbers ORDER BY n", options(5));
  ASSERT_TRUE(cut) << cut.error().message;
  EXPECT_EQ(cut->rows.size(), 5u);
  EXPECT_TRUE(cut->truncated);
  EXPECT_NE(to_text(*cut).find("cut at database.query_max_rows = 5"), std::string::npos);
  EXPECT_EQ(to_json(*cut)["truncated"], true);

  auto exact = query_database(reader(), "SELECT n FROM numbers WHERE n <= 5", options(5));
  ASSERT_TRUE(exact) << exact.error().message;
  EXPECT_EQ(exact->rows.size(), 5u);
  EXPECT_FALSE(exact->truncated);
  EXPECT_NE(to_text(*exact).find("(5 rows)"), std::string::npos);
}

// Only the start of a long value is kept as it is read: huge values cost the server little
// memory and come back at once, cut where a UTF-8 character ends, and the answer says so.
TEST(QueryDatabase, KeepsOnlyTheStartOfLongValues) {
  rusage before{};
  ::getrusage(RUSAGE_SELF, &before);
  const auto start = std::chrono::steady_clock::now();
  auto big = query_database(
      reader(), "SELECT n, repeat('x', 25000000) AS filler FROM generate_series(1, 20) AS n",
      options());
  ASSERT_TRUE(big) << big.error().message;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
  rusage after{};
  ::getrusage(RUSAGE_SELF, &after);
  // 20 values of 25 MB kept whole would be 500 MB; libpq holds one row at a time.
  EXPECT_LT(after.ru_maxrss - before.ru_maxrss, 200 * 1024) << "KiB more at the peak";
  ASSERT_EQ(big->rows.size(), 20u);
  const auto json = to_json(*big);
  EXPECT_EQ(json["rows"][19][0], 20);
  const std::string kept = json["rows"][19][1];
  EXPECT_GT(kept.size(), 80u);
  EXPECT_LT(kept.size(), 100000u);
  EXPECT_EQ(kept, std::string(kept.size(), 'x'));
  EXPECT_EQ(json["values_cut"], 20);
  const std::string text = to_text(*big);
  EXPECT_NE(text.find(std::string(77, 'x') + "..."), std::string::npos);
  EXPECT_LT(text.size(), 5000u);

  // A value is cut, in the JSON and in the text table, where a character ends.
  auto accents = query_database(
      reader(), "SELECT 'a' || repeat('é', 3000) AS e, repeat('é', 100) AS f", options());
  ASSERT_TRUE(accents) << accents.error().message;
  std::string accented = "a";
  for (int count = 0; count < 2047; ++count)
    accented += "é";
  // 4095 bytes: the 4096th would split a character.
  const std::string kept_accents = to_json(*accents)["rows"][0][0];
  EXPECT_TRUE(kept_accents == accented) << kept_accents.size() << " bytes kept";
  // 77 bytes of f's would end in half an é.
  std::string shown;
  for (int count = 0; count < 38; ++count)
    shown += "é";
  EXPECT_NE(to_text(*accents).find("  " + shown + "...\n"), std::string::npos) << to_text(*accents);
}

// A result of many long values stops at a bound of bytes kept, said as the row cap is.
TEST(QueryDatabase, CutsAtABoundOfBytesAndSaysSo) {
  std::string columns;
  for (int column_idx = 0; column_idx < 30; ++column_idx)
    columns += fmt::format(", repeat('y', 4000) AS c{}", column_idx);
  auto cut = query_database(
      reader(), fmt::format("SELECT n{} FROM generate_series(1, 200) AS n", columns), options());
  ASSERT_TRUE(cut) << cut.error().message;
  EXPECT_GT(cut->rows.size(), 10u);
  EXPECT_LT(cut->rows.size(), 200u);
  EXPECT_TRUE(cut->truncated);
  const std::string text = to_text(*cut);
  EXPECT_NE(text.find(fmt::format("({} rows shown; the result was cut at", cut->rows.size())),
            std::string::npos)
      << text.substr(text.rfind('('));
  EXPECT_EQ(to_json(*cut)["truncated"], true);
}

TEST(QueryDatabase, EndsALongQueryAtTheStatementTimeout) {
  const auto start = std::chrono::steady_clock::now();
  auto slow = query_database(reader(), "SELECT pg_sleep(10)",
                             QueryOptions{200, std::chrono::milliseconds(500)});
  ASSERT_FALSE(slow);
  EXPECT_EQ(slow.error().code, ErrorCode::kDeadlineExceeded);
  EXPECT_NE(slow.error().message.find("ran longer than database.statement_timeout (500ms)"),
            std::string::npos)
      << slow.error().message;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

// A Stop (the turn's cancel fd becoming readable) ends a running query: the call says it was
// cancelled, and PostgreSQL runs it no more, rather than for the whole statement timeout.
TEST(QueryDatabase, StopsARunningQueryWhenCancelled) {
  quarry::testing::StopAfter stop(std::chrono::milliseconds(300));
  QueryOptions opts = options();
  opts.cancel_fd = stop.fd();
  auto slow = query_database(reader(), "SELECT pg_sleep(30) AS quarry_stopped_query", opts);
  ASSERT_FALSE(slow) << to_text(*slow);
  EXPECT_EQ(slow.error().code, ErrorCode::kCancelled) << slow.error().message;
  EXPECT_EQ(slow.error().message, "query_database: cancelled: the query was stopped");
  EXPECT_EQ(quarry::testing::running_statements("quarry_stopped_query"), 0);
}

// So while the server has not answered the connect yet (overloaded, or a firewall that drops
// what follows the handshake): the Stop waited out the connect timeout (10 s).
TEST(QueryDatabase, StopsAConnectTheServerDoesNotAnswer) {
  quarry::testing::SilentServer silent;
  const auto port = silent.url("").substr(silent.url("").rfind(':') + 1);
  quarry::testing::StopAfter stop(std::chrono::milliseconds(300));
  QueryOptions opts = options();
  opts.cancel_fd = stop.fd();
  auto stuck =
      query_database(fmt::format("host=127.0.0.1 port={} dbname=none", port), "SELECT 1", opts);
  ASSERT_FALSE(stuck) << to_text(*stuck);
  EXPECT_EQ(stuck.error().code, ErrorCode::kCancelled) << stuck.error().message;
  EXPECT_EQ(stuck.error().message, "cancelled: stopped while connecting to PostgreSQL");
  // Never stopped, it still ends at the connect timeout.
  UniqueFd never(::eventfd(0, EFD_CLOEXEC));
  auto late = Connection::open(fmt::format("host=127.0.0.1 port={} dbname=none", port),
                               std::chrono::seconds(1), never.get());
  ASSERT_FALSE(late);
  EXPECT_EQ(late.error().code, ErrorCode::kUnavailable);
  EXPECT_EQ(late.error().message, "connecting to PostgreSQL failed: no answer within 1 s");
}

// Keepalives notice a network that died under a running query; a database.url that sets its
// own keeps them.
TEST(Connection, SetsKeepalivesUnlessTheUrlDoes) {
  auto setting = [](const Connection& connection, std::string_view keyword) {
    std::string value;
    PQconninfoOption* options = PQconninfo(connection.get());
    for (auto* option = options; option && option->keyword; ++option) {
      if (option->keyword == keyword && option->val) value = option->val;
    }
    PQconninfoFree(options);
    return value;
  };
  const std::string url = PostgresEnvironment::get().server().reader_url;
  auto plain = Connection::open(url);
  ASSERT_TRUE(plain) << plain.error().message;
  EXPECT_EQ(setting(*plain, "keepalives"), "1");
  EXPECT_EQ(setting(*plain, "keepalives_idle"), "30");
  EXPECT_EQ(setting(*plain, "keepalives_interval"), "10");
  EXPECT_EQ(setting(*plain, "keepalives_count"), "3");
  EXPECT_EQ(setting(*plain, "tcp_user_timeout"), "60000");

  for (const std::string& own : {url + "?keepalives_idle=7&tcp_user_timeout=9000",
                                 reader() + " keepalives_idle=7 tcp_user_timeout=9000"}) {
    auto connection = Connection::open(own);
    ASSERT_TRUE(connection) << connection.error().message;
    EXPECT_EQ(setting(*connection, "keepalives_idle"), "7");
    EXPECT_EQ(setting(*connection, "tcp_user_timeout"), "9000");
    EXPECT_EQ(setting(*connection, "keepalives_count"), "3");
  }
}

TEST(QueryDatabase, ReportsSqlErrorsClearly) {
  struct Case {
    const char* sql;
    ErrorCode code;
    const char* expected;
  } cases[] = {
      {"SELEC 1", ErrorCode::kInvalidArgument,
       "syntax error at or near \"SELEC\" (at character 1)"},
      {"SELECT nope FROM numbers", ErrorCode::kInvalidArgument, "column \"nope\" does not exist"},
      {"SELECT 1/0", ErrorCode::kInvalidArgument, "division by zero"},
      {"", ErrorCode::kInvalidArgument, "no SQL given"},
      {"SELECT * FROM pg_authid", ErrorCode::kPermissionDenied, "permission denied"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.sql);
    auto result = query_database(reader(), c.sql, options());
    ASSERT_FALSE(result);
    EXPECT_EQ(result.error().code, c.code) << result.error().message;
    EXPECT_NE(result.error().message.find(c.expected), std::string::npos) << result.error().message;
    EXPECT_TRUE(result.error().message.starts_with("query_database: "));
  }
}

TEST(QueryDatabase, RefusesWrites) {
  constexpr auto kDenied = ErrorCode::kPermissionDenied;
  struct Case {
    const char* name;
    const char* sql;
    ErrorCode code;
    const char* expected;
  } cases[] = {
      {"insert", "INSERT INTO numbers VALUES (-1)", kDenied, "returns no rows"},
      {"insert returning", "INSERT INTO numbers VALUES (-1) RETURNING n", kDenied,
       "cannot execute INSERT in a read-only transaction"},
      // PostgreSQL names the top-level statement (SELECT) when the CTE tries to write.
      {"writing CTE", "WITH gone AS (DELETE FROM numbers RETURNING n) SELECT count(*) FROM gone",
       kDenied, "in a read-only transaction"},
      {"copy to program", "COPY (SELECT 1) TO PROGRAM 'touch /tmp/quarry-pwned'", kDenied,
       "returns no rows"},
      {"set role", "SET ROLE quarry_admin", kDenied, "returns no rows"},
      {"drop", "DROP TABLE numbers", kDenied, "returns no rows"},
      {"server-side file access", "SELECT lo_import('/etc/passwd')", kDenied, "permission denied"},
      {"second statement", "SELECT 1; DELETE FROM numbers", ErrorCode::kInvalidArgument,
       "only one statement"},
      {"second statement after a query", "SELECT n FROM numbers; SELECT 2",
       ErrorCode::kInvalidArgument, "only one statement"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    auto result = query_database(reader(), c.sql, options());
    ASSERT_FALSE(result);
    EXPECT_EQ(result.error().code, c.code) << result.error().message;
    EXPECT_NE(result.error().message.find(c.expected), std::string::npos) << result.error().message;
  }
  EXPECT_EQ(count_rows("numbers"), 1000);
  EXPECT_FALSE(std::filesystem::exists("/tmp/quarry-pwned"));
}

// Behind the tools' checks, the role itself cannot write, switch roles or run programs, even
// outside a READ ONLY transaction and after turning its read-only default off.
TEST(ReaderRole, CannotWriteEvenWithoutTheToolsChecks) {
  auto connection = Connection::open(reader());
  ASSERT_TRUE(connection) << connection.error().message;
  struct Case {
    const char* sql;
    const char* expected;
  } cases[] = {
      {"SET ROLE quarry_admin", "permission denied to set role"},
      {"COPY (SELECT 1) TO PROGRAM 'touch /tmp/quarry-pwned'", "pg_execute_server_program"},
      {"COPY numbers TO '/tmp/quarry-pwned'", "pg_write_server_files"},
      {"INSERT INTO numbers VALUES (-1)", "permission denied for table numbers"},
      {"CREATE TABLE mine (a int)", "permission denied for schema public"},
      {"CREATE TEMP TABLE mine (a int)", "permission denied to create temporary tables"},
      {"ALTER ROLE quarry_reader SUPERUSER", "superuser"},
  };
  ASSERT_TRUE(connection->exec("SET default_transaction_read_only = off"));
  for (const auto& c : cases) {
    SCOPED_TRACE(c.sql);
    auto result = connection->exec(c.sql);
    ASSERT_FALSE(result);
    EXPECT_EQ(result.error().code, ErrorCode::kPermissionDenied) << result.error().message;
    EXPECT_NE(result.error().message.find(c.expected), std::string::npos) << result.error().message;
  }
  EXPECT_EQ(count_rows("numbers"), 1000);
  EXPECT_FALSE(std::filesystem::exists("/tmp/quarry-pwned"));
}

// Readers share one role, so what PostgreSQL lets a role do to its own sessions would let one
// user read another's SQL and end their queries: on the private server the reader can do
// neither. `db up` sets this on every start, so a server made by an older quarry gets it too.
TEST(ReaderRole, CannotSeeOrEndAnotherReadersQueries) {
  // The grants initdb gives, as a server made before this was set has them.
  quarry::testing::admin_sql(
      "GRANT SELECT ON pg_catalog.pg_stat_activity TO PUBLIC; "
      "GRANT EXECUTE ON FUNCTION pg_catalog.pg_terminate_backend(integer, bigint), "
      "pg_catalog.pg_cancel_backend(integer), pg_catalog.pg_stat_get_activity(integer), "
      "pg_catalog.pg_stat_get_backend_activity(integer) TO PUBLIC");
  const auto& environment = PostgresEnvironment::get();
  auto up = PostgresServer(environment.state_dir(), environment.server().port).up();
  ASSERT_TRUE(up) << up.error().message;

  auto other = Connection::open(reader());
  ASSERT_TRUE(other) << other.error().message;
  auto other_pid = other->exec("SELECT pg_backend_pid(), 'another user''s secret' AS marker");
  ASSERT_TRUE(other_pid) << other_pid.error().message;
  const std::string pid = PQgetvalue(other_pid->get(), 0, 0);

  for (const std::string& sql : std::vector<std::string>{
           "SELECT pid, query FROM pg_stat_activity WHERE usename = current_user",
           "SELECT query FROM pg_stat_get_activity(NULL)",
           "SELECT pg_stat_get_backend_activity(id) FROM pg_stat_get_backend_idset() AS id",
           "SELECT pg_terminate_backend(" + pid + ")",
           "SELECT pg_cancel_backend(" + pid + ")",
       }) {
    SCOPED_TRACE(sql);
    auto result = query_database(reader(), sql, options());
    ASSERT_FALSE(result) << to_text(*result);
    EXPECT_EQ(result.error().code, ErrorCode::kPermissionDenied) << result.error().message;
    EXPECT_NE(result.error().message.find("permission denied"), std::string::npos)
        << result.error().message;
  }
  auto still_there = other->exec("SELECT 1");
  EXPECT_TRUE(still_there) << still_there.error().message;

  // Those walls stand in the analytics database: the reader cannot go round them through the
  // history's database on the same server.
  PostgresServer server(environment.state_dir(), environment.server().port);
  auto history = server.history_conninfo();
  ASSERT_TRUE(history) << history.error().message;
  auto elsewhere = Connection::open(reader() + " dbname=" + std::string(kHistoryDatabase));
  ASSERT_FALSE(elsewhere);
  EXPECT_NE(elsewhere.error().message.find("permission denied"), std::string::npos)
      << elsewhere.error().message;
}

TEST(PostgresServer, UpIsIdempotentAndDownIsClean) {
  const auto& environment = PostgresEnvironment::get();
  PostgresServer again(environment.state_dir(), environment.server().port);
  auto info = again.up();
  ASSERT_TRUE(info) << info.error().message;
  EXPECT_EQ(info->reader_url, environment.server().reader_url);
  EXPECT_TRUE(info->reader_url.starts_with("postgresql://quarry_reader:"));
  auto running = again.running();
  ASSERT_TRUE(running) << running.error().message;
  EXPECT_EQ(running->port, environment.server().port);

  // The credentials file is root's alone.
  struct stat info_stat {};
  ASSERT_EQ(::stat((again.directory() / "credentials.json").c_str(), &info_stat), 0);
  EXPECT_EQ(info_stat.st_mode & 0777, 0600u);
  EXPECT_EQ(info_stat.st_uid, 0u);

  // A server in another state directory that was never started is simply not running.
  PostgresServer absent(environment.state_dir() / "elsewhere", environment.server().port);
  auto not_running = absent.running();
  ASSERT_FALSE(not_running);
  EXPECT_NE(not_running.error().message.find("quarry db up"), std::string::npos);
  auto down = absent.down();
  ASSERT_TRUE(down) << down.error().message;
  EXPECT_FALSE(*down);
}

}  // namespace
}  // namespace quarry::data

// export_parquet against a real PostgreSQL, read back with Arrow on the host (the round trip
// through a sandbox and Polars is in data_boundary_test.cc).
#include <arrow/api.h>
#include <arrow/io/file.h>
#include <gtest/gtest.h>
#include <parquet/arrow/reader.h>
#include <unistd.h>

#include "data/connection.h"
#include "data/parquet_export.h"
#include "data/query.h"
#include "data/sandbox_export.h"
#include "postgres_environment.h"

namespace quarry::data {
namespace {

using quarry::testing::PostgresEnvironment;

const std::string& reader() {
  return PostgresEnvironment::get().server().reader_conninfo;
}

class ExportTest : public ::testing::Test {
 protected:
  std::filesystem::path file_ =
      std::filesystem::temp_directory_path() /
      fmt::format("quarry-export-test-{}-{}.parquet", ::getpid(),
                  ::testing::UnitTest::GetInstance()->current_test_info()->name());
  void TearDown() override { std::filesystem::remove(file_); }

  ExportOptions options(uint64_t max_rows = 100000) {
    ExportOptions options;
    options.max_rows = max_rows;
    options.row_group_rows = 1024;
    return options;
  }

  std::shared_ptr<arrow::Table> read_back() {
    auto input = arrow::io::ReadableFile::Open(file_.string()).ValueOrDie();
    auto reader = parquet::arrow::OpenFile(input, arrow::default_memory_pool()).ValueOrDie();
    row_groups_ = reader->num_row_groups();
    return reader->ReadTable().ValueOrDie();
  }
  int row_groups_ = 0;
};

TEST_F(ExportTest, WritesTypedColumnsInRowGroups) {
  auto summary = export_parquet(
      reader(), "SELECT n, n * 1.5 AS half, 'row ' || n AS label FROM numbers ORDER BY n", file_,
      options());
  ASSERT_TRUE(summary) << summary.error().message;
  EXPECT_EQ(summary->rows, 1000u);
  EXPECT_FALSE(summary->truncated);
  EXPECT_EQ(summary->bytes, std::filesystem::file_size(file_));
  ASSERT_EQ(summary->columns.size(), 3u);
  EXPECT_EQ(summary->columns[0].sql_type, "integer");
  EXPECT_EQ(summary->columns[0].parquet_type, "int32");
  // n * 1.5 is an unconstrained numeric: its values need one decimal.
  EXPECT_EQ(summary->columns[1].parquet_type, "decimal128(38, 1)");
  EXPECT_NE(summary->columns[1].note.find("numeric without a precision"), std::string::npos);
  EXPECT_EQ(summary->columns[0].note, "");
  EXPECT_EQ(summary->runs, 1);
  auto table = read_back();
  EXPECT_EQ(table->num_rows(), 1000);
  EXPECT_EQ(table->schema()->ToString(), "n: int32\nhalf: decimal128(38, 1)\nlabel: string");
  auto last = table->Slice(999, 1);
  EXPECT_EQ(last->GetColumnByName("label")->chunk(0)->ToString(), "[\n  \"row 1000\"\n]");
  EXPECT_EQ(row_groups_, 1);  // 1000 rows fit one group of 1024

  auto json = to_json(*summary);
  EXPECT_EQ(json["rows"], 1000);
  EXPECT_TRUE(json["message"].is_null());
}

TEST_F(ExportTest, StartsANewRowGroupEveryNRows) {
  auto opts = options();
  opts.row_group_rows = 100;
  std::vector<uint64_t> progress;
  opts.on_progress = [&](uint64_t rows) { progress.push_back(rows); };
  auto summary = export_parquet(reader(), "SELECT n FROM numbers", file_, opts);
  ASSERT_TRUE(summary) << summary.error().message;
  read_back();
  EXPECT_EQ(row_groups_, 10);
  EXPECT_EQ(progress.back(), 1000u);
}

TEST_F(ExportTest, ARowGroupOfNullsEndsAtItsBytesToo) {
  // A NULL has no bytes on the wire, but its slot takes memory in every column builder: a wide
  // result of mostly NULLs must not gather all of row_group_rows in one group. Each value
  // counts with its 4-byte length word, as PostgreSQL sends it.
  auto opts = options();
  opts.row_group_bytes = 4096;
  auto summary = export_parquet(
      reader(),
      "SELECT NULL::bigint AS a, NULL::bigint AS b, NULL::text AS c, NULL::text AS d, "
      "NULL::bigint AS e, NULL::bigint AS f, NULL::text AS g, NULL::text AS h FROM numbers",
      file_, opts);
  ASSERT_TRUE(summary) << summary.error().message;
  EXPECT_EQ(read_back()->num_rows(), 1000);
  EXPECT_EQ(row_groups_, 8);  // 128 rows of 8 values of 4 bytes in each, where 1024 fit
}

TEST_F(ExportTest, CutsAtExportMaxRowsAndSaysSo) {
  auto summary = export_parquet(reader(), "SELECT n FROM numbers ORDER BY n", file_, options(100));
  ASSERT_TRUE(summary) << summary.error().message;
  EXPECT_EQ(summary->rows, 100u);
  EXPECT_TRUE(summary->truncated);
  EXPECT_EQ(read_back()->num_rows(), 100);
  auto json = to_json(*summary);
  EXPECT_EQ(json["truncated"], true);
  EXPECT_NE(json["message"].get<std::string>().find("cut at sandbox.export_max_rows = 100"),
            std::string::npos);

  auto exact = export_parquet(reader(), "SELECT n FROM numbers", file_, options(1000));
  ASSERT_TRUE(exact) << exact.error().message;
  EXPECT_EQ(exact->rows, 1000u);
  EXPECT_FALSE(exact->truncated);
}

TEST_F(ExportTest, TakesTheQueryWithCommentsAndSemicolonsAround) {
  auto summary = export_parquet(reader(),
                                "-- the first ten\nSELECT n FROM numbers /* ordered */ ORDER BY n "
                                "LIMIT 10; -- done",
                                file_, options());
  ASSERT_TRUE(summary) << summary.error().message;
  EXPECT_EQ(summary->rows, 10u);
  EXPECT_EQ(read_back()->num_rows(), 10);
}

TEST_F(ExportTest, AnEmptyResultIsAFileWithTheSchema) {
  auto summary = export_parquet(reader(), "SELECT * FROM round_trip WHERE false", file_, options());
  ASSERT_TRUE(summary) << summary.error().message;
  EXPECT_EQ(summary->rows, 0u);
  auto table = read_back();
  EXPECT_EQ(table->num_rows(), 0);
  EXPECT_EQ(table->num_columns(), 24);
}

TEST_F(ExportTest, RefusesTwoColumnsOfOneName) {
  auto summary = export_parquet(reader(), "SELECT 1 AS a, 2 AS a", file_, options());
  ASSERT_FALSE(summary);
  EXPECT_EQ(summary.error().code, ErrorCode::kInvalidArgument);
  EXPECT_NE(summary.error().message.find("two columns are named 'a'"), std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(file_)) << "a failed export leaves no file";
}

// What export_query refused before (issue 17) now crosses, typed where Parquet has a type and
// as PostgreSQL's text form where not.
TEST_F(ExportTest, ExportsWhatParquetHasNoTypeFor) {
  struct Case {
    const char* sql;
    const char* parquet_type;
    const char* first_value;  // as Arrow prints it
  } cases[] = {
      {"SELECT interval '1 day 02:00:00' AS gap", "duration[us]", "93600000000"},
      {"SELECT 'NaN'::numeric AS ratio", "string", "\"NaN\""},
      {"SELECT 'infinity'::timestamp AS never", "string", "\"infinity\""},
      {"SELECT ARRAY[[1,2],[3,4]] AS grid", "list<element: list<element: int32>>",
       "[\n    [\n      1,"},
      {"SELECT 1e40::numeric AS huge", "string", "\"10000000000000000000000000000000000000000\""},
      {"SELECT '10.0.0.1/8'::inet AS host", "string", "\"10.0.0.1/8\""},
      {"SELECT '[1,5)'::int4range AS span", "string", "\"[1,5)\""},
      {"SELECT time '24:00:00' AS midnight", "string", "\"24:00:00\""},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.sql);
    auto summary = export_parquet(reader(), c.sql, file_, options());
    ASSERT_TRUE(summary) << summary.error().message;
    ASSERT_EQ(summary->columns.size(), 1u);
    EXPECT_EQ(summary->columns[0].parquet_type, c.parquet_type);
    EXPECT_FALSE(summary->columns[0].note.empty());
    auto table = read_back();
    EXPECT_EQ(table->column(0)->type()->ToString(), c.parquet_type);
    EXPECT_NE(table->column(0)->chunk(0)->ToString().find(c.first_value), std::string::npos)
        << table->column(0)->chunk(0)->ToString();
  }
}

// A composite or enum that also comes inside an array in the same query is read from the
// catalog once: each field and label once, in whichever order the columns name the types.
TEST_F(ExportTest, ACompositeOrEnumAlsoInAnArrayExportsWhole) {
  using quarry::testing::admin_sql;
  admin_sql(
      "DROP TYPE IF EXISTS duo; DROP TYPE IF EXISTS hue; "
      "CREATE TYPE hue AS ENUM ('red', 'green'); CREATE TYPE duo AS (a integer, b text)");
  const std::string duo_type = "struct<a: int32, b: string>";
  const std::string hue_type = "dictionary<values=string, indices=int32, ordered=0>";
  struct Case {
    const char* sql;
    std::vector<std::string> types;
  } cases[] = {
      {"SELECT ROW(1, 'x')::duo AS p, ARRAY[ROW(2, 'y')::duo] AS ap",
       {duo_type, "list<element: " + duo_type + ">"}},
      {"SELECT ARRAY[ROW(2, 'y')::duo] AS ap, ROW(1, 'x')::duo AS p",
       {"list<element: " + duo_type + ">", duo_type}},
      {"SELECT p, array_agg(p) OVER () AS ap FROM (SELECT ROW(1, 'x')::duo AS p) AS q",
       {duo_type, "list<element: " + duo_type + ">"}},
      {"SELECT 'green'::hue AS h, ARRAY['red'::hue, 'green'] AS hs",
       {hue_type, "list<element: " + hue_type + ">"}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.sql);
    auto summary = export_parquet(reader(), c.sql, file_, options());
    EXPECT_TRUE(summary) << summary.error().message;
    if (!summary) continue;
    auto table = read_back();
    ASSERT_EQ(table->num_columns(), 2);
    for (int column_idx = 0; column_idx < 2; ++column_idx) {
      EXPECT_EQ(table->column(column_idx)->type()->ToString(),
                c.types[static_cast<size_t>(column_idx)]);
    }
  }
  // The values themselves, and the enum's labels each once, in its order.
  auto summary = export_parquet(
      reader(), "SELECT ROW(1, 'x')::duo AS p, ARRAY['red'::hue, 'green'] AS hs", file_, options());
  ASSERT_TRUE(summary) << summary.error().message;
  auto table = read_back();
  auto pair = std::static_pointer_cast<arrow::StructArray>(table->column(0)->chunk(0));
  EXPECT_EQ(std::static_pointer_cast<arrow::Int32Array>(pair->field(0))->Value(0), 1);
  EXPECT_EQ(std::static_pointer_cast<arrow::StringArray>(pair->field(1))->GetString(0), "x");
  auto hues = std::static_pointer_cast<arrow::ListArray>(table->column(1)->chunk(0));
  auto labels = std::static_pointer_cast<arrow::DictionaryArray>(hues->values());
  EXPECT_EQ(labels->dictionary()->ToString(), "[\n  \"red\",\n  \"green\"\n]");
  EXPECT_EQ(labels->indices()->ToString(), "[\n  0,\n  1\n]");
  admin_sql("DROP TYPE duo; DROP TYPE hue");
}

// numeric(p, s) takes NaN (and since PostgreSQL 14, infinity where p leaves room): such a
// column goes as PostgreSQL's text form, as an unconstrained numeric does; without them it
// stays the decimal its type says.
TEST_F(ExportTest, AConstrainedNumericWithNaNArrivesAsText) {
  struct Case {
    const char* sql;
    const char* parquet_type;
    const char* values;  // as Arrow prints the column
  } cases[] = {
      {"SELECT 'NaN'::numeric(4, 1) AS n", "string", "[\n  \"NaN\"\n]"},
      {"SELECT x::numeric(4, 1) AS n FROM (VALUES (1.25), ('NaN'), (NULL)) AS v (x)", "string",
       "[\n  \"1.3\",\n  \"NaN\",\n  null\n]"},
      {"SELECT ARRAY[1.5, 'NaN']::numeric(4, 1)[] AS n", "list<element: string>",
       "\"1.5\",\n    \"NaN\""},
      {"SELECT 12.5::numeric(4, 1) AS n", "decimal128(4, 1)", "[\n  12.5\n]"},
      {"SELECT ARRAY[1.5]::numeric(4, 1)[] AS n", "list<element: decimal128(4, 1)>", "1.5"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.sql);
    auto summary = export_parquet(reader(), c.sql, file_, options());
    ASSERT_TRUE(summary) << summary.error().message;
    EXPECT_EQ(summary->columns[0].parquet_type, c.parquet_type);
    auto table = read_back();
    EXPECT_EQ(table->column(0)->type()->ToString(), c.parquet_type);
    const auto values = table->column(0)->chunk(0)->ToString();
    EXPECT_NE(values.find(c.values), std::string::npos) << values;
  }

  // A NaN after the first row group: the query runs again, and every value is text.
  auto later = export_parquet(reader(),
                              "SELECT CASE WHEN n < 3000 THEN n / 4.0 ELSE 'NaN' END::numeric(8, "
                              "2) AS x FROM generate_series(1, 3000) AS n ORDER BY n",
                              file_, options());
  ASSERT_TRUE(later) << later.error().message;
  EXPECT_EQ(later->runs, 2);
  auto table = read_back();
  ASSERT_EQ(table->num_rows(), 3000);
  auto texts = std::static_pointer_cast<arrow::StringArray>(
      arrow::Concatenate(table->column(0)->chunks()).ValueOrDie());
  EXPECT_EQ(texts->GetString(0), "0.25");
  EXPECT_EQ(texts->GetString(2998), "749.75");
  EXPECT_EQ(texts->GetString(2999), "NaN");

  // 'Infinity' fits only a numeric(p, s) PostgreSQL itself refuses it for: it is an overflow.
  auto infinity =
      export_parquet(reader(), "SELECT 'Infinity'::numeric(4, 1) AS n", file_, options());
  ASSERT_FALSE(infinity);
  EXPECT_NE(infinity.error().message.find("overflow"), std::string::npos)
      << infinity.error().message;
}

// The first row group decides a value-dependent type; a later value that needs a wider one
// makes the export measure the rest and run the query again (in the same snapshot), so the
// file holds every value exactly, in one type.
TEST_F(ExportTest, ALaterValueNeedingAWiderTypeRunsTheQueryAgain) {
  struct Case {
    const char* name;
    const char* sql;
    const char* parquet_type;
    int64_t row;           // a row past the first row group
    const char* expected;  // its value, as Arrow prints it
  } cases[] = {
      {"more decimals",
       "SELECT CASE WHEN n <= 2000 THEN n::numeric ELSE n / 3000.0 END AS x "
       "FROM generate_series(1, 3000) AS n ORDER BY n",
       "decimal128(38, 20)", 2999, "1.00000000000000000000"},
      {"infinity",
       "SELECT CASE WHEN n <= 2000 THEN timestamptz '2024-01-01' ELSE 'infinity' END AS t "
       "FROM generate_series(1, 3000) AS n ORDER BY n",
       "string", 2500, "\"infinity\""},
      {"months",
       "SELECT CASE WHEN n <= 2000 THEN interval '1 day' ELSE interval '1 month' END AS i "
       "FROM generate_series(1, 3000) AS n ORDER BY n",
       "struct<months: int32, days: int32, microseconds: int64>", 2500,
       "-- child 0 type: int32\n  [\n    1\n  ]"},
      {"dimensions",
       "SELECT CASE WHEN n <= 2000 THEN ARRAY[n] ELSE ARRAY[[n]] END AS a "
       "FROM generate_series(1, 3000) AS n ORDER BY n",
       "string", 2500, "\"{{2501}}\""},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    auto summary = export_parquet(reader(), c.sql, file_, options());
    ASSERT_TRUE(summary) << summary.error().message;
    EXPECT_EQ(summary->runs, 2);
    EXPECT_EQ(summary->rows, 3000u);
    EXPECT_EQ(summary->columns[0].parquet_type, c.parquet_type);
    auto table = read_back();
    ASSERT_EQ(table->num_rows(), 3000);
    EXPECT_EQ(table->column(0)->type()->ToString(), c.parquet_type);
    auto value = table->Slice(c.row, 1)->column(0)->chunk(0)->ToString();
    EXPECT_NE(value.find(c.expected), std::string::npos) << value;
    EXPECT_EQ(row_groups_, 3);  // 1024 rows each: the second run wrote them all
  }
}

// A database in another encoding sends text in its own unless asked for UTF-8; quarry asks
// every server for UTF-8 (client_encoding), so LATIN1 text arrives as strings, not refused.
TEST_F(ExportTest, TextFromALatin1DatabaseArrivesAsUtf8) {
  using quarry::testing::admin_sql;
  admin_sql("DROP DATABASE IF EXISTS latin");
  admin_sql(
      "CREATE DATABASE latin ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C' "
      "TEMPLATE template0");
  const auto& server = PostgresEnvironment::get().server();
  auto admin = Connection::open(server.admin_conninfo + " dbname=latin");
  ASSERT_TRUE(admin) << admin.error().message;
  // This file is UTF-8: the server is told so (before the statements: it converts a query
  // string as a whole), and stores the names in LATIN1.
  ASSERT_TRUE(admin->exec_script("SET client_encoding = 'UTF8'"));
  ASSERT_TRUE(
      admin->exec_script("CREATE TABLE people (name text, city varchar(20));"
                         "INSERT INTO people VALUES ('Müller', 'Köln'), ('Åsa', NULL);"
                         "GRANT SELECT ON people TO quarry_reader;"));
  auto summary = export_parquet(server.reader_conninfo + " dbname=latin",
                                "SELECT name, city FROM people ORDER BY name", file_, options());
  ASSERT_TRUE(summary) << summary.error().message;
  auto table = read_back();
  ASSERT_EQ(table->num_rows(), 2);
  auto names = std::static_pointer_cast<arrow::StringArray>(table->column(0)->chunk(0));
  auto cities = std::static_pointer_cast<arrow::StringArray>(table->column(1)->chunk(0));
  EXPECT_EQ(names->GetString(0), "Müller");
  EXPECT_EQ(cities->GetString(0), "Köln");
  EXPECT_EQ(names->GetString(1), "Åsa");
}

// A "char" holds one byte, which need not be a character: the file has PostgreSQL's text
// form of it (a byte past ASCII as \ooo), what query_database shows.
TEST_F(ExportTest, ACharColumnWithAByteBeyondAsciiArrivesAsPostgresPrintsIt) {
  const std::string sql =
      "SELECT x::\"char\" AS c, ARRAY[x::\"char\"] AS cs "
      "FROM (VALUES (1, 'a'), (2, 'é'), (3, ''), (4, NULL)) AS v (k, x) ORDER BY k";
  auto summary = export_parquet(reader(), sql, file_, options());
  ASSERT_TRUE(summary) << summary.error().message;
  auto table = read_back();
  ASSERT_EQ(table->num_rows(), 4);
  EXPECT_EQ(table->column(0)->type()->ToString(), "string");
  auto chars = std::static_pointer_cast<arrow::StringArray>(table->column(0)->chunk(0));
  EXPECT_EQ(chars->GetString(0), "a");
  EXPECT_EQ(chars->GetString(1), "\\303");
  EXPECT_EQ(chars->GetString(2), "");
  EXPECT_TRUE(chars->IsNull(3));
  auto lists = std::static_pointer_cast<arrow::ListArray>(table->column(1)->chunk(0));
  EXPECT_EQ(std::static_pointer_cast<arrow::StringArray>(lists->value_slice(1))->GetString(0),
            "\\303");

  // The same text query_database shows.
  auto queried = query_database(reader(), sql, QueryOptions{});
  ASSERT_TRUE(queried) << queried.error().message;
  for (int64_t row = 0; row < 3; ++row) {
    EXPECT_EQ(*queried->rows[static_cast<size_t>(row)][0], chars->GetString(row));
  }
}

TEST_F(ExportTest, RefusesWrites) {
  for (const char* sql :
       {"INSERT INTO numbers VALUES (-1)",
        "WITH gone AS (DELETE FROM numbers RETURNING n) SELECT * FROM gone",
        "COPY (SELECT 1) TO PROGRAM 'touch /tmp/quarry-pwned'", "SET ROLE quarry_admin",
        "SELECT 1; DELETE FROM numbers", "SELECT 1) TO PROGRAM 'touch /tmp/quarry-pwned' --"}) {
    SCOPED_TRACE(sql);
    auto summary = export_parquet(reader(), sql, file_, options());
    ASSERT_FALSE(summary);
    EXPECT_TRUE(summary.error().message.starts_with("export_query: ")) << summary.error().message;
  }
  EXPECT_FALSE(std::filesystem::exists("/tmp/quarry-pwned"));
}

TEST_F(ExportTest, EndsALongExportAtTheStatementTimeout) {
  auto opts = options();
  opts.statement_timeout = std::chrono::milliseconds(500);
  auto summary = export_parquet(reader(), "SELECT n FROM numbers WHERE pg_sleep(0.01)::text = ''",
                                file_, opts);
  ASSERT_FALSE(summary);
  EXPECT_EQ(summary.error().code, ErrorCode::kDeadlineExceeded);
  EXPECT_NE(summary.error().message.find("database.statement_timeout (500ms)"), std::string::npos)
      << summary.error().message;
  EXPECT_FALSE(std::filesystem::exists(file_));
}

// A Stop ends an export while its query runs: kCancelled, no file, and PostgreSQL runs the
// query no more (it is not run again, as after a misfit).
TEST_F(ExportTest, StopsARunningExportWhenCancelled) {
  quarry::testing::StopAfter stop(std::chrono::milliseconds(300));
  auto opts = options();
  opts.cancel_fd = stop.fd();
  auto summary =
      export_parquet(reader(), "SELECT 1 AS quarry_stopped_export FROM pg_sleep(30)", file_, opts);
  ASSERT_FALSE(summary) << summary->rows;
  EXPECT_EQ(summary.error().code, ErrorCode::kCancelled) << summary.error().message;
  EXPECT_EQ(summary.error().message, "export_query: cancelled: the query was stopped");
  EXPECT_FALSE(std::filesystem::exists(file_));
  EXPECT_EQ(quarry::testing::running_statements("quarry_stopped_export"), 0);
}

TEST_F(ExportTest, RefusesABadFileNameBeforeTouchingAnything) {
  SandboxExportRequest request;
  request.data_dir = "/home/sandbox/data";
  request.conninfo = "host=/nonexistent";
  request.sql = "SELECT 1";
  request.filename = "../../etc/passwd.parquet";
  request.temp_dir = std::filesystem::temp_directory_path();
  // Nothing may be uploaded for a refused name.
  Upload upload = [](std::string_view, std::istream&) -> Result<void> {
    ADD_FAILURE() << "nothing must be uploaded";
    return make_error(ErrorCode::kInternal, "used");
  };
  auto result = export_to_sandbox(request, upload);
  ASSERT_FALSE(result);
  EXPECT_EQ(result.error().code, ErrorCode::kInvalidArgument);
  EXPECT_NE(result.error().message.find("must not contain a path"), std::string::npos);
}

}  // namespace
}  // namespace quarry::data

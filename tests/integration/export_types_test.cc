// Every PostgreSQL column crosses into the sandbox (issue 17): a table with one column of each
// kind of type a real schema holds (enums, domains, composites, intervals, network and
// geometric types, ranges, multi-dimensional arrays, numerics no decimal holds), exported with
// SELECT *, read back inside a sandbox with Polars and with DuckDB, and compared value by value
// with what PostgreSQL itself prints; numerics lose no digit, and query_database agrees.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "data/connection.h"
#include "data/query.h"
#include "data/sandbox_export.h"
#include "postgres_environment.h"
#include "sandbox_environment.h"

namespace quarry::data {
namespace {

using quarry::testing::admin_sql;
using quarry::testing::PostgresEnvironment;
using quarry::testing::SandboxEnvironment;
using quarry::testing::ScopedSandbox;

// The enum gets a label after the table is made; ALTER TYPE ... ADD VALUE commits on its own.
constexpr const char* kSchema = R"(
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
CREATE DOMAIN positive AS integer CHECK (VALUE > 0);
CREATE DOMAIN price AS numeric(10, 2);
CREATE TYPE pair AS (a integer, b text, m mood);
CREATE TABLE every_type (
  id integer PRIMARY KEY,
  c_enum mood, c_enum_array mood[],
  c_interval interval, c_duration interval,
  c_inet inet, c_cidr cidr, c_macaddr macaddr, c_money money, c_bit bit(4), c_varbit varbit,
  c_oid oid, c_regclass regclass, c_regtype regtype,
  c_range int4range, c_tstzrange tstzrange, c_tsvector tsvector, c_xml xml,
  c_point point, c_box box, c_circle circle, c_timetz timetz,
  c_grid integer[], c_empty_array integer[], c_inet_array inet[],
  c_domain positive, c_price price, c_pair pair,
  c_numeric_wide numeric, c_numeric_fine numeric, c_numeric_nan numeric,
  c_valid_to timestamptz
);
)";

constexpr const char* kRows = R"(
INSERT INTO every_type VALUES
  (1, 'happy', '{sad,ok}', '1 year 2 mons 3 days 04:05:06.789', '3 days 04:05:06.5',
   '192.168.1.5/24', '10.0.0.0/8', '08:00:2b:01:02:03', 12.34, B'1010', B'10110',
   1259, 'pg_class', 'integer', '[1,5)', '[2024-01-01 00:00+00,2024-02-01 00:00+00)',
   'the quick brown fox', '<a>1</a>', '(1.5,2)', '((0,0),(1,1))', '<(0,0),2>', '13:45:01+02',
   '{{1,2,3},{4,5,6}}', '{}', '{10.0.0.1,NULL}', 7, 19.99, ROW(1, 'one', 'ok'),
   1234567890123456789012345678901234567890, 0.12345678901234567891, 'NaN', 'infinity'),
  (2, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
   NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL),
  (3, 'ecstatic', '{}', '-3 mons -00:00:01', '-00:00:01.5', '::1', '2001:db8::/32',
   'ff:ff:ff:ff:ff:ff', -0.5, B'0000', B'', 0, 'every_type', 'mood[]', 'empty', '(,)',
   '', '<b/>', '(-1,-1)', '((2,2),(-1,-1))', '<(1,1),0.5>', '00:00:00-05:30',
   '{{7},{8}}', '{}', '{}', 1, 0, ROW(NULL, NULL, NULL),
   -1, -0.00000000000000000001, 42, '2024-06-30 12:00:00+00');
)";

// One column: how PostgreSQL prints its value as JSON (`{}` is the column), and how the sandbox
// script turns what each reader gives into the same JSON.
struct Column {
  const char* name;
  const char* canonical_sql;
  const char* kind;          // see canonical() in kReadBack
  const char* polars_dtype;  // as Polars names it
};

// to_json() gives the text of a type JSON has no value for through its output function, as
// libpq's text results (and query_database) do; a ::text cast may call a type's own cast
// instead (inet's shows the netmask: ::1/128). Numerics and timestamps have JSON forms of their
// own, so their text is the ::text cast, which is their output function.
constexpr const char* kText = "to_json({})";
constexpr const char* kCastText = "to_json({}::text)";
constexpr const char* kTrimmed = "to_json(trim_scale({})::text)";
// An interval's parts as PostgreSQL keeps them.
constexpr const char* kIntervalParts =
    "CASE WHEN {0} IS NULL THEN NULL ELSE json_build_object('months', extract(year from {0}) * "
    "12 + extract(month from {0}), 'days', extract(day from {0}), 'microseconds', "
    "(extract(hour from {0}) * 3600 + extract(minute from {0}) * 60) * 1000000 + "
    "extract(microseconds from {0})) END";

const Column kColumns[] = {
    {"id", "to_json({})", "plain", "Int32"},
    {"c_enum", kText, "plain", "Categorical"},
    {"c_enum_array", "to_json({})", "plain", "List(Categorical)"},
    {"c_interval", kIntervalParts, "plain",
     "Struct({'months': Int32, 'days': Int32, 'microseconds': Int64})"},
    {"c_duration", "to_json((extract(epoch from {}) * 1000000)::bigint)", "micros",
     "Duration(time_unit='us')"},
    {"c_inet", kText, "plain", "String"},
    {"c_cidr", kText, "plain", "String"},
    {"c_macaddr", kText, "plain", "String"},
    {"c_money", kText, "plain", "String"},
    {"c_bit", kText, "plain", "String"},
    {"c_varbit", kText, "plain", "String"},
    {"c_oid", kText, "plain", "String"},
    {"c_regclass", kText, "plain", "String"},
    {"c_regtype", kText, "plain", "String"},
    {"c_range", kText, "plain", "String"},
    {"c_tstzrange", kText, "plain", "String"},
    {"c_tsvector", kText, "plain", "String"},
    {"c_xml", kText, "plain", "String"},
    {"c_point", kText, "plain", "String"},
    {"c_box", kText, "plain", "String"},
    {"c_circle", kText, "plain", "String"},
    {"c_timetz", kText, "plain", "String"},
    {"c_grid", "to_json({})", "plain", "List(List(Int32))"},
    {"c_empty_array", "to_json({})", "plain", "List(Int32)"},
    {"c_inet_array", "to_json({})", "plain", "List(String)"},
    {"c_domain", "to_json({})", "plain", "Int32"},
    {"c_price", kTrimmed, "decimal", "Decimal(precision=10, scale=2)"},
    {"c_pair", "to_json({})", "plain", "Struct({'a': Int32, 'b': String, 'm': Categorical})"},
    {"c_numeric_wide", kCastText, "plain", "String"},
    {"c_numeric_fine", kTrimmed, "decimal", "Decimal(precision=38, scale=20)"},
    {"c_numeric_nan", kCastText, "plain", "String"},
    {"c_valid_to", kCastText, "plain", "String"},
};

// Reads the file with Polars and with DuckDB; prints {"polars": {"dtypes", "rows"}, "duckdb":
// {"rows"}} with each value in the canonical JSON of its column's kind, rows ordered by the
// first column.
constexpr const char* kReadBack = R"(
import datetime, decimal, json, sys
import duckdb
import polars as pl

path, kinds = sys.argv[1], json.loads(sys.argv[2])

def canonical(value, kind):
    if value is None:
        return None
    if kind == "decimal":
        return format(value.normalize(), "f")
    if kind == "micros":
        return value // datetime.timedelta(microseconds=1) if isinstance(value, datetime.timedelta) else value
    return value

def rows(records):
    return [[canonical(value, kind) for value, (_, kind) in zip(record, kinds)] for record in records]

df = pl.read_parquet(path)
relation = duckdb.sql(f"SELECT * FROM '{path}' ORDER BY 1")
print(json.dumps({"polars": {"dtypes": {n: str(t) for n, t in df.schema.items()},
                             "rows": rows(df.sort(df.columns[0]).rows())},
                  "duckdb": {"rows": rows(relation.fetchall())}}, default=str))
)";

// [[name, kind], ...] for kReadBack.
nlohmann::json kinds_of(const std::vector<std::pair<std::string, std::string>>& columns) {
  nlohmann::json kinds = nlohmann::json::array();
  for (const auto& [name, kind] : columns)
    kinds.push_back(nlohmann::json::array({name, kind}));
  return kinds;
}

class ExportTypesTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    admin_sql(kSchema);
    admin_sql("ALTER TYPE mood ADD VALUE 'ecstatic'");
    admin_sql(kRows);
    admin_sql("GRANT SELECT ON every_type TO quarry_reader");
  }
  static void TearDownTestSuite() {
    admin_sql(
        "DROP TABLE every_type; DROP TYPE pair; DROP DOMAIN price; DROP DOMAIN positive; "
        "DROP TYPE mood");
  }

  Result<SandboxExport> export_into(const std::string& sql, const std::string& filename) {
    SandboxExportRequest request;
    request.data_dir = SandboxEnvironment::get().config().sandbox.data_dir;
    request.conninfo = PostgresEnvironment::get().server().reader_conninfo;
    request.sql = sql;
    request.filename = filename;
    request.options.row_group_rows = 2;  // the third row comes after the first row group
    request.temp_dir = std::filesystem::temp_directory_path();
    return export_to_sandbox(request,
                             *upload_to(SandboxEnvironment::get().provider(), sandbox_.id(), -1));
  }

  // What PostgreSQL holds: a JSON array of rows of `expressions` over `from`, ordered by `key`.
  nlohmann::json postgres_json(const std::string& expressions, const std::string& from,
                               const std::string& key) {
    auto connection = Connection::open(PostgresEnvironment::get().server().admin_conninfo);
    EXPECT_TRUE(connection) << connection.error().message;
    auto result = connection->exec(fmt::format(
        "SELECT json_agg(json_build_array({}) ORDER BY {})::text FROM {}", expressions, key, from));
    EXPECT_TRUE(result) << result.error().message;
    return nlohmann::json::parse(PQgetvalue(result->get(), 0, 0));
  }

  nlohmann::json read_back(const std::string& path, const nlohmann::json& kinds) {
    auto run =
        quarry::testing::run(sandbox_.id(), {"python3", "-c", kReadBack, path, kinds.dump()});
    EXPECT_TRUE(run) << run.error().message;
    if (!run) return {};
    EXPECT_EQ(run->exit_code, 0) << run->stderr_text;
    return nlohmann::json::parse(run->stdout_text, nullptr, false);
  }

  ScopedSandbox sandbox_;
};

TEST_F(ExportTypesTest, SelectStarOfEveryTypeReadsBackInPolarsAndDuckDb) {
  ASSERT_FALSE(sandbox_.id().empty());
  auto exported = export_into("SELECT * FROM every_type", "every_type.parquet");
  ASSERT_TRUE(exported) << exported.error().message;
  EXPECT_EQ(exported->summary.rows, 3u);
  ASSERT_EQ(exported->summary.columns.size(), std::size(kColumns));

  std::string expressions;
  nlohmann::json kinds = nlohmann::json::array();
  for (const auto& column : kColumns) {
    expressions += fmt::format("{}{}", expressions.empty() ? "" : ", ",
                               fmt::format(fmt::runtime(column.canonical_sql), column.name));
    kinds.push_back({column.name, column.kind});
  }
  const auto expected = postgres_json(expressions, "every_type", "id");
  EXPECT_EQ(exported->summary.runs, 2) << "'infinity' in the first row group asks for a cast";
  const auto read = read_back(exported->path, kinds);
  ASSERT_TRUE(read.is_object()) << read;
  for (const auto& column : kColumns) {
    EXPECT_EQ(read["polars"]["dtypes"][column.name], column.polars_dtype) << column.name;
  }
  for (const char* reader : {"polars", "duckdb"}) {
    const auto& rows = read[reader]["rows"];
    ASSERT_EQ(rows.size(), expected.size()) << reader;
    for (size_t row_idx = 0; row_idx < expected.size(); ++row_idx) {
      for (size_t column_idx = 0; column_idx < std::size(kColumns); ++column_idx) {
        EXPECT_EQ(rows[row_idx][column_idx], expected[row_idx][column_idx])
            << reader << ", row " << row_idx + 1 << ", column " << kColumns[column_idx].name;
      }
    }
  }

  // The tool result says what each column became, and why where it is not the obvious type.
  const auto json = to_json(*exported);
  for (const auto& column : json["columns"]) {
    const std::string name = column["name"];
    if (name == "c_inet") {
      EXPECT_EQ(column["type"], "inet");
      EXPECT_EQ(column["parquet_type"], "string");
      EXPECT_EQ(column["note"], "no Parquet type: PostgreSQL's text form");
    } else if (name == "c_numeric_nan") {
      EXPECT_NE(column["note"].get<std::string>().find("NaN"), std::string::npos);
    } else if (name == "c_interval") {
      EXPECT_NE(column["note"].get<std::string>().find("months"), std::string::npos);
    } else if (name == "c_valid_to") {
      EXPECT_NE(column["note"].get<std::string>().find("'infinity'"), std::string::npos);
    } else if (name == "id") {
      EXPECT_FALSE(column.contains("note"));
    }
  }
}

// avg() and division of numerics give unconstrained numerics with 16 to 20 decimals: every one
// arrives, in a decimal both readers compute with.
TEST_F(ExportTypesTest, AveragesOfNumericsKeepEveryDigit) {
  const std::string sql =
      "SELECT n % 7 AS k, avg(n::numeric / 3) AS mean, sum(n) / 7.0 AS share "
      "FROM numbers GROUP BY k";
  auto exported = export_into(sql, "means.parquet");
  ASSERT_TRUE(exported) << exported.error().message;
  EXPECT_EQ(exported->summary.rows, 7u);
  const auto kinds = kinds_of({{"k", "plain"}, {"mean", "decimal"}, {"share", "decimal"}});
  const auto expected = postgres_json("k, trim_scale(mean)::text, trim_scale(share)::text",
                                      "(" + sql + ") AS q", "k");
  const auto read = read_back(exported->path, kinds);
  ASSERT_TRUE(read.is_object()) << read;
  EXPECT_EQ(read["polars"]["rows"], expected);
  EXPECT_EQ(read["duckdb"]["rows"], expected);
  // Means with more decimals than the 9 a fixed decimal(38, 9) would have kept.
  size_t most_decimals = 0;
  for (const auto& row : expected) {
    const std::string mean = row[1];
    if (mean.find('.') != std::string::npos) {
      most_decimals = std::max(most_decimals, mean.size() - mean.find('.') - 1);
    }
  }
  EXPECT_GE(most_decimals, 16u) << expected;
}

// query_database shows PostgreSQL's text; the export's values are the same values.
TEST_F(ExportTypesTest, QueryDatabaseAndExportQueryAgree) {
  const std::string sql =
      "SELECT id, c_enum, c_inet, c_range, c_numeric_fine, c_numeric_wide, c_valid_to "
      "FROM every_type";
  QueryOptions options;
  auto queried = query_database(PostgresEnvironment::get().server().reader_conninfo, sql, options);
  ASSERT_TRUE(queried) << queried.error().message;
  auto exported = export_into(sql, "agree.parquet");
  ASSERT_TRUE(exported) << exported.error().message;
  const auto kinds = kinds_of({{"id", "plain"},
                               {"c_enum", "plain"},
                               {"c_inet", "plain"},
                               {"c_range", "plain"},
                               {"c_numeric_fine", "decimal"},
                               {"c_numeric_wide", "plain"},
                               {"c_valid_to", "plain"}});
  const auto read = read_back(exported->path, kinds);
  ASSERT_TRUE(read.is_object()) << read;
  const auto& rows = read["polars"]["rows"];
  ASSERT_EQ(rows.size(), queried->rows.size());
  for (size_t row_idx = 0; row_idx < rows.size(); ++row_idx) {
    // query_database's rows come in the table's order, the export's sorted by id: 1, 2, 3.
    const auto& values = queried->rows[row_idx];
    const int id = std::stoi(*values[0]);
    const auto& exported_row = rows[static_cast<size_t>(id - 1)];
    for (size_t column_idx = 1; column_idx < values.size(); ++column_idx) {
      SCOPED_TRACE(fmt::format("id {}, {}", id, queried->columns[column_idx].name));
      const auto& value = values[column_idx];
      if (!value) {
        EXPECT_TRUE(exported_row[column_idx].is_null());
        continue;
      }
      std::string text = *value;
      if (queried->columns[column_idx].name == "c_numeric_fine") {  // the same number, whatever
                                                                    // its trailing zeros
        text.erase(text.find_last_not_of('0') + 1);
        if (text.ends_with('.')) text.pop_back();
      }
      EXPECT_EQ(exported_row[column_idx], text);
    }
  }
}

}  // namespace
}  // namespace quarry::data

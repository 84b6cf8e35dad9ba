// The data boundary end to end, with a real PostgreSQL and real sandboxes: every exported type
// read back inside a sandbox with Polars and compared value by value with what PostgreSQL
// holds, and nothing secret (passwords, URL, socket, port) reachable from inside.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "common/sha256.h"
#include "data/connection.h"
#include "data/sandbox_export.h"
#include "postgres_environment.h"
#include "sandbox_environment.h"

namespace quarry::data {
namespace {

using quarry::testing::PostgresEnvironment;
using quarry::testing::python;
using quarry::testing::SandboxEnvironment;
using quarry::testing::ScopedSandbox;

Result<SandboxExport> export_into(const std::string& sandbox_id, const std::string& sql,
                                  const std::string& filename) {
  SandboxExportRequest request;
  request.data_dir = SandboxEnvironment::get().config().sandbox.data_dir;
  request.conninfo = PostgresEnvironment::get().server().reader_conninfo;
  request.sql = sql;
  request.filename = filename;
  request.options.row_group_rows = 2;  // several row groups even for this small table
  request.temp_dir = std::filesystem::temp_directory_path();
  return export_to_sandbox(request,
                           *upload_to(SandboxEnvironment::get().provider(), sandbox_id, -1));
}

// One column of round_trip: how PostgreSQL writes its canonical JSON value (`{}` is the
// column), and how the sandbox script turns what Polars reads into the same JSON.
struct Column {
  const char* name;
  const char* canonical_sql;
  const char* python_kind;
  const char* polars_dtype;
};

constexpr const char* kText =
    "CASE WHEN octet_length({0}::text) > 1000 THEN to_json('sha256:' || "
    "encode(sha256(convert_to({0}::text, 'UTF8')), 'hex')) ELSE to_json({0}) END";

const Column kColumns[] = {
    {"id", "to_json({})", "plain", "Int32"},
    {"c_smallint", "to_json({})", "plain", "Int16"},
    {"c_integer", "to_json({})", "plain", "Int32"},
    {"c_bigint", "to_json({})", "plain", "Int64"},
    {"c_real", "to_json({}::float8)", "plain", "Float32"},
    {"c_double", "to_json({})", "plain", "Float64"},
    {"c_numeric", "to_json({}::text)", "decimal", "Decimal(precision=12, scale=3)"},
    // Unconstrained: the scale its values need (9), every digit kept.
    {"c_numeric_free", "to_json(trim_scale({})::text)", "decimal_trimmed",
     "Decimal(precision=38, scale=9)"},
    {"c_boolean", "to_json({})", "plain", "Boolean"},
    {"c_text", kText, "text", "String"},
    {"c_varchar", kText, "text", "String"},
    {"c_char", "to_json({})", "text", "String"},  // keeps char(5)'s padding
    {"c_date", "to_json({})", "iso", "Date"},
    {"c_timestamp", "to_json({})", "iso", "Datetime(time_unit='us', time_zone=None)"},
    {"c_timestamptz", "to_json({})", "iso", "Datetime(time_unit='us', time_zone='UTC')"},
    {"c_time", "to_json(to_char(date '2000-01-01' + {}, 'HH24:MI:SS.US'))", "time", "Time"},
    {"c_uuid", "to_json({})", "plain", "String"},
    {"c_json", "to_json({}::text)", "plain", "String"},
    {"c_jsonb", "to_json({}::text)", "plain", "String"},
    {"c_bytea", "to_json(encode({}, 'hex'))", "bytes", "Binary"},
    {"c_int_array", "to_json({})", "plain", "List(Int32)"},
    {"c_text_array", "to_json({})", "plain", "List(String)"},
    {"c_numeric_array", "to_json({})", "decimal_list", "List(Decimal(precision=6, scale=2))"},
    {"c_all_null", "to_json({})", "plain", "Int32"},
};

// Reads the Parquet file with Polars and prints {"height", "dtypes", "rows"} as JSON.
constexpr const char* kReadBack = R"(
import hashlib, json, sys
import polars as pl

df = pl.read_parquet(sys.argv[1])
kinds = json.loads(sys.argv[2])

def canonical(value, kind):
    if value is None:
        return None
    if kind == "decimal":
        return format(value, "f")
    if kind == "decimal_trimmed":
        return format(value.normalize(), "f")
    if kind == "text":
        data = value.encode()
        return "sha256:" + hashlib.sha256(data).hexdigest() if len(data) > 1000 else value
    if kind == "iso":
        return value.isoformat()
    if kind == "time":
        return value.strftime("%H:%M:%S.%f")
    if kind == "bytes":
        return value.hex()
    if kind == "decimal_list":
        return [None if item is None else float(item) for item in value]
    return value

rows = [[canonical(row[name], kind) for name, kind in kinds] for row in df.iter_rows(named=True)]
print(json.dumps({"height": df.height, "dtypes": {n: str(t) for n, t in df.schema.items()},
                  "rows": rows}))
)";

nlohmann::json read_back_in_sandbox(const std::string& sandbox_id, const std::string& path) {
  nlohmann::json kinds = nlohmann::json::array();
  for (const auto& column : kColumns)
    kinds.push_back({column.name, column.python_kind});
  auto run = quarry::testing::run(sandbox_id, {"python3", "-c", kReadBack, path, kinds.dump()});
  EXPECT_TRUE(run) << run.error().message;
  if (!run) return {};
  EXPECT_EQ(run->exit_code, 0) << run->stderr_text;
  return nlohmann::json::parse(run->stdout_text, nullptr, false);
}

TEST(DataBoundary, EveryTypeRoundTripsIntoASandboxAndPolars) {
  ScopedSandbox sandbox;
  ASSERT_FALSE(sandbox.id().empty());
  auto exported =
      export_into(sandbox.id(), "SELECT * FROM round_trip ORDER BY id", "types.parquet");
  ASSERT_TRUE(exported) << exported.error().message;
  EXPECT_EQ(exported->path, SandboxEnvironment::get().config().sandbox.data_dir + "/types.parquet");
  EXPECT_EQ(exported->summary.rows, 4u);
  EXPECT_GT(exported->summary.bytes, 0u);
  EXPECT_EQ(to_json(*exported)["path"], exported->path);

  // What PostgreSQL holds, in the same canonical JSON.
  std::string expressions;
  for (const auto& column : kColumns) {
    expressions += fmt::format("{}{}", expressions.empty() ? "" : ", ",
                               fmt::format(fmt::runtime(column.canonical_sql), column.name));
  }
  auto connection = Connection::open(PostgresEnvironment::get().server().admin_conninfo);
  ASSERT_TRUE(connection) << connection.error().message;
  auto expected = connection->exec(fmt::format(
      "SELECT json_agg(json_build_array({}) ORDER BY id)::text FROM round_trip", expressions));
  ASSERT_TRUE(expected) << expected.error().message;
  const auto expected_rows = nlohmann::json::parse(PQgetvalue(expected->get(), 0, 0));

  const auto read = read_back_in_sandbox(sandbox.id(), exported->path);
  ASSERT_TRUE(read.is_object()) << read;
  EXPECT_EQ(read["height"], 4);
  for (const auto& column : kColumns) {
    EXPECT_EQ(read["dtypes"][column.name], column.polars_dtype) << column.name;
  }
  ASSERT_EQ(read["rows"].size(), expected_rows.size());
  for (size_t row_idx = 0; row_idx < expected_rows.size(); ++row_idx) {
    for (size_t column_idx = 0; column_idx < std::size(kColumns); ++column_idx) {
      EXPECT_EQ(read["rows"][row_idx][column_idx], expected_rows[row_idx][column_idx])
          << "row " << row_idx << ", column " << kColumns[column_idx].name;
    }
  }
  // The 1 MiB value really is one (compared by hash above).
  EXPECT_TRUE(expected_rows[3][9].get<std::string>().starts_with("sha256:"));

  // An empty result keeps its schema; an unconstrained numeric, having no values to need a
  // scale, takes none.
  auto empty = export_into(sandbox.id(), "SELECT * FROM round_trip WHERE false", "empty.parquet");
  ASSERT_TRUE(empty) << empty.error().message;
  const auto read_empty = read_back_in_sandbox(sandbox.id(), empty->path);
  EXPECT_EQ(read_empty["height"], 0);
  auto dtypes = read["dtypes"];
  dtypes["c_numeric_free"] = "Decimal(precision=38, scale=0)";
  EXPECT_EQ(read_empty["dtypes"], dtypes);
}

TEST(DataBoundary, CutExportsSaySoAndBadNamesAreRefused) {
  ScopedSandbox sandbox;
  SandboxExportRequest request;
  auto upload = *upload_to(SandboxEnvironment::get().provider(), sandbox.id(), -1);
  request.data_dir = SandboxEnvironment::get().config().sandbox.data_dir;
  request.conninfo = PostgresEnvironment::get().server().reader_conninfo;
  request.sql = "SELECT n FROM numbers";
  request.filename = "numbers.parquet";
  request.options.max_rows = 10;
  request.temp_dir = std::filesystem::temp_directory_path();
  auto cut = export_to_sandbox(request, upload);
  ASSERT_TRUE(cut) << cut.error().message;
  EXPECT_EQ(cut->summary.rows, 10u);
  EXPECT_TRUE(cut->summary.truncated);
  auto count = python(sandbox.id(),
                      "import polars as pl; print(pl.read_parquet('" + cut->path + "').height)");
  ASSERT_TRUE(count);
  EXPECT_EQ(count->stdout_text, "10\n");

  // A bad name is refused, and the file already there is untouched.
  for (const char* name : {"../numbers.parquet", "/tmp/x.parquet", "numbers.csv", ".parquet"}) {
    SCOPED_TRACE(name);
    request.filename = name;
    auto refused = export_to_sandbox(request, upload);
    ASSERT_FALSE(refused);
    EXPECT_EQ(refused.error().code, ErrorCode::kInvalidArgument);
  }
  request.filename = "numbers.parquet";
  request.sql = "SELECT nope FROM numbers";
  ASSERT_FALSE(export_to_sandbox(request, upload));
  count = python(sandbox.id(),
                 "import polars as pl; print(pl.read_parquet('" + cut->path + "').height)");
  ASSERT_TRUE(count);
  EXPECT_EQ(count->stdout_text, "10\n");
}

// Looks for the passwords without bringing them in: every 32-hex-digit token found in the
// environment and in files is hashed and compared with the passwords' SHA-256. Then tries the
// database's port and socket.
constexpr const char* kLookForSecrets = R"(
import hashlib, json, os, re, socket, sys

targets = set(sys.argv[1].split(","))
port, socket_path = int(sys.argv[2]), sys.argv[3]
token = re.compile(rb"[0-9a-f]{32}")
found = []

def check(data, where):
    for match in set(token.findall(data)):
        if hashlib.sha256(match).hexdigest() in targets:
            found.append(where)

environment = "\n".join(f"{k}={v}" for k, v in os.environ.items())
check(environment.encode(), "environment")
try:
    open("/proc/1/environ", "rb").read()
    proc1 = "readable"
except OSError as error:
    proc1 = type(error).__name__

# Every file but the kernel's views and the image's system and Python trees, which were built
# before (and without) any database.
skip = {"/proc", "/sys", "/dev", "/usr", "/opt/quarry/venv"}
scanned = 0
for top, dirs, files in os.walk("/"):
    dirs[:] = [d for d in dirs if os.path.join(top, d) not in skip]
    for name in files:
        path = os.path.join(top, name)
        try:
            if os.path.islink(path) or not os.path.isfile(path):
                continue
            with open(path, "rb") as f:
                data = f.read(64 << 20)
        except OSError:
            continue
        scanned += 1
        check(data, path)

def tcp(port):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
        return "connected"
    except OSError as error:
        return type(error).__name__

def unix(path):
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(2)
    try:
        s.connect(path)
        return "connected"
    except OSError as error:
        return type(error).__name__
    finally:
        s.close()

print(json.dumps({"found": found, "proc1_environ": proc1, "scanned_files": scanned,
                  "environment": environment, "tcp": tcp(port), "unix": unix(socket_path),
                  "socket_dir_exists": os.path.exists(os.path.dirname(socket_path))}))
)";

TEST(DataBoundary, NothingSecretCrossesIntoTheSandbox) {
  const auto& postgres = PostgresEnvironment::get();
  ScopedSandbox sandbox;
  ASSERT_FALSE(sandbox.id().empty());
  auto exported = export_into(sandbox.id(), "SELECT n FROM numbers", "numbers.parquet");
  ASSERT_TRUE(exported) << exported.error().message;

  const std::string targets =
      sha256_hex(postgres.reader_password()) + "," + sha256_hex(postgres.admin_password());
  const std::string socket_path =
      (postgres.server().socket_dir / fmt::format(".s.PGSQL.{}", postgres.server().port)).string();
  ASSERT_TRUE(std::filesystem::exists(socket_path)) << "the host side has the socket";
  auto run = quarry::testing::run(sandbox.id(),
                                  {"python3", "-c", kLookForSecrets, targets,
                                   std::to_string(postgres.server().port), socket_path},
                                  std::chrono::seconds(120));
  ASSERT_TRUE(run) << run.error().message;
  ASSERT_EQ(run->exit_code, 0) << run->stderr_text;
  const auto report = nlohmann::json::parse(run->stdout_text);

  EXPECT_EQ(report["found"], nlohmann::json::array()) << "a password is inside the sandbox";
  EXPECT_GT(report["scanned_files"].get<int>(), 1);  // at least the export and the home files
  EXPECT_NE(report["proc1_environ"], "readable");
  const std::string environment = report["environment"];
  for (const char* word : {"quarry_reader", "quarry_admin", "postgresql://", "PGPASSWORD", "PGHOST",
                           "password", "DATABASE_URL"}) {
    EXPECT_EQ(environment.find(word), std::string::npos) << word << " in:\n" << environment;
  }
  EXPECT_EQ(environment.find(postgres.server().socket_dir.string()), std::string::npos);
  EXPECT_EQ(report["tcp"], "ConnectionRefusedError");
  EXPECT_EQ(report["unix"], "FileNotFoundError");
  EXPECT_EQ(report["socket_dir_exists"], false);
}

}  // namespace
}  // namespace quarry::data

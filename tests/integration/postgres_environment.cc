#include "postgres_environment.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "common/file_util.h"
#include "common/unique_fd.h"
#include "data/connection.h"

namespace quarry::testing {
namespace {

PostgresEnvironment* g_postgres = nullptr;

// A loopback port nobody listens on right now.
uint16_t free_port() {
  UniqueFd sock(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof address;
  if (::bind(sock.get(), reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
      ::getsockname(sock.get(), reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    return 0;
  }
  return ntohs(address.sin_port);
}

// The tables the data tests read: every exportable type, and a plain sequence of numbers.
constexpr std::string_view kTables = R"(
CREATE TABLE round_trip (
  id integer PRIMARY KEY,
  c_smallint smallint, c_integer integer, c_bigint bigint,
  c_real real, c_double double precision,
  c_numeric numeric(12, 3), c_numeric_free numeric,
  c_boolean boolean,
  c_text text, c_varchar varchar(20), c_char char(5),
  c_date date, c_timestamp timestamp, c_timestamptz timestamptz, c_time time,
  c_uuid uuid, c_json json, c_jsonb jsonb, c_bytea bytea,
  c_int_array integer[], c_text_array text[], c_numeric_array numeric(6, 2)[],
  c_all_null integer
);
INSERT INTO round_trip VALUES
  (1, 12, 123456, 1234567890123, 3.14, 2.718281828459045, 12.34, 1.5, true,
   'plain text', 'varchar', 'abcde', '2024-02-29', '2024-02-29 13:45:01.123456',
   '2024-02-29 13:45:01.123456+02', '13:45:01.5', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11',
   '{"a": [1, 2, {"b": null}]}', '{"k": "v", "n": 1.5}', '\x00ff10',
   '{1,NULL,3}', '{"x",NULL,"with \"quotes\""}', '{1.25,NULL}', NULL),
  (2, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
   NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL),
  (3, -32768, 2147483647, -9223372036854775808, -1.5e-10, 1e308, -999999999.999,
   123456789.123456789, false, 'Zürich — 東京 🚀 ünïcødé', '', 'ab', '0001-01-01',
   '1970-01-01 00:00:00', '1999-12-31 23:59:59.999999+00', '23:59:59.999999',
   '00000000-0000-0000-0000-000000000000', '[]', '[1, "two", true]', '\x',
   '{}', '{}', '{}', NULL),
  (4, 0, 0, 0, 0, 0, 0.001, 0.000000001, true, repeat('ab€', 209715), 'x', 'x', '2100-12-31',
   '2100-12-31 23:59:59', '2100-12-31 23:59:59+00', '00:00:00',
   'ffffffff-ffff-ffff-ffff-ffffffffffff', '"string"', 'null', '\xdeadbeef',
   '{-1}', '{"é"}', '{-9999.99}', NULL);
CREATE TABLE numbers AS SELECT n FROM generate_series(1, 1000) AS n;
GRANT SELECT ON round_trip, numbers TO quarry_reader;
)";

}  // namespace

PostgresEnvironment& PostgresEnvironment::get() {
  return *g_postgres;
}

void PostgresEnvironment::SetUp() {
  g_postgres = this;
  state_dir_ = fmt::format("/tmp/qd-{}", ::getpid());
  std::filesystem::remove_all(state_dir_);
  const uint16_t port = free_port();
  ASSERT_NE(port, 0) << "no free loopback port";
  postgres_.emplace(state_dir_, port);
  auto server = postgres_->up();
  ASSERT_TRUE(server) << server.error().message;
  server_ = *server;
  auto credentials = read_file(postgres_->directory() / "credentials.json");
  ASSERT_TRUE(credentials) << credentials.error().message;
  auto json = nlohmann::json::parse(*credentials);
  admin_password_ = json.at("admin_password");
  reader_password_ = json.at("reader_password");
  admin_sql(std::string(kTables));
}

void PostgresEnvironment::TearDown() {
  if (postgres_) {
    auto stopped = postgres_->down();
    EXPECT_TRUE(stopped) << stopped.error().message;
  }
  std::filesystem::remove_all(state_dir_);
}

void admin_sql(const std::string& sql) {
  auto connection = data::Connection::open(PostgresEnvironment::get().server().admin_conninfo);
  ASSERT_TRUE(connection) << connection.error().message;
  auto done = connection->exec_script(sql);
  ASSERT_TRUE(done) << done.error().message;
}

int64_t running_statements(std::string_view marker) {
  auto connection = data::Connection::open(PostgresEnvironment::get().server().admin_conninfo);
  EXPECT_TRUE(connection) << connection.error().message;
  if (!connection) return -1;
  auto count = connection->exec(
      "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' AND pid <> pg_backend_pid() "
      "AND strpos(query, $1) > 0",
      {std::string(marker)});
  EXPECT_TRUE(count) << count.error().message;
  return count ? std::stoll(PQgetvalue(count->get(), 0, 0)) : -1;
}

StopAfter::StopAfter(std::chrono::milliseconds after)
    : fd_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)), stopper_([fd = fd_.get(), after] {
        std::this_thread::sleep_for(after);
        const uint64_t one = 1;
        [[maybe_unused]] ssize_t written = ::write(fd, &one, sizeof(one));
      }) {}

StopAfter::~StopAfter() {
  stopper_.join();
}

// Registered before main() runs, beside whatever environments the binary's main adds.
[[maybe_unused]] ::testing::Environment* const g_registered =
    ::testing::AddGlobalTestEnvironment(new PostgresEnvironment);

}  // namespace quarry::testing

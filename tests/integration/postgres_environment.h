// A real PostgreSQL for the data tests: quarry's own private server (PostgresServer) in a
// state directory of this test binary, on a free loopback port, with the tables the tests
// read. Registered as a gtest Environment by postgres_environment.cc itself.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <thread>

#include "common/unique_fd.h"
#include "data/postgres_server.h"

namespace quarry::testing {

class PostgresEnvironment : public ::testing::Environment {
 public:
  void SetUp() override;
  void TearDown() override;

  static PostgresEnvironment& get();
  const data::ServerInfo& server() const { return server_; }
  // The passwords of the two roles, for tests that look for them where they must not be.
  const std::string& admin_password() const { return admin_password_; }
  const std::string& reader_password() const { return reader_password_; }
  const std::filesystem::path& state_dir() const { return state_dir_; }

 private:
  std::filesystem::path state_dir_;
  std::optional<data::PostgresServer> postgres_;
  data::ServerInfo server_;
  std::string admin_password_;
  std::string reader_password_;
};

// Runs SQL as the superuser (test setup); fails the test on error.
void admin_sql(const std::string& sql);

// How many statements PostgreSQL is running whose text contains `marker` (this one aside), as
// the superuser sees them in pg_stat_activity; -1 (and a failed test) if it cannot tell.
int64_t running_statements(std::string_view marker);

// A Stop as the server gives a turn one: an eventfd that becomes readable `after` from now.
class StopAfter {
 public:
  explicit StopAfter(std::chrono::milliseconds after);
  ~StopAfter();
  StopAfter(const StopAfter&) = delete;
  StopAfter& operator=(const StopAfter&) = delete;
  int fd() const { return fd_.get(); }

 private:
  UniqueFd fd_;
  std::thread stopper_;
};

}  // namespace quarry::testing

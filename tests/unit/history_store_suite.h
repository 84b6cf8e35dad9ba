// The HistoryStore test suite, one body for every store: each test binary instantiates it with
// the stores it can reach (SQLite in the unit tests; PostgreSQL in the data tests, which start
// a real server). A backend makes a fresh, empty history per test and opens it as often as a
// test asks (a reopen sees everything written before).
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <memory>
#include <string>

#include "common/clock.h"
#include "conversation/history_store.h"

namespace quarry::conversation::testing {

class HistoryBackend {
 public:
  virtual ~HistoryBackend() = default;
  // Opens the test's history (creating and migrating it the first time).
  virtual Result<std::unique_ptr<HistoryStore>> open(const Clock& clock) = 0;
  // Records `version` as the history's schema version, as a newer quarry would have.
  virtual void set_schema_version(int version) = 0;
  // Everything the history holds, schema and rows, as one text: equal before and after means
  // nothing was modified.
  virtual std::string fingerprint() = 0;
  // SQLite keeps any bytes; PostgreSQL text keeps valid UTF-8 without NUL (U+FFFD in place).
  virtual bool keeps_any_bytes() const = 0;
  // PostgreSQL, shared by several servers, keeps artifacts' bytes; SQLite only their records.
  virtual bool keeps_artifact_contents() const = 0;
};

struct HistoryBackendFactory {
  std::string name;  // the instantiation's parameter name: Sqlite, Postgres
  std::function<std::unique_ptr<HistoryBackend>()> make;
  // How gtest shows it in a failure.
  friend void PrintTo(const HistoryBackendFactory& factory, std::ostream* out) {
    *out << factory.name;
  }
};

class HistoryStoreSuite : public ::testing::TestWithParam<HistoryBackendFactory> {
 protected:
  void SetUp() override {
    backend_ = GetParam().make();
    static int counter = 0;
    files_ = std::filesystem::temp_directory_path() /
             fmt::format("quarry-history-files-{}-{}", ::getpid(), counter++);
    std::filesystem::remove_all(files_);
    std::filesystem::create_directories(files_);
  }
  void TearDown() override {
    backend_.reset();
    std::filesystem::remove_all(files_);
  }

  std::unique_ptr<HistoryStore> open() {
    auto store = backend_->open(clock_);
    EXPECT_TRUE(store) << store.error().message;
    return store ? std::move(*store) : nullptr;
  }

  std::unique_ptr<HistoryBackend> backend_;
  ManualClock clock_;
  std::filesystem::path files_;  // a directory of the test's own, for artifacts' files
};

// For INSTANTIATE_TEST_SUITE_P's name generator.
inline std::string backend_name(const ::testing::TestParamInfo<HistoryBackendFactory>& info) {
  return info.param.name;
}

}  // namespace quarry::conversation::testing

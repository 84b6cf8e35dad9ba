#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sqlite3.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <thread>

#include "common/file_util.h"
#include "common/sha256.h"
#include "conversation/sqlite_history_store.h"
#include "history_store_suite.h"

namespace quarry::conversation {
namespace {

using testing::HistoryStoreSuite;

// The suite (history_store_suite.cc) on a history.db of its own per test.
class SqliteBackend final : public testing::HistoryBackend {
 public:
  SqliteBackend() {
    dir_ =
        std::filesystem::temp_directory_path() / fmt::format("quarry-history-suite-{}", ::getpid());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  ~SqliteBackend() override { std::filesystem::remove_all(dir_); }

  Result<std::unique_ptr<HistoryStore>> open(const Clock& clock) override {
    ASSIGN_OR_RETURN(auto store, SqliteHistoryStore::open(dir_ / "history.db", clock));
    return store;
  }
  void set_schema_version(int version) override {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open((dir_ / "history.db").c_str(), &db), SQLITE_OK);
    sqlite3_exec(db, fmt::format("PRAGMA user_version = {}", version).c_str(), nullptr, nullptr,
                 nullptr);
    sqlite3_close(db);
  }
  std::string fingerprint() override { return sha256_hex(*read_file(dir_ / "history.db")); }
  bool keeps_any_bytes() const override { return true; }
  bool keeps_artifact_contents() const override { return false; }

 private:
  std::filesystem::path dir_;
};

INSTANTIATE_TEST_SUITE_P(Sqlite, HistoryStoreSuite,
                         ::testing::Values(testing::HistoryBackendFactory{
                             "Sqlite", [] { return std::make_unique<SqliteBackend>(); }}),
                         testing::backend_name);

class HistoryStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / fmt::format("quarry-history-{}", ::getpid());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    path_ = dir_ / "history.db";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::unique_ptr<SqliteHistoryStore> open() {
    auto store = SqliteHistoryStore::open(path_, clock_);
    EXPECT_TRUE(store) << store.error().message;
    return store ? std::move(*store) : nullptr;
  }

  std::string file_hash() { return sha256_hex(*read_file(path_)); }

  std::filesystem::path dir_, path_;
  ManualClock clock_;
};

TEST_F(HistoryStoreTest, RefusesFilesThatAreNotItsHistory) {
  std::ofstream(path_) << "these are my notes, not a database";
  const auto before = file_hash();
  auto store = SqliteHistoryStore::open(path_, clock_);
  ASSERT_FALSE(store);
  EXPECT_NE(store.error().message.find("not an SQLite file"), std::string::npos);
  EXPECT_EQ(file_hash(), before);

  std::filesystem::remove(path_);
  sqlite3* db = nullptr;
  sqlite3_open(path_.c_str(), &db);
  sqlite3_exec(db, "CREATE TABLE recipes (name TEXT)", nullptr, nullptr, nullptr);
  sqlite3_close(db);
  const auto foreign = file_hash();
  auto other = SqliteHistoryStore::open(path_, clock_);
  ASSERT_FALSE(other);
  EXPECT_NE(other.error().message.find("another application"), std::string::npos);
  EXPECT_EQ(file_hash(), foreign);
}

// The history holds what users asked and what their data showed: no other host user may read
// it, neither a new one nor one an older quarry made readable to all.
TEST_F(HistoryStoreTest, OnlyItsOwnerMayReadTheHistory) {
  auto mode = [](const std::filesystem::path& path) {
    return std::filesystem::status(path).permissions() & std::filesystem::perms::all;
  };
  using std::filesystem::perms;
  {
    auto store = open();
    ASSERT_TRUE(store);
    ASSERT_TRUE(store->create_conversation("private"));
    EXPECT_EQ(mode(path_), perms::owner_read | perms::owner_write);
    auto wal = path_;
    wal += "-wal";
    ASSERT_TRUE(std::filesystem::exists(wal));
    EXPECT_EQ(mode(wal), perms::owner_read | perms::owner_write);
  }
  std::filesystem::permissions(
      path_, perms::owner_read | perms::owner_write | perms::group_read | perms::others_read);
  auto store = open();
  ASSERT_TRUE(store);
  EXPECT_EQ(mode(path_), perms::owner_read | perms::owner_write);
}

TEST_F(HistoryStoreTest, RefusesADamagedDatabaseAndLeavesIt) {
  {
    auto store = open();
    auto id = store->create_conversation("c")->id;
    for (int i = 0; i < 200; ++i) {
      Message m;
      m.content = std::string(500, 'm');
      store->append_message(id, m);
    }
  }
  // Checkpointed and closed; now damage the pages after the header.
  {
    std::fstream file(path_, std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(4096 * 2);
    std::string garbage(4096 * 3, '\x5a');
    file.write(garbage.data(), static_cast<std::streamsize>(garbage.size()));
  }
  const auto before = file_hash();
  auto store = SqliteHistoryStore::open(path_, clock_);
  ASSERT_FALSE(store);
  EXPECT_EQ(store.error().code, ErrorCode::kFailedPrecondition);
  EXPECT_NE(store.error().message.find("damaged"), std::string::npos) << store.error().message;
  EXPECT_EQ(file_hash(), before);
}

// A writer SIGKILLed in the middle of writing: on reopen the database is whole and holds an
// unbroken prefix of what was written.
TEST_F(HistoryStoreTest, AWriterKilledMidWriteLeavesAConsistentStore) {
  std::string id = open()->create_conversation("busy")->id;
  int written[2];
  ASSERT_EQ(::pipe2(written, O_CLOEXEC), 0);
  pid_t writer = ::fork();
  if (writer == 0) {
    ManualClock clock;
    auto store = SqliteHistoryStore::open(path_, clock);
    if (!store) ::_exit(1);
    for (int i = 0;; ++i) {
      Message m;
      m.turn = i;
      m.content = fmt::format("message {} {}", i, std::string(static_cast<size_t>(i % 5000), 'x'));
      if (!(*store)->append_message(id, m)) ::_exit(2);
      if (i == 20 && ::write(written[1], "x", 1) != 1) ::_exit(3);
    }
  }
  ::close(written[1]);
  // Killed some time after its 21st message, wherever it is in writing another.
  char byte = 0;
  ASSERT_EQ(::read(written[0], &byte, 1), 1) << "the writer stopped before its 21st message";
  ::close(written[0]);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ASSERT_EQ(::kill(writer, SIGKILL), 0);
  int status = 0;
  ::waitpid(writer, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status)) << "the writer stopped on its own: " << status;

  auto store = open();
  ASSERT_TRUE(store);
  auto messages = store->messages(id);
  ASSERT_TRUE(messages) << messages.error().message;
  ASSERT_GT(messages->size(), 10u);
  for (size_t i = 0; i < messages->size(); ++i) {
    ASSERT_EQ((*messages)[i].turn, static_cast<int>(i));
    ASSERT_TRUE((*messages)[i].content.starts_with(fmt::format("message {} ", i)));
  }
  // And it takes new writes.
  EXPECT_TRUE(store->append_message(id, {}));
}

}  // namespace
}  // namespace quarry::conversation

namespace quarry::conversation {
namespace {

class HistoryStoreV2Test : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / fmt::format("quarry-history2-{}", ::getpid());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::unique_ptr<SqliteHistoryStore> open() {
    auto store = SqliteHistoryStore::open(dir_ / "history.db", clock_);
    EXPECT_TRUE(store) << store.error().message;
    return store ? std::move(*store) : nullptr;
  }
  std::filesystem::path dir_;
  ManualClock clock_;
};

TEST_F(HistoryStoreV2Test, AVersionOneHistoryIsMigratedWithItsTurns) {
  {
    // A history as quarry wrote it before turns were recorded.
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open((dir_ / "history.db").c_str(), &db), SQLITE_OK);
    const char* v1 = R"sql(
      CREATE TABLE conversations (id TEXT PRIMARY KEY, title TEXT NOT NULL,
        turns INTEGER NOT NULL DEFAULT 0, created_at INTEGER NOT NULL, updated_at INTEGER NOT NULL);
      CREATE TABLE messages (id INTEGER PRIMARY KEY AUTOINCREMENT, conversation_id TEXT NOT NULL
        REFERENCES conversations(id), turn INTEGER NOT NULL, role TEXT NOT NULL CHECK (role IN
        ('user', 'assistant', 'tool')), content TEXT NOT NULL, tool_calls TEXT, tool_call_id TEXT,
        created_at INTEGER NOT NULL);
      CREATE TABLE events (id INTEGER PRIMARY KEY AUTOINCREMENT, conversation_id TEXT NOT NULL,
        turn INTEGER NOT NULL, kind TEXT NOT NULL, sandbox_id TEXT NOT NULL, reason TEXT NOT NULL,
        details TEXT NOT NULL, created_at INTEGER NOT NULL);
      CREATE TABLE execs (id INTEGER PRIMARY KEY AUTOINCREMENT, conversation_id TEXT NOT NULL,
        turn INTEGER NOT NULL, sandbox_id TEXT NOT NULL, command TEXT NOT NULL,
        exit_code INTEGER NOT NULL, signal INTEGER, stdout TEXT NOT NULL, stderr TEXT NOT NULL,
        truncated INTEGER NOT NULL, run_ms REAL NOT NULL, cpu_ms REAL NOT NULL,
        peak_memory_bytes INTEGER NOT NULL, memory_limit_bytes INTEGER NOT NULL,
        overhead_ms REAL NOT NULL, oom INTEGER NOT NULL, timed_out INTEGER NOT NULL, message TEXT,
        started_at INTEGER NOT NULL);
      CREATE TABLE artifacts (id INTEGER PRIMARY KEY AUTOINCREMENT, conversation_id TEXT NOT NULL,
        turn INTEGER NOT NULL, name TEXT NOT NULL, type TEXT NOT NULL, size_bytes INTEGER NOT NULL,
        location TEXT NOT NULL, created_at INTEGER NOT NULL);
      CREATE TABLE sandbox_references (conversation_id TEXT PRIMARY KEY, state TEXT NOT NULL,
        sandbox_id TEXT NOT NULL, last_used_at INTEGER, files TEXT NOT NULL);
      INSERT INTO conversations VALUES ('c1', 'old', 2, 1000, 5000);
      INSERT INTO messages (conversation_id, turn, role, content, created_at) VALUES
        ('c1', 1, 'user', 'first', 1000), ('c1', 1, 'assistant', 'one', 2000),
        ('c1', 2, 'user', 'second', 4000), ('c1', 2, 'assistant', 'two', 5000);
      INSERT INTO execs (conversation_id, turn, sandbox_id, command, exit_code, stdout, stderr,
        truncated, run_ms, cpu_ms, peak_memory_bytes, memory_limit_bytes, overhead_ms, oom,
        timed_out, started_at) VALUES ('c1', 1, 's', 'python a.py', 0, '', '', 0, 1, 1, 1, 1, 0,
        0, 0, 1500);
      PRAGMA application_id = 1903325817;
      PRAGMA user_version = 1;
    )sql";
    ASSERT_EQ(sqlite3_exec(db, v1, nullptr, nullptr, nullptr), SQLITE_OK);
    sqlite3_close(db);
  }
  auto store = open();
  ASSERT_TRUE(store);
  auto conversation = *store->conversation("c1");
  EXPECT_EQ(conversation.owner, "local");
  EXPECT_TRUE(conversation.packages.empty());
  auto turns = *store->turns("c1");
  ASSERT_EQ(turns.size(), 2u);
  EXPECT_EQ(turns[1].number, 2);
  EXPECT_EQ(turns[1].status, TurnStatus::kCompleted);
  EXPECT_EQ(to_unix_ms(turns[1].started_at), 4000);
  EXPECT_EQ(store->messages("c1")->size(), 4u);
  auto execs = *store->execs("c1");
  ASSERT_EQ(execs.size(), 1u);
  EXPECT_EQ(execs[0].tool_call_id, "");
  EXPECT_EQ(execs[0].result.denied_connections, 0u);
  EXPECT_FALSE(conversation.network) << "an old conversation has the server's network";
  EXPECT_EQ(*store->begin_turn("c1", TurnKind::kAsk), 3);
}

}  // namespace
}  // namespace quarry::conversation

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

namespace quarry::conversation {
namespace {

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

TEST_F(HistoryStoreTest, KeepsAConversationInOrder) {
  auto store = open();
  auto conversation = store->create_conversation("peak views");
  ASSERT_TRUE(conversation);
  EXPECT_EQ(*store->begin_turn(conversation->id, TurnKind::kAsk), 1);
  Message question;
  question.turn = 1;
  question.content = "median views per category?";
  ASSERT_TRUE(store->append_message(conversation->id, question));
  Message call;
  call.turn = 1;
  call.role = Role::kAssistant;
  call.tool_calls = nlohmann::json::array({{{"id", "c1"}, {"name", "run_python"}}});
  ASSERT_TRUE(store->append_message(conversation->id, call));
  Message result;
  result.turn = 1;
  result.role = Role::kTool;
  result.tool_call_id = "c1";
  result.content = "music 1.2M";
  ASSERT_TRUE(store->append_message(conversation->id, result));
  clock_.advance(std::chrono::seconds(5));
  EXPECT_EQ(*store->begin_turn(conversation->id, TurnKind::kAsk), 2);
  ASSERT_TRUE(store->record_event(
      conversation->id, {0, 2, "sandbox_replaced", "abc", "dead", {{"previous", "old"}}, {}}));

  auto messages = store->messages(conversation->id);
  ASSERT_TRUE(messages);
  ASSERT_EQ(messages->size(), 3u);
  EXPECT_EQ((*messages)[0].content, "median views per category?");
  EXPECT_EQ((*messages)[1].role, Role::kAssistant);
  EXPECT_EQ((*messages)[1].tool_calls[0]["name"], "run_python");
  EXPECT_EQ((*messages)[2].tool_call_id, "c1");
  auto events = store->events(conversation->id);
  ASSERT_EQ(events->size(), 1u);
  EXPECT_EQ((*events)[0].turn, 2);
  EXPECT_EQ((*events)[0].details["previous"], "old");
  auto listed = store->conversations();
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ((*listed)[0].turns, 2);
  EXPECT_EQ((*listed)[0].title, "peak views");
}

TEST_F(HistoryStoreTest, KeepsExecMetricsArtifactsAndReferencesAcrossReopen) {
  std::string id;
  {
    auto store = open();
    id = store->create_conversation("c")->id;
    ExecRecord exec;
    exec.turn = 1;
    exec.sandbox_id = "sb";
    exec.command = "python analysis.py";
    exec.result.exit_code = 137;
    exec.result.signal = 9;
    exec.result.oom = true;
    exec.result.peak_memory_bytes = 1u << 30;
    exec.result.memory_limit_bytes = 1u << 30;
    exec.result.run_ms = 1234.5;
    exec.result.message = "Killed: command ran out of memory.";
    ASSERT_TRUE(store->record_exec(id, exec));
    ASSERT_TRUE(
        store->record_artifact(id, {0, 1, "call_1", "outputs/chart.html", "html", 42, "/x", {}}));
    SandboxReference reference;
    reference.state = "idle";
    reference.sandbox_id = "sb";
    reference.last_used_at = clock_.now();
    reference.files = {"/home/sandbox/analysis.py"};
    ASSERT_TRUE(store->set_sandbox_reference(id, reference));
  }
  auto store = open();
  auto execs = store->execs(id);
  ASSERT_EQ(execs->size(), 1u);
  EXPECT_EQ((*execs)[0].command, "python analysis.py");
  EXPECT_TRUE((*execs)[0].result.oom);
  EXPECT_EQ((*execs)[0].result.signal, 9);
  EXPECT_DOUBLE_EQ((*execs)[0].result.run_ms, 1234.5);
  EXPECT_EQ((*execs)[0].result.message, "Killed: command ran out of memory.");
  EXPECT_EQ((*store->artifacts(id))[0].name, "outputs/chart.html");
  auto reference = store->sandbox_reference(id);
  EXPECT_EQ(reference->state, "idle");
  EXPECT_EQ(reference->files, std::vector<std::string>{"/home/sandbox/analysis.py"});
  EXPECT_EQ(to_unix_ms(*reference->last_used_at), to_unix_ms(clock_.now()));
  auto all = store->sandbox_references();
  ASSERT_EQ(all->size(), 1u);
  EXPECT_EQ((*all)[0].first, id);
}

TEST_F(HistoryStoreTest, UnknownConversationsAreNotFound) {
  auto store = open();
  EXPECT_EQ(store->conversation("nope").error().code, ErrorCode::kNotFound);
  EXPECT_EQ(store->begin_turn("nope", TurnKind::kAsk).error().code, ErrorCode::kNotFound);
  EXPECT_EQ(store->append_message("nope", {}).error().code, ErrorCode::kNotFound);
  EXPECT_EQ(store->sandbox_reference("nope")->state, "new");
}

TEST_F(HistoryStoreTest, OneTurnLockPerConversation) {
  auto store = open();
  auto first = store->try_lock_turn("c1");
  ASSERT_TRUE(first);
  auto second = store->try_lock_turn("c1");
  ASSERT_FALSE(second);
  EXPECT_EQ(second.error().code, ErrorCode::kAborted);
  EXPECT_NE(second.error().message.find("already has a turn running"), std::string::npos);
  EXPECT_TRUE(store->try_lock_turn("c2"));  // other conversations are independent
  first->reset();
  EXPECT_TRUE(store->try_lock_turn("c1"));
  EXPECT_FALSE(store->try_lock_turn("../etc"));
}

TEST_F(HistoryStoreTest, RefusesADatabaseFromANewerQuarryAndLeavesIt) {
  { open()->create_conversation("keep me"); }
  {
    sqlite3* db = nullptr;
    sqlite3_open(path_.c_str(), &db);
    sqlite3_exec(db, "PRAGMA user_version = 99", nullptr, nullptr, nullptr);
    sqlite3_close(db);
  }
  const auto before = file_hash();
  auto store = SqliteHistoryStore::open(path_, clock_);
  ASSERT_FALSE(store);
  EXPECT_EQ(store.error().code, ErrorCode::kFailedPrecondition);
  EXPECT_NE(store.error().message.find("schema version 99, newer than this quarry understands"),
            std::string::npos)
      << store.error().message;
  EXPECT_EQ(file_hash(), before);
}

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
    }
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
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

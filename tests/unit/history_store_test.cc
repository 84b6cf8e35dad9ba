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
  EXPECT_TRUE((*listed)[0].packages.empty());
}

TEST_F(HistoryStoreTest, AConversationKeepsTheExtraPackagesItStartedWith) {
  auto store = open();
  const std::vector<std::string> packages = {"tabulate==0.9.0", "quarry-probe"};
  auto created = store->create_conversation("with packages", "ann", std::nullopt, packages);
  ASSERT_TRUE(created) << created.error().message;
  EXPECT_EQ(created->packages, packages);
  store.reset();
  store = open();
  auto read = store->conversation(created->id);
  ASSERT_TRUE(read);
  EXPECT_EQ(read->packages, packages);
  auto listed = store->conversations();
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ((*listed)[0].packages, packages);
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

TEST_F(HistoryStoreV2Test, TurnsAreRecordedWithTheirKindAndHowTheyEnded) {
  auto store = open();
  auto id = store->create_conversation("", "alice")->id;
  EXPECT_EQ(*store->begin_turn(id, TurnKind::kAsk), 1);
  EXPECT_EQ(*store->begin_turn(id, TurnKind::kCell), 2);
  ASSERT_TRUE(store->finish_turn(id, 1, TurnStatus::kCancelled, "cancelled by the user"));
  auto turns = *store->turns(id);
  ASSERT_EQ(turns.size(), 2u);
  EXPECT_EQ(turns[0].kind, TurnKind::kAsk);
  EXPECT_EQ(turns[0].status, TurnStatus::kCancelled);
  EXPECT_EQ(turns[0].error, "cancelled by the user");
  EXPECT_TRUE(turns[0].finished_at);
  EXPECT_EQ(turns[1].kind, TurnKind::kCell);
  EXPECT_EQ(turns[1].status, TurnStatus::kRunning);
  EXPECT_FALSE(turns[1].finished_at);
  auto unfinished = *store->unfinished_turns();
  ASSERT_EQ(unfinished.size(), 1u);
  EXPECT_EQ(unfinished[0].first, id);
  EXPECT_EQ(unfinished[0].second.number, 2);
  EXPECT_EQ(store->finish_turn(id, 7, TurnStatus::kCompleted, "").error().code,
            ErrorCode::kNotFound);
  // A name is given once, by the first question.
  ASSERT_TRUE(store->name_conversation(id, "first question"));
  ASSERT_TRUE(store->name_conversation(id, "second question"));
  EXPECT_EQ(store->conversation(id)->title, "first question");
  EXPECT_EQ(store->conversation(id)->owner, "alice");
}

TEST_F(HistoryStoreV2Test, ConversationsArePagedPerOwnerNewestFirst) {
  auto store = open();
  std::vector<std::string> alices;
  for (int i = 0; i < 5; ++i) {
    clock_.advance(std::chrono::seconds(1));
    alices.push_back(store->create_conversation(fmt::format("a{}", i), "alice")->id);
    store->create_conversation("b", "bob");
  }
  ConversationQuery query;
  query.owner = "alice";
  query.limit = 2;
  std::vector<std::string> seen;
  for (;;) {
    auto page = *store->conversations(query);
    for (const auto& conversation : page)
      seen.push_back(conversation.id);
    if (page.size() < query.limit) break;
    query.after = std::pair{page.back().updated_at, page.back().id};
  }
  std::reverse(alices.begin(), alices.end());
  EXPECT_EQ(seen, alices);
}

TEST_F(HistoryStoreV2Test, StreamEventsResumeAfterAnyEventAndDeletingRemovesEverything) {
  auto store = open();
  auto id = store->create_conversation("t")->id;
  auto other = store->create_conversation("o")->id;
  for (int turn = 1; turn <= 2; ++turn) {
    for (int64_t seq = 1; seq <= 3; ++seq) {
      ASSERT_TRUE(store->append_stream_event(
          id, {turn, seq, "text", fmt::format(R"({{"n": "{}-{}"}})", turn, seq)}));
    }
  }
  ASSERT_TRUE(store->append_stream_event(other, {1, 1, "done", "{}"}));
  auto after = *store->stream_events(id, 1, 2);
  ASSERT_EQ(after.size(), 4u);
  EXPECT_EQ(after[0].turn, 1);
  EXPECT_EQ(after[0].seq, 3);
  EXPECT_EQ(after[1].turn, 2);
  EXPECT_EQ(after[1].seq, 1);
  EXPECT_TRUE(store->stream_events(id, 2, 3)->empty());
  EXPECT_FALSE(store->append_stream_event(id, {1, 1, "text", "{}"}));  // an event is recorded once

  store->begin_turn(id, TurnKind::kAsk);
  Message message;
  message.turn = 1;
  message.content = "q";
  store->append_message(id, message);
  ExecRecord exec;
  exec.turn = 1;
  exec.tool_call_id = "call_1";
  store->record_exec(id, exec);
  ASSERT_TRUE(store->delete_conversation(id));
  EXPECT_EQ(store->conversation(id).error().code, ErrorCode::kNotFound);
  EXPECT_TRUE(store->stream_events(id, 0, 0)->empty());
  EXPECT_TRUE(store->messages(id)->empty());
  EXPECT_TRUE(store->execs(id)->empty());
  EXPECT_EQ(store->stream_events(other, 0, 0)->size(), 1u);  // the other one is untouched
  EXPECT_EQ(store->delete_conversation(id).error().code, ErrorCode::kNotFound);
}

TEST_F(HistoryStoreV2Test, ExecsAcrossConversationsWithTheirTotals) {
  auto store = open();
  auto mine = store->create_conversation("m", "alice")->id;
  auto theirs = store->create_conversation("t", "bob")->id;
  for (int i = 0; i < 3; ++i) {
    ExecRecord exec;
    exec.turn = 1;
    exec.result.run_ms = 100;
    exec.result.peak_memory_bytes = 1000u * (i + 1);
    exec.result.oom = i == 2;
    exec.result.exit_code = i == 2 ? 137 : 0;
    store->record_exec(mine, exec);
  }
  store->record_exec(theirs, ExecRecord{});
  ExecQuery query;
  query.owner = "alice";
  auto totals = *store->exec_totals(query);
  EXPECT_EQ(totals.steps, 3);
  EXPECT_DOUBLE_EQ(totals.run_ms, 300);
  EXPECT_EQ(totals.max_peak_memory_bytes, 3000u);
  EXPECT_EQ(totals.ooms, 1);
  EXPECT_EQ(totals.failures, 1);
  query.limit = 2;
  auto page = *store->find_execs(query);
  ASSERT_EQ(page.size(), 2u);
  EXPECT_GT(page[0].second.id, page[1].second.id);  // newest first
  EXPECT_EQ(page[0].first, mine);
  query.before_id = page[1].second.id;
  EXPECT_EQ(store->find_execs(query)->size(), 1u);
}

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

TEST_F(HistoryStoreV2Test, AConversationsNetworkAndAnExecsRefusedConnectionsAreKept) {
  std::string narrowed, closed, plain;
  {
    auto store = open();
    narrowed = store
                   ->create_conversation(
                       "n", "ann",
                       NetworkPolicy{NetworkMode::kAllowlist, {"pypi.org", "*.pythonhosted.org"}})
                   ->id;
    closed = store->create_conversation("c", "ann", NetworkPolicy{})->id;
    plain = store->create_conversation("p", "ann")->id;
    ExecRecord exec;
    exec.turn = 1;
    exec.sandbox_id = "sb";
    exec.command = "pip install x";
    exec.result.denied_connections = 40;
    exec.result.denials = {{"example.com", 443, "example.com is not in the allowlist"},
                           {"10.0.0.1", 80, "'10.0.0.1' is an IP address, not a name"}};
    ASSERT_TRUE(store->record_exec(narrowed, exec));
  }
  auto store = open();
  const auto kept = *store->conversation(narrowed);
  ASSERT_TRUE(kept.network);
  EXPECT_EQ(kept.network->mode, NetworkMode::kAllowlist);
  EXPECT_EQ(kept.network->allow, (std::vector<std::string>{"pypi.org", "*.pythonhosted.org"}));
  ASSERT_TRUE(store->conversation(closed)->network);
  EXPECT_EQ(store->conversation(closed)->network->mode, NetworkMode::kNone);
  EXPECT_FALSE(store->conversation(plain)->network);
  const auto execs = *store->execs(narrowed);
  ASSERT_EQ(execs.size(), 1u);
  EXPECT_EQ(execs[0].result.denied_connections, 40u);
  ASSERT_EQ(execs[0].result.denials.size(), 2u);
  EXPECT_EQ(execs[0].result.denials[1].host, "10.0.0.1");
  EXPECT_EQ(execs[0].result.denials[1].port, 80);
  EXPECT_EQ(execs[0].result.denials[0].reason, "example.com is not in the allowlist");
}

}  // namespace
}  // namespace quarry::conversation

// The HistoryStore test suite (history_store_suite.h): what every store must do alike.
#include "history_store_suite.h"

#include <algorithm>
#include <atomic>
#include <thread>

#include "common/file_util.h"

namespace quarry::conversation::testing {
namespace {

TEST_P(HistoryStoreSuite, KeepsAConversationInOrder) {
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

TEST_P(HistoryStoreSuite, AConversationKeepsTheExtraPackagesItStartedWith) {
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

TEST_P(HistoryStoreSuite, KeepsExecMetricsArtifactsAndReferencesAcrossReopen) {
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
    const auto chart = files_ / "chart.html";
    ASSERT_TRUE(write_file_atomic(chart, std::string(42, 'x')));
    ASSERT_TRUE(store->record_artifact(
        id, {0, 1, "call_1", "outputs/chart.html", "html", 42, chart.string(), {}}));
    SandboxReference reference;
    reference.state = "idle";
    reference.sandbox_id = "sb";
    reference.last_used_at = clock_.now();
    reference.files = {"/home/sandbox/analysis.py"};
    reference.kernel_names = {"df: polars.DataFrame 3 x 2"};
    reference.kernel = "exec-4242-7";
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
  EXPECT_EQ(reference->kernel_names, std::vector<std::string>{"df: polars.DataFrame 3 x 2"});
  EXPECT_EQ(reference->kernel, "exec-4242-7");
  EXPECT_EQ(to_unix_ms(*reference->last_used_at), to_unix_ms(clock_.now()));
  auto all = store->sandbox_references();
  ASSERT_EQ(all->size(), 1u);
  EXPECT_EQ((*all)[0].first, id);
}

TEST_P(HistoryStoreSuite, UnknownConversationsAreNotFound) {
  auto store = open();
  EXPECT_EQ(store->conversation("nope").error().code, ErrorCode::kNotFound);
  EXPECT_EQ(store->begin_turn("nope", TurnKind::kAsk).error().code, ErrorCode::kNotFound);
  EXPECT_EQ(store->append_message("nope", {}).error().code, ErrorCode::kNotFound);
  EXPECT_EQ(store->sandbox_reference("nope")->state, "new");
}

TEST_P(HistoryStoreSuite, OneTurnLockPerConversation) {
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

TEST_P(HistoryStoreSuite, TurnsAreRecordedWithTheirKindAndHowTheyEnded) {
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

TEST_P(HistoryStoreSuite, ConversationsArePagedPerOwnerNewestFirst) {
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

TEST_P(HistoryStoreSuite, StreamEventsResumeAfterAnyEventAndDeletingRemovesEverything) {
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

// A history several servers share keeps each artifact's bytes, so a server that did not
// collect it (another store, another directory) restores the very file; deleting the
// conversation removes them. A history of one server keeps only the record.
TEST_P(HistoryStoreSuite, AnArtifactsBytesAreRestoredExactlyWhenTheStoreKeepsThem) {
  std::string content;  // every byte value, NULs among them, and more than one page of them
  for (int i = 0; i < 70000; ++i)
    content.push_back(static_cast<char>((i * 7) % 256));
  content += std::string("\0\0end\0", 7);
  const auto collected = files_ / "a" / "result.parquet";
  std::filesystem::create_directories(collected.parent_path());
  ASSERT_TRUE(write_file_atomic(collected, content));
  int64_t artifact_id = 0;
  std::string id;
  {
    auto store = open();
    id = store->create_conversation("c")->id;
    auto recorded = store->record_artifact(
        id, {0, 1, "call_1", "result.parquet", "parquet", content.size(), collected.string(), {}});
    ASSERT_TRUE(recorded) << recorded.error().message;
    artifact_id = recorded->id;
  }
  std::filesystem::remove(collected);  // the collecting server's file is not where B looks

  auto store = open();
  const auto restored_to = files_ / "b" / "artifacts" / id / "1" / "call_1" / "result.parquet";
  auto restored = store->restore_artifact(artifact_id, restored_to);
  ASSERT_TRUE(restored) << restored.error().message;
  if (!backend_->keeps_artifact_contents()) {
    EXPECT_FALSE(*restored);
    EXPECT_FALSE(std::filesystem::exists(files_ / "b"));
    return;
  }
  ASSERT_TRUE(*restored);
  auto read = read_file(restored_to);
  ASSERT_TRUE(read) << read.error().message;
  EXPECT_EQ(read->size(), content.size());
  EXPECT_TRUE(*read == content) << "the restored bytes differ from the collected ones";
  using std::filesystem::perms;
  EXPECT_EQ(std::filesystem::status(restored_to).permissions() & perms::all,
            perms::owner_read | perms::owner_write);
  EXPECT_EQ(std::filesystem::status(restored_to.parent_path()).permissions() & perms::all,
            perms::owner_all);
  // Restored again over the first copy: still whole, nothing left beside it.
  ASSERT_TRUE(*store->restore_artifact(artifact_id, restored_to));
  EXPECT_TRUE(*read_file(restored_to) == content);
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(restored_to.parent_path()),
                          std::filesystem::directory_iterator()),
            1);

  ASSERT_TRUE(store->delete_conversation(id));
  auto after_delete = store->restore_artifact(artifact_id, files_ / "c" / "result.parquet");
  ASSERT_TRUE(after_delete) << after_delete.error().message;
  EXPECT_FALSE(*after_delete);
}

TEST_P(HistoryStoreSuite, ExecsAcrossConversationsWithTheirTotals) {
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

TEST_P(HistoryStoreSuite, AConversationsNetworkAndAnExecsRefusedConnectionsAreKept) {
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

// Two stores on one history are two servers: a turn lock one holds, the other cannot take,
// until it is let go.
TEST_P(HistoryStoreSuite, ATurnLockHoldsAcrossStores) {
  auto one = open();
  auto other = open();
  auto id = one->create_conversation("shared")->id;
  auto held = one->try_lock_turn(id);
  ASSERT_TRUE(held) << held.error().message;
  auto refused = other->try_lock_turn(id);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code, ErrorCode::kAborted);
  held->reset();
  auto taken = other->try_lock_turn(id);
  EXPECT_TRUE(taken) << taken.error().message;
  EXPECT_EQ(one->try_lock_turn(id).error().code, ErrorCode::kAborted);
}

TEST_P(HistoryStoreSuite, RefusesAHistoryFromANewerQuarryAndLeavesIt) {
  { open()->create_conversation("keep me"); }
  backend_->set_schema_version(99);
  const auto before = backend_->fingerprint();
  auto store = backend_->open(clock_);
  ASSERT_FALSE(store);
  EXPECT_EQ(store.error().code, ErrorCode::kFailedPrecondition);
  EXPECT_NE(store.error().message.find("schema version 99, newer than this quarry understands"),
            std::string::npos)
      << store.error().message;
  EXPECT_NE(store.error().message.find("left it as it is"), std::string::npos);
  EXPECT_EQ(backend_->fingerprint(), before);
}

// A command's output may hold any bytes; a store never refuses it for that.
TEST_P(HistoryStoreSuite, OutputThatIsNotTextIsStored) {
  auto store = open();
  auto id = store->create_conversation("bytes")->id;
  const char kRaw[] = "ok \xff\xfe, a \0 NUL, \xe2\x82 cut, \xc3\xa9 kept";
  const std::string raw(kRaw, sizeof kRaw - 1);
  ExecRecord exec;
  exec.turn = 1;
  exec.command = "cat /dev/urandom";
  exec.result.stdout_text = raw;
  ASSERT_TRUE(store->record_exec(id, exec));
  Message message;
  message.role = Role::kTool;
  message.content = raw;
  ASSERT_TRUE(store->append_message(id, message));
  const std::string stored = (*store->execs(id))[0].result.stdout_text;
  EXPECT_EQ((*store->messages(id))[0].content, stored);
  if (backend_->keeps_any_bytes()) {
    EXPECT_EQ(stored, raw);
  } else {
    EXPECT_EQ(stored, "ok \uFFFD\uFFFD, a \uFFFD NUL, \uFFFD\uFFFD cut, \u00e9 kept");
  }
}

// The server calls a store from many threads at once.
TEST_P(HistoryStoreSuite, ManyThreadsWriteAndReadAtOnce) {
  auto store = open();
  constexpr int kThreads = 12, kMessages = 25;
  std::vector<std::string> ids;
  for (int i = 0; i < kThreads; ++i)
    ids.push_back(store->create_conversation(fmt::format("c{}", i))->id);
  std::vector<std::thread> threads;
  std::atomic<int> failures = 0;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kMessages; ++i) {
        Message message;
        message.turn = i;
        message.content = fmt::format("{}", i);
        if (!store->append_message(ids[static_cast<size_t>(t)], message)) ++failures;
        if (!store->conversations()) ++failures;
      }
    });
  }
  for (auto& thread : threads)
    thread.join();
  EXPECT_EQ(failures, 0);
  for (const auto& id : ids) {
    auto messages = *store->messages(id);
    ASSERT_EQ(messages.size(), static_cast<size_t>(kMessages));
    for (int i = 0; i < kMessages; ++i)
      EXPECT_EQ(messages[static_cast<size_t>(i)].content, fmt::format("{}", i));
  }
}

}  // namespace
}  // namespace quarry::conversation::testing

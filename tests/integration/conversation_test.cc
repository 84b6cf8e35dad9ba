// Conversations over real sandboxes: the lifecycle, replacement of dead sandboxes, the idle
// reaper, one turn at a time.
#include <gtest/gtest.h>
#include <signal.h>
#include <sqlite3.h>

#include <sstream>
#include <thread>

#include "common/file_util.h"
#include "conversation/conversation_manager.h"
#include "conversation/sqlite_history_store.h"
#include "sandbox_environment.h"

namespace quarry::testing {
namespace {

using conversation::ConversationManager;
using conversation::Message;
using conversation::SqliteHistoryStore;

class ConversationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto& environment = SandboxEnvironment::get();
    db_ = environment.fresh_history_path();
    auto store = SqliteHistoryStore::open(db_, clock_);
    ASSERT_TRUE(store) << store.error().message;
    history_ = std::move(*store);
    conversation::ManagerOptions options;
    options.instance_id = fmt::format("test-{}", ::getpid());
    options.spec.resources = environment.config().sandbox.resources;
    options.prepare.directories = {environment.config().sandbox.data_dir,
                                   environment.config().sandbox.output_dir};
    options.idle_timeout = std::chrono::minutes(15);
    options_ = options;
    manager_ =
        std::make_unique<ConversationManager>(environment.provider(), *history_, clock_, options);
  }
  void TearDown() override {
    if (manager_) (void)manager_->shutdown();
  }

  std::string sandbox_of(const std::string& conversation_id) {
    return history_->sandbox_reference(conversation_id)->sandbox_id;
  }
  std::vector<std::string> event_kinds(const std::string& conversation_id) {
    std::vector<std::string> kinds;
    auto events = history_->events(conversation_id);
    for (const auto& event : *events) {
      if (event.kind != "state") kinds.push_back(fmt::format("{}:{}", event.turn, event.kind));
    }
    return kinds;
  }
  Result<conversation::Execution> sh(conversation::Turn& turn, const std::string& script) {
    sandbox::ExecRequest request;
    request.argv = {"sh", "-c", script};
    return turn.sandbox().execute(request);
  }

  ManualClock clock_;
  std::filesystem::path db_;
  std::unique_ptr<SqliteHistoryStore> history_;
  conversation::ManagerOptions options_;
  std::unique_ptr<ConversationManager> manager_;
};

TEST_F(ConversationTest, FirstUseCreatesAndLaterTurnsReuseTheSandbox) {
  auto id = history_->create_conversation("reuse")->id;
  {
    auto turn = manager_->begin_turn(id);
    ASSERT_TRUE(turn) << turn.error().message;
    EXPECT_EQ(history_->sandbox_reference(id)->state, "new");  // nothing made yet
    ASSERT_TRUE((*turn)->sandbox().write_file("analysis.py", "print(6351)\n"));
    sandbox::ExecRequest request;
    request.argv = {"python", "analysis.py"};
    auto run = (*turn)->sandbox().execute(request);
    ASSERT_TRUE(run) << run.error().message;
    EXPECT_EQ(run->result.stdout_text, "6351\n");
    EXPECT_FALSE(run->notice);
  }
  const std::string first = sandbox_of(id);
  EXPECT_EQ(history_->sandbox_reference(id)->state, "idle");
  {
    auto turn = manager_->begin_turn(id);
    ASSERT_TRUE(turn);
    auto run = sh(**turn, "python analysis.py");  // the file from turn 1 is still there
    ASSERT_TRUE(run) << run.error().message;
    EXPECT_EQ(run->result.stdout_text, "6351\n");
  }
  EXPECT_EQ(sandbox_of(id), first);
  EXPECT_EQ(event_kinds(id), std::vector<std::string>{"1:sandbox_ready"});
  // Every exec is in the history with its metering.
  auto execs = history_->execs(id);
  ASSERT_EQ(execs->size(), 2u);
  EXPECT_EQ((*execs)[0].command, "python analysis.py");
  EXPECT_EQ((*execs)[1].turn, 2);
  EXPECT_GT((*execs)[1].result.peak_memory_bytes, 0u);
  // The state machine's every step is recorded.
  std::vector<std::string> transitions;
  auto events = history_->events(id);
  for (const auto& event : *events) {
    if (event.kind == "state") {
      transitions.push_back(fmt::format("{}->{}", event.details["from"].get<std::string>(),
                                        event.details["to"].get<std::string>()));
    }
  }
  EXPECT_EQ(transitions,
            (std::vector<std::string>{"new->starting", "starting->assigned", "assigned->busy",
                                      "busy->idle", "idle->busy", "busy->idle"}));
}

TEST_F(ConversationTest, ADeadSandboxIsReplacedAndItsFilesReportedMissing) {
  auto id = history_->create_conversation("crash")->id;
  Message question;
  question.turn = 1;
  question.content = "keep me";
  {
    auto turn = manager_->begin_turn(id);
    history_->append_message(id, question);
    ASSERT_TRUE((*turn)->sandbox().write_file("/home/sandbox/analysis.py", "print('hi')\n"));
    ASSERT_TRUE(sh(**turn, "python analysis.py"));
  }
  const std::string old = sandbox_of(id);
  // Kill the sandbox's init between turns, behind the manager's back.
  ASSERT_NO_FATAL_FAILURE(kill_init_of(old));

  auto turn = manager_->begin_turn(id);
  ASSERT_TRUE(turn);
  auto run = sh(**turn, "cat analysis.py");
  ASSERT_TRUE(run) << run.error().message;
  EXPECT_NE(run->result.exit_code, 0);  // the file is gone...
  ASSERT_TRUE(run->notice);             // ...and the model is told, not left to guess
  EXPECT_NE(run->notice->find("new sandbox"), std::string::npos) << *run->notice;
  EXPECT_NE(run->notice->find("/home/sandbox/analysis.py"), std::string::npos) << *run->notice;
  EXPECT_NE(sandbox_of(id), old);
  EXPECT_EQ(event_kinds(id), (std::vector<std::string>{"1:sandbox_ready", "2:sandbox_deleted",
                                                       "2:sandbox_ready", "2:sandbox_replaced"}));
  auto events = *history_->events(id);
  auto replaced = std::find_if(events.begin(), events.end(),
                               [](const auto& e) { return e.kind == "sandbox_replaced"; });
  EXPECT_EQ(replaced->details["previous"], old);
  EXPECT_EQ(replaced->reason, "dead");
  // The conversation itself is untouched.
  auto messages = *history_->messages(id);
  ASSERT_EQ(messages.size(), 1u);
  EXPECT_EQ(messages[0].content, "keep me");
  // The next command in the new sandbox carries no notice.
  auto again = sh(**turn, "true");
  ASSERT_TRUE(again);
  EXPECT_FALSE(again->notice);
}

TEST_F(ConversationTest, TheIdleReaperDeletesAndTheConversationGoesOn) {
  auto id = history_->create_conversation("idle")->id;
  {
    auto turn = manager_->begin_turn(id);
    ASSERT_TRUE((*turn)->sandbox().write_file("result.txt", "42"));
  }
  const std::string first = sandbox_of(id);
  clock_.advance(std::chrono::minutes(14));
  EXPECT_EQ(*manager_->reap_idle(), 0);
  EXPECT_TRUE(*SandboxEnvironment::get().provider().is_alive(first));
  clock_.advance(std::chrono::minutes(2));
  EXPECT_EQ(*manager_->reap_idle(), 1);
  EXPECT_EQ(SandboxEnvironment::get().provider().is_alive(first).error().code,
            ErrorCode::kNotFound);
  EXPECT_EQ(history_->sandbox_reference(id)->state, "deleted");
  auto events = *history_->events(id);
  EXPECT_EQ(events.back().kind, "sandbox_deleted");
  EXPECT_EQ(events.back().reason, "idle");

  auto turn = manager_->begin_turn(id);
  auto run = sh(**turn, "cat result.txt || echo missing");
  ASSERT_TRUE(run) << run.error().message;
  EXPECT_EQ(run->result.stdout_text, "missing\n");
  ASSERT_TRUE(run->notice);
  EXPECT_NE(run->notice->find("idle for more than 15m"), std::string::npos) << *run->notice;
  EXPECT_NE(sandbox_of(id), first);
}

TEST_F(ConversationTest, TheReaperLeavesTurnsInProgressAlone) {
  auto id = history_->create_conversation("busy")->id;
  {
    auto turn = manager_->begin_turn(id);
    ASSERT_TRUE(sh(**turn, "true"));
  }
  auto turn = manager_->begin_turn(id);  // holds the conversation
  clock_.advance(std::chrono::hours(1));
  EXPECT_EQ(*manager_->reap_idle(), 0);
  EXPECT_TRUE(*SandboxEnvironment::get().provider().is_alive(sandbox_of(id)));
}

TEST_F(ConversationTest, ASandboxLeftBusyByATurnWhoseProcessDiedIsCountedAndReapedAgain) {
  auto id = history_->create_conversation("interrupted")->id;
  {
    auto turn = manager_->begin_turn(id);
    ASSERT_TRUE(sh(**turn, "echo kept > kept.txt"));
  }
  const std::string sandbox_id = sandbox_of(id);
  // What a process killed in the middle of a step leaves: a turn running, the sandbox busy.
  ASSERT_TRUE(history_->begin_turn(id, conversation::TurnKind::kAsk));
  auto reference = *history_->sandbox_reference(id);
  reference.state = "busy";
  ASSERT_TRUE(history_->set_sandbox_reference(id, reference));

  // The next process (its own scheduler, which has never seen the sandbox) goes on with it.
  conversation::ManagerOptions options = options_;
  options.capacity.max_sandboxes = 1;
  ConversationManager next(SandboxEnvironment::get().provider(), *history_, clock_, options);
  {
    auto turn = next.begin_turn(id);
    ASSERT_TRUE(turn) << turn.error().message;
    EXPECT_EQ(history_->turns(id)->at(1).status, conversation::TurnStatus::kInterrupted);
    auto run = sh(**turn, "cat kept.txt");
    ASSERT_TRUE(run) << run.error().message;
    EXPECT_EQ(run->result.stdout_text, "kept\n");
    EXPECT_EQ(sandbox_of(id), sandbox_id);
    EXPECT_EQ(next.scheduler().stats().busy, 1) << "the sandbox in use is counted";
  }
  EXPECT_EQ(next.scheduler().stats().idle, 1);
  clock_.advance(std::chrono::hours(1));
  EXPECT_EQ(*next.reap_idle(), 1) << "idle again, it is reaped like any other";
  EXPECT_EQ(SandboxEnvironment::get().provider().is_alive(sandbox_id).error().code,
            ErrorCode::kNotFound);
  (void)next.shutdown();
}

TEST_F(ConversationTest, ASandboxTheHistoryCouldNotRecordIsDestroyedNotLeftInUse) {
  auto id = history_->create_conversation("unrecorded")->id;
  auto turn = manager_->begin_turn(id);
  ASSERT_TRUE(turn) << turn.error().message;
  // Another writer holds the history (the store gives up after its busy timeout, 5 s).
  sqlite3* other = nullptr;
  ASSERT_EQ(sqlite3_open(db_.c_str(), &other), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(other, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr), SQLITE_OK);
  auto refused = sh(**turn, "true");
  sqlite3_exec(other, "ROLLBACK", nullptr, nullptr, nullptr);
  sqlite3_close(other);
  ASSERT_FALSE(refused);
  const auto stats = manager_->scheduler().stats();
  EXPECT_EQ(stats.busy + stats.idle + stats.starting, 0) << "no sandbox left counted";
  auto left = SandboxEnvironment::get().provider().find(
      {{std::string(conversation::kConversationLabel), id}});
  ASSERT_TRUE(left);
  EXPECT_TRUE(left->empty()) << "the sandbox nobody recorded was destroyed";

  // The history writable again, the turn's next step runs in a sandbox of its own.
  auto run = sh(**turn, "echo ran");
  ASSERT_TRUE(run) << run.error().message;
  EXPECT_EQ(run->result.stdout_text, "ran\n");
  EXPECT_EQ(manager_->scheduler().stats().busy, 1);
}

TEST_F(ConversationTest, OneTurnAtATimePerConversation) {
  auto id = history_->create_conversation("concurrent")->id;
  auto other = history_->create_conversation("other")->id;
  auto first = manager_->begin_turn(id);
  ASSERT_TRUE(first);
  auto second = manager_->begin_turn(id);
  ASSERT_FALSE(second);
  EXPECT_EQ(second.error().code, ErrorCode::kAborted);
  EXPECT_NE(second.error().message.find("already has a turn running"), std::string::npos);
  EXPECT_TRUE(manager_->begin_turn(other));  // other conversations are not held up
  first->reset();
  EXPECT_TRUE(manager_->begin_turn(id));
}

// The reaper, an eviction or shutdown holds a conversation's lock for a moment between turns
// (as delete_between_turns does): a turn asked for meanwhile waits for it rather than being
// told a turn is running, and so does a delete (told so, the user would cancel, and the cancel
// would find no turn).
TEST_F(ConversationTest, ATurnAndADeleteWaitForALockHeldBetweenTurns) {
  auto hold_briefly = [&](const std::string& id) {
    auto held = history_->try_lock_turn(id);
    EXPECT_TRUE(held);
    return std::thread([held = std::move(held)]() mutable {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      if (held) held->reset();
    });
  };
  auto id = history_->create_conversation("evicted meanwhile")->id;
  auto release = hold_briefly(id);
  auto turn = manager_->begin_turn(id);
  release.join();
  ASSERT_TRUE(turn) << turn.error().message;
  EXPECT_EQ((*turn)->number(), 1);

  auto reaped = history_->create_conversation("reaped meanwhile")->id;
  release = hold_briefly(reaped);
  auto deleted = manager_->delete_conversation(reaped);
  release.join();
  ASSERT_TRUE(deleted) << deleted.error().message;
  EXPECT_EQ(history_->conversation(reaped).error().code, ErrorCode::kNotFound);
}

// Many threads race for turns of one conversation; each turn checks, inside its sandbox, that
// no other command of the conversation is running at the same time.
TEST_F(ConversationTest, ConcurrentTurnsNeverShareTheSandbox) {
  auto id = history_->create_conversation("race")->id;
  std::atomic<int> turns_run = 0, refused = 0, overlaps = 0;
  std::vector<std::thread> threads;
  for (int t = 0; t < 6; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 4; ++i) {
        auto turn = manager_->begin_turn(id);
        if (!turn) {
          if (turn.error().code == ErrorCode::kAborted) ++refused;
          std::this_thread::sleep_for(std::chrono::milliseconds(5));
          continue;
        }
        auto run = sh(**turn,
                      "if [ -e /tmp/in-turn ]; then echo overlap; fi; touch /tmp/in-turn; "
                      "sleep 0.05; rm /tmp/in-turn");
        if (run && run->result.stdout_text.find("overlap") != std::string::npos) ++overlaps;
        ++turns_run;
      }
    });
  }
  for (auto& thread : threads)
    thread.join();
  EXPECT_GT(turns_run.load(), 0);
  EXPECT_GT(refused.load(), 0);
  EXPECT_EQ(overlaps.load(), 0);
}

TEST_F(ConversationTest, ShutdownDeletesEverySandboxItHolds) {
  auto a = history_->create_conversation("a")->id;
  auto b = history_->create_conversation("b")->id;
  for (const auto& id : {a, b}) {
    auto turn = manager_->begin_turn(id);
    ASSERT_TRUE(sh(**turn, "true"));
  }
  EXPECT_EQ(*manager_->shutdown(), 2);
  EXPECT_TRUE(SandboxEnvironment::get()
                  .provider()
                  .find({{std::string(conversation::kInstanceLabel), options_.instance_id}})
                  ->empty());
  for (const auto& id : {a, b}) {
    EXPECT_EQ(history_->events(id)->back().reason, "shutdown");
    EXPECT_EQ(history_->sandbox_reference(id)->state, "deleted");
  }
}

}  // namespace
}  // namespace quarry::testing

// A server process killed without warning leaves its sandboxes running; the next run of the
// same instance destroys them and carries on with every conversation. A normal stop leaves
// nothing.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <sstream>

#include "child_process.h"
#include "conversation/conversation_manager.h"
#include "conversation/sqlite_history_store.h"
#include "sandbox_environment.h"

namespace quarry::testing {
namespace {

// A conversation_server child whose stdout we read line by line.
class ServerProcess {
 public:
  ServerProcess(const std::string& history, const std::string& instance, int conversations)
      : process_({(std::filesystem::path(QUARRY_BUILD_DIR) / "tests/conversation_server").string(),
                  SandboxEnvironment::get().state_dir().string(),
                  SandboxEnvironment::get().cache_dir().string(), history, instance,
                  std::to_string(conversations)}) {
    EXPECT_TRUE(process_.started());
  }
  std::string line() { return process_.line().value_or(""); }
  // Sends `signal` and returns the exit status.
  int stop(int signal) { return process_.stop(signal); }

 private:
  ChildProcess process_;
};

std::vector<std::string> ids_after(const std::string& line, std::string_view prefix) {
  std::vector<std::string> ids;
  if (!line.starts_with(prefix)) return ids;
  std::istringstream words(line.substr(prefix.size()));
  for (std::string id; words >> id;)
    ids.push_back(id);
  return ids;
}

class ServerRestartTest : public ::testing::Test {
 protected:
  void SetUp() override {
    instance_ = fmt::format("restart-{}-{}", ::getpid(),
                            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    history_path_ = (SandboxEnvironment::get().state_dir() / (instance_ + ".db")).string();
  }
  std::vector<sandbox::SandboxInfo> sandboxes() {
    return *SandboxEnvironment::get().provider().find(
        {{std::string(conversation::kInstanceLabel), instance_}});
  }
  std::string instance_, history_path_;
};

TEST_F(ServerRestartTest, AfterSigkillTheNextRunDestroysOrphansAndKeepsConversations) {
  std::vector<std::string> conversations;
  {
    ServerProcess first(history_path_, instance_, 3);
    EXPECT_EQ(first.line(), "orphans 0");
    conversations = ids_after(first.line(), "ready ");
    ASSERT_EQ(conversations.size(), 3u);
    int status = first.stop(SIGKILL);
    EXPECT_TRUE(WIFSIGNALED(status));
  }
  // Killed: its sandboxes live on.
  auto left = sandboxes();
  ASSERT_EQ(left.size(), 3u);
  for (const auto& info : left)
    EXPECT_EQ(info.state, sandbox::SandboxState::kRunning);

  ServerProcess second(history_path_, instance_, 0);
  EXPECT_EQ(second.line(), "orphans 3");
  EXPECT_EQ(second.line(), "ready");
  EXPECT_TRUE(sandboxes().empty());
  reap_orphaned_inits();
  for (const auto& info : left)
    EXPECT_TRUE(host_processes_of(info.id).empty());

  // Every conversation is there, knows why its sandbox went, and goes on in a new one.
  SystemClock clock;
  auto history = conversation::SqliteHistoryStore::open(history_path_, clock);
  ASSERT_TRUE(history) << history.error().message;
  EXPECT_EQ((*history)->conversations()->size(), 3u);
  conversation::ManagerOptions options;
  options.instance_id = instance_;
  options.spec.resources = SandboxEnvironment::get().config().sandbox.resources;
  conversation::ConversationManager manager(SandboxEnvironment::get().provider(), **history, clock,
                                            options);
  for (const auto& id : conversations) {
    auto events = (*history)->events(id);
    ASSERT_TRUE(events);
    EXPECT_EQ(events->back().kind, "sandbox_deleted");
    EXPECT_EQ(events->back().reason, "orphan");
    EXPECT_EQ(events->back().turn, 1);
    auto turn = manager.begin_turn(id);
    ASSERT_TRUE(turn) << turn.error().message;
    EXPECT_EQ((*turn)->number(), 2);
    sandbox::ExecRequest request;
    request.argv = {"sh", "-c", "cat work.txt || true"};
    auto run = (*turn)->sandbox().execute(request);
    ASSERT_TRUE(run) << run.error().message;
    ASSERT_TRUE(run->notice);
  }
  EXPECT_EQ(second.stop(SIGTERM), 0);
  (void)manager.shutdown();
}

TEST_F(ServerRestartTest, ANormalStopLeavesNoSandbox) {
  ServerProcess server(history_path_, instance_, 2);
  EXPECT_EQ(server.line(), "orphans 0");
  ASSERT_EQ(ids_after(server.line(), "ready ").size(), 2u);
  ASSERT_EQ(sandboxes().size(), 2u);
  int status = server.stop(SIGTERM);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_EQ(server.line(), "shutdown 2");
  EXPECT_TRUE(sandboxes().empty());
}

}  // namespace
}  // namespace quarry::testing

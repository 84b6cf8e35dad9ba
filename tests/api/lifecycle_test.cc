// The server's life: a SIGTERM lets running turns finish within the grace, cancels the rest
// (recorded), destroys this run's sandboxes and exits 0; a SIGKILL in the middle of a command
// leaves nothing that outlives the turn, and after a restart the conversation goes on with a
// history a real model accepts. The same for `quarry ask` killed under its command.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <thread>

#include "api_environment.h"
#include "child_process.h"
#include "common/file_util.h"
#include "conversation/conversation_manager.h"
#include "sandbox_environment.h"

namespace quarry::testing {
namespace {

std::vector<sandbox::SandboxInfo> api_sandboxes() {
  auto found = SandboxEnvironment::get().provider().find(
      {{std::string(conversation::kInstanceLabel), "api-test"}});
  EXPECT_TRUE(found);
  return found ? *found : std::vector<sandbox::SandboxInfo>{};
}

bool output_contains(const StreamEvent& event, std::string_view text) {
  return event.type == "output" &&
         event.data["text"].get<std::string>().find(text) != std::string::npos;
}

// The messages of the last request the model got, as (role, tool_call_id or first call id).
std::vector<nlohmann::json> last_request_to_model() {
  auto requests = ApiEnvironment::get().requests_to_model();
  return requests.empty() ? std::vector<nlohmann::json>{}
                          : requests.back()["body"]["messages"].get<std::vector<nlohmann::json>>();
}

TEST(Lifecycle, SigtermLetsARunningTurnFinishThenDestroysTheSandboxes) {
  QuarryServer server({.scenario = "slow_answer"});
  ASSERT_TRUE(server.started());
  ApiClient api(server.url());
  // A sandbox in another conversation (a cell here would count as a model step, and the
  // scripted model answers by the count).
  api.cell(api.create_conversation(), "python", "print('a sandbox to destroy')");
  ASSERT_EQ(api_sandboxes().size(), 1u);
  const auto id = api.create_conversation();
  BackgroundStream turn(api, "POST", fmt::format("/api/v1/conversations/{}/messages", id),
                        R"({"content": "Answer slowly"})");
  ASSERT_TRUE(turn.wait_for_type("turn_started"));

  const int status = server.stop(SIGTERM);  // returns once the server exited
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << server.log();
  auto stream = turn.finish();
  ASSERT_FALSE(stream.events.empty());
  EXPECT_EQ(stream.events.back().data["status"], "completed");
  EXPECT_EQ(stream.events.back().data["answer"], "Here is the answer, after some thought.");
  EXPECT_TRUE(api_sandboxes().empty());
  EXPECT_NE(server.log().find("destroyed 1 sandbox"), std::string::npos) << server.log();
}

TEST(Lifecycle, SigtermCancelsWhatOutlivesTheGraceAndRecordsWhy) {
  std::string id;
  {
    QuarryServer server({.scenario = "long_command", .server_config = "  shutdown_grace: 1s\n"});
    ASSERT_TRUE(server.started());
    ApiClient api(server.url());
    id = api.create_conversation();
    BackgroundStream turn(api, "POST", fmt::format("/api/v1/conversations/{}/messages", id),
                          R"({"content": "Run the long one"})");
    ASSERT_TRUE(turn.wait_for([](const auto& event) { return output_contains(event, "started"); }));
    const int status = server.stop(SIGTERM);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << server.log();
    auto stream = turn.finish();
    ASSERT_FALSE(stream.events.empty());
    const auto& done = stream.events.back();
    EXPECT_EQ(done.data["status"], "cancelled");
    EXPECT_NE(done.data["error"].get<std::string>().find("the server shut down"),
              std::string::npos);
    EXPECT_TRUE(api_sandboxes().empty());
  }
  QuarryServer restarted({.scenario = "long_command"});
  ASSERT_TRUE(restarted.started());
  ApiClient api(restarted.url());
  auto document = api.get("/api/v1/conversations/" + id);
  ASSERT_EQ(document.json["turns"].size(), 1u);
  EXPECT_EQ(document.json["turns"][0]["status"], "cancelled");
  EXPECT_NE(document.json["turns"][0]["error"].get<std::string>().find("shutdown_grace"),
            std::string::npos);
  EXPECT_EQ(document.json["sandbox"]["state"], "deleted");
  EXPECT_EQ(restarted.stop(SIGTERM), 0);
}

TEST(Lifecycle, SigkillUnderACommandThenRestartTheConversationGoesOn) {
  std::string id, sandbox_id;
  {
    QuarryServer server({.scenario = "long_command"});
    ASSERT_TRUE(server.started());
    ApiClient api(server.url());
    id = api.create_conversation();
    api.expect_breaks();
    BackgroundStream turn(api, "POST", fmt::format("/api/v1/conversations/{}/messages", id),
                          R"({"content": "Run the long one"})");
    auto ready = turn.wait_for([](const auto& event) {
      return event.type == "sandbox" && event.data["kind"] == "sandbox_ready";
    });
    ASSERT_TRUE(ready);
    sandbox_id = ready->data["sandbox_id"];
    ASSERT_TRUE(turn.wait_for([](const auto& event) { return output_contains(event, "started"); }));
    server.stop(SIGKILL);
    turn.finish();
  }
  // Killed: its sandbox lives on, and so does what the command started in a session of its own
  // (the sandbox's init killed the command itself when the server hung up).
  ASSERT_EQ(api_sandboxes().size(), 1u);
  auto left = host_processes_of(sandbox_id);
  for (int i = 0; i < 50 && left.size() > 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    left = host_processes_of(sandbox_id);
  }
  std::string names;
  for (pid_t pid : left)
    names +=
        fmt::format("{} {}", pid, read_file(fmt::format("/proc/{}/cmdline", pid)).value_or("?"));
  EXPECT_EQ(left.size(), 2u) << names;

  QuarryServer restarted({.scenario = "long_command"});
  ASSERT_TRUE(restarted.started());
  // The orphan is gone, and with it the command: nothing of turn 1 runs into turn 2.
  EXPECT_TRUE(api_sandboxes().empty());
  reap_orphaned_inits();
  EXPECT_TRUE(host_processes_of(sandbox_id).empty());
  ApiClient api(restarted.url());
  auto document = api.get("/api/v1/conversations/" + id);
  ASSERT_EQ(document.json["turns"].size(), 1u);
  EXPECT_EQ(document.json["turns"][0]["status"], "interrupted");
  // A client resuming the killed turn's stream learns how it ended.
  auto resumed = api.stream("GET", fmt::format("/api/v1/conversations/{}/events?after=1-0", id), "",
                            [](const StreamEvent& event) { return event.type != "done"; });
  ASSERT_FALSE(resumed.events.empty());
  EXPECT_EQ(resumed.events.back().data["status"], "interrupted");

  auto next = api.ask(id, "Please try again");
  ASSERT_FALSE(next.events.empty());
  EXPECT_EQ(next.events.back().data["status"], "completed") << next.events.back().data.dump();
  EXPECT_EQ(next.events.back().data["answer"],
            "The previous step was interrupted before it finished; nothing it computed is known.");
  // What the model got: the call of turn 1 answered before the new question.
  auto messages = last_request_to_model();
  ASSERT_GE(messages.size(), 5u);
  EXPECT_EQ(messages[2]["role"], "assistant");
  EXPECT_EQ(messages[3]["role"], "tool");
  EXPECT_EQ(messages[3]["tool_call_id"], messages[2]["tool_calls"][0]["id"]);
  EXPECT_NE(messages[3]["content"].get<std::string>().find("interrupted"), std::string::npos);
  EXPECT_EQ(messages[4]["role"], "user");
  EXPECT_EQ(restarted.stop(SIGTERM), 0);
}

// `quarry ask` as a separate process with the config of `server`.
ChildProcess ask(const QuarryServer& server, const std::vector<std::string>& args) {
  auto& sandboxes = SandboxEnvironment::get();
  std::vector<std::string> argv = {sandboxes.quarry_binary().string(), "--config",
                                   server.config().string(),           "--state-dir",
                                   sandboxes.state_dir().string(),     "ask"};
  argv.insert(argv.end(), args.begin(), args.end());
  return ChildProcess(argv);
}

TEST(Lifecycle, QuarryAskKilledUnderACommandLeavesNothingRunningIntoTheNextTurn) {
  // A server only to write the config and to read the conversation back; the turns are asked
  // by the CLI.
  QuarryServer server({.scenario = "long_command"});
  ASSERT_TRUE(server.started());
  ApiClient api(server.url());
  const auto id = api.create_conversation();
  {
    auto first = ask(server, {"--conversation", id, "Run the long one"});
    ASSERT_TRUE(first.line_with("[run_python"));
    // The command prints "started" at once; give it a moment to be running, then kill.
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    first.stop(SIGKILL);
  }
  auto document = api.get("/api/v1/conversations/" + id);
  const std::string sandbox_id = document.json["sandbox"]["sandbox_id"];
  EXPECT_EQ(document.json["turns"][0]["status"], "running");  // nobody knows yet
  // Init killed the command when its caller went; its detached child runs on.
  EXPECT_EQ(host_processes_of(sandbox_id).size(), 2u);

  auto next = ask(server, {"--conversation", id, "Please try again"});
  const std::string output = next.rest();
  EXPECT_EQ(next.wait(), 0) << output;
  EXPECT_NE(output.find("interrupted before it finished"), std::string::npos) << output;
  // The same sandbox, without the old command.
  document = api.get("/api/v1/conversations/" + id);
  EXPECT_EQ(document.json["sandbox"]["sandbox_id"], sandbox_id);
  EXPECT_EQ(document.json["turns"][0]["status"], "interrupted");
  EXPECT_EQ(host_processes_of(sandbox_id).size(), 1u);  // init alone
  bool stopped = false;
  for (const auto& event : document.json["events"]) {
    stopped = stopped || (event["kind"] == "commands_stopped" && event["turn"] == 1);
  }
  EXPECT_TRUE(stopped);
  EXPECT_EQ(server.stop(SIGTERM), 0);
}

}  // namespace
}  // namespace quarry::testing

// The server's life: a SIGTERM or SIGINT lets running turns finish within the grace, takes no
// new request meanwhile, cancels the rest (recorded), destroys this run's sandboxes and exits 0;
// an idle sandbox is deleted by the server on its own; a SIGKILL in the middle of a command
// leaves nothing that outlives the turn, and after a restart the conversation goes on with a
// history a real model accepts. The same for `quarry ask` killed under its command.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/inotify.h>
#include <sys/wait.h>

#include <future>
#include <thread>

#include "api_environment.h"
#include "child_process.h"
#include "common/file_util.h"
#include "common/http_client.h"
#include "common/unique_fd.h"
#include "common/url.h"
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

// For command_lines_when: the sandbox runs no more than `count` processes.
auto at_most(size_t count) {
  return [count](const std::vector<std::string>& command_lines) {
    return command_lines.size() <= count;
  };
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

// SIGTERM (a service manager) and SIGINT (Ctrl-C) stop the server the same way.
class ShutdownSignal : public ::testing::TestWithParam<int> {};

TEST_P(ShutdownSignal, LetsARunningTurnFinishThenDestroysTheSandboxes) {
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

  const int status = server.stop(GetParam());  // returns once the server exited
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << server.log();
  auto stream = turn.finish();
  ASSERT_FALSE(stream.events.empty());
  EXPECT_EQ(stream.events.back().data["status"], "completed");
  EXPECT_EQ(stream.events.back().data["answer"], "Here is the answer, after some thought.");
  EXPECT_TRUE(api_sandboxes().empty());
  const std::string log = server.log();
  EXPECT_NE(
      log.find(fmt::format("{}: shutting down", GetParam() == SIGTERM ? "SIGTERM" : "SIGINT")),
      std::string::npos)
      << log;
  EXPECT_NE(log.find("destroyed 1 sandbox"), std::string::npos) << log;
}

INSTANTIATE_TEST_SUITE_P(Lifecycle, ShutdownSignal, ::testing::Values(SIGTERM, SIGINT),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return info.param == SIGTERM ? std::string("Sigterm")
                                                        : std::string("Sigint");
                         });

// A request taken before shutdown began is answered before the server exits, however slow its
// handler: here /readyz, waiting on a database that does not answer.
TEST(Lifecycle, ARequestTakenBeforeShutdownIsAnswered) {
  HungDatabase database;
  QuarryServer server({.database_url = database.url()});
  ASSERT_TRUE(server.started());
  auto probe =
      std::async(std::launch::async, [&] { return ApiClient(server.url()).get("/readyz"); });
  for (int i = 0; i < 500 && database.accepted() == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(database.accepted(), 1) << "the probe's check reached the database";

  const int status = server.stop(SIGTERM);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << server.log();
  auto answer = probe.get();
  EXPECT_EQ(answer.status, 503) << answer.body;
  EXPECT_EQ(answer.json["status"], "unavailable") << answer.body;
  EXPECT_NE(answer.json["checks"]["database"], "ok") << answer.body;
}

// A turn taken just before SIGTERM, still beginning when shutdown starts (here waiting for its
// conversation's lock, which the reaper holds like this between turns), runs like a turn that
// had begun: shutdown saw no turn running and left it queued with no worker, its stream ended
// without "done", and the history said "failed".
TEST(Lifecycle, ATurnStillBeginningWhenShutdownStartsRunsToItsEnd) {
  QuarryServer server({.scenario = "slow_answer"});
  ASSERT_TRUE(server.started());
  ApiClient api(server.url());
  const auto id = api.create_conversation();
  const auto lock_file = server.state_dir() / "turn-locks" / (id + ".lock");
  std::filesystem::create_directories(lock_file.parent_path());
  UniqueFd lock(::open(lock_file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
  ASSERT_TRUE(lock);
  ASSERT_EQ(::flock(lock.get(), LOCK_EX | LOCK_NB), 0);
  // The server opens the lock file to try it: then the turn is past every check at the door.
  UniqueFd opens(::inotify_init1(IN_CLOEXEC));
  ASSERT_GE(::inotify_add_watch(opens.get(), lock_file.c_str(), IN_OPEN), 0);
  BackgroundStream turn(api, "POST", fmt::format("/api/v1/conversations/{}/messages", id),
                        R"({"content": "Answer slowly"})");
  pollfd tried{opens.get(), POLLIN, 0};
  ASSERT_EQ(::poll(&tried, 1, 10'000), 1) << "the turn tried the conversation's lock";

  server.signal(SIGTERM);
  for (int i = 0; i < 100 && server.log().find("SIGTERM: shutting down") == std::string::npos;
       ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_NE(server.log().find("SIGTERM: shutting down"), std::string::npos) << server.log();
  lock.reset();  // the reaper is done

  auto done = turn.wait_for_type("done", std::chrono::seconds(30));
  ASSERT_TRUE(done) << server.log();
  EXPECT_EQ(done->data["status"], "completed") << done->data;
  const int status = server.wait();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << server.log();
}

TEST(Lifecycle, WhileShuttingDownNoNewRequestIsTaken) {
  QuarryServer server({.scenario = "slow_answer"});
  ASSERT_TRUE(server.started());
  ApiClient api(server.url());
  const auto id = api.create_conversation();
  const auto other = api.create_conversation();
  // Connections a client (a browser, a proxy, a load balancer) opened before, and keeps.
  KeptConnection kept(api), probe(api);
  ASSERT_EQ(kept.send("GET", "/healthz").status, 200);
  ASSERT_EQ(probe.send("GET", "/readyz").status, 200);
  BackgroundStream turn(api, "POST", fmt::format("/api/v1/conversations/{}/messages", id),
                        R"({"content": "Answer slowly"})");
  ASSERT_TRUE(turn.wait_for_type("turn_started"));

  server.signal(SIGTERM);
  for (int i = 0; i < 100 && server.log().find("SIGTERM: shutting down") == std::string::npos;
       ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_NE(server.log().find("SIGTERM: shutting down"), std::string::npos) << server.log();

  // A request on a connection from before is answered 503, saying why, and the connection is
  // closed; a load balancer's readiness probe learns it is not ready.
  auto refused = kept.send("POST", fmt::format("/api/v1/conversations/{}/messages", other),
                           R"({"content": "one more?"})");
  EXPECT_EQ(refused.status, 503);
  EXPECT_EQ(refused.json["error"]["code"], "shutting_down");
  EXPECT_NE(refused.json["error"]["message"].get<std::string>().find("shutting down"),
            std::string::npos)
      << refused.body;
  EXPECT_EQ(refused.header("Connection"), "close");
  EXPECT_TRUE(kept.closed_by_server());
  auto ready = probe.send("GET", "/readyz");
  EXPECT_EQ(ready.status, 503);
  EXPECT_EQ(ready.json["status"], "unavailable");
  EXPECT_NE(ready.json.value("reason", "").find("shutting down"), std::string::npos) << ready.body;
  // A new connection is refused: the server no longer listens.
  auto client = HttpClient::create({});
  ASSERT_TRUE(client);
  HttpRequest fresh;
  fresh.url = *parse_url(server.url());
  fresh.target = "/healthz";
  auto sent = client->send(fresh);
  ASSERT_FALSE(sent) << "answered " << sent->status;
  EXPECT_EQ(sent.error().code, ErrorCode::kUnavailable);
  EXPECT_NE(sent.error().message.find("refused"), std::string::npos) << sent.error().message;

  // The turn that ran finishes within the grace; the refused one never began.
  auto stream = turn.finish();
  ASSERT_FALSE(stream.events.empty());
  EXPECT_EQ(stream.events.back().data["status"], "completed");
  const int status = server.wait();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << server.log();
  QuarryServer restarted;
  ASSERT_TRUE(restarted.started());
  ApiClient again(restarted.url());
  EXPECT_TRUE(again.get("/api/v1/conversations/" + other).json["turns"].empty());
  EXPECT_EQ(restarted.stop(SIGTERM), 0);
}

TEST(Lifecycle, TheServerDeletesAnIdleSandboxOnItsOwnAndTheNextTurnGetsANewOne) {
  // The reaper looks every quarter of the idle timeout (at least every second).
  QuarryServer server({.sandbox_config = "  idle_timeout: 2s\n"});
  ASSERT_TRUE(server.started());
  ApiClient api(server.url());
  const auto id = api.create_conversation();
  auto first = api.cell(id, "python", "print('made a sandbox')");
  ASSERT_EQ(first.events.back().data["status"], "completed");
  const auto idle_since = std::chrono::steady_clock::now();
  std::string sandbox_id;
  for (const auto& event : of_type(first.events, "sandbox")) {
    if (event.data["kind"] == "sandbox_ready") sandbox_id = event.data["sandbox_id"];
  }
  ASSERT_FALSE(sandbox_id.empty());

  nlohmann::json document;
  for (int i = 0; i < 100; ++i) {
    document = api.get("/api/v1/conversations/" + id).json;
    if (document["sandbox"]["state"] == "deleted") break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  const auto idle_for = std::chrono::steady_clock::now() - idle_since;
  ASSERT_EQ(document["sandbox"]["state"], "deleted") << document["sandbox"].dump();
  // Not before its time (which began a moment before this client heard the cell end), and not
  // long after it.
  EXPECT_GE(idle_for, std::chrono::milliseconds(1900));
  EXPECT_LT(idle_for, std::chrono::seconds(6));
  auto alive = SandboxEnvironment::get().provider().is_alive(sandbox_id);
  EXPECT_TRUE(!alive || !*alive) << "the sandbox still runs";
  bool recorded = false;
  for (const auto& event : document["events"]) {
    recorded = recorded || (event["kind"] == "sandbox_deleted" && event["reason"] == "idle" &&
                            event["sandbox_id"] == sandbox_id);
  }
  EXPECT_TRUE(recorded) << document["events"].dump();
  EXPECT_NE(server.log().find("idle sandbox"), std::string::npos) << server.log();

  // The conversation goes on in a new sandbox.
  auto next = api.cell(id, "python", "print('again')");
  ASSERT_EQ(next.events.back().data["status"], "completed");
  EXPECT_EQ(printed(next.events), "again\n");
  std::string new_id;
  for (const auto& event : of_type(next.events, "sandbox")) {
    if (event.data["kind"] == "sandbox_ready") new_id = event.data["sandbox_id"];
  }
  EXPECT_FALSE(new_id.empty());
  EXPECT_NE(new_id, sandbox_id);
  EXPECT_EQ(server.stop(SIGTERM), 0);
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
  auto left = command_lines_when(sandbox_id, at_most(2));
  EXPECT_EQ(left.size(), 2u) << fmt::format("{}", fmt::join(left, "\n"));

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
  std::string sandbox_id;
  {
    auto first = ask(server, {"--conversation", id, "Run the long one"});
    ASSERT_TRUE(first.line_with("[run_python"));
    // The CLI shows a step's output when it ends: wait for the command's child to run instead.
    for (int i = 0; i < 200 && sandbox_id.empty(); ++i) {
      const auto sandbox = api.get("/api/v1/conversations/" + id).json["sandbox"];
      if (sandbox.is_object() && sandbox.contains("sandbox_id") &&
          sandbox["sandbox_id"].is_string()) {
        sandbox_id = sandbox["sandbox_id"];
      }
      if (sandbox_id.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ASSERT_FALSE(sandbox_id.empty()) << "no sandbox was made for the step";
    const auto running = command_lines_when(sandbox_id, [](const auto& command_lines) {
      return std::ranges::any_of(command_lines, [](const std::string& line) {
        return line.find("outlived its turn") != std::string::npos;
      });
    });
    ASSERT_EQ(running.size(), 3u) << fmt::format("{}", fmt::join(running, "\n"));
    first.stop(SIGKILL);
  }
  auto document = api.get("/api/v1/conversations/" + id);
  EXPECT_EQ(document.json["turns"][0]["status"], "running");  // nobody knows yet
  // Init kills the command when its caller goes; its detached child runs on.
  const auto left = command_lines_when(sandbox_id, at_most(2));
  EXPECT_EQ(left.size(), 2u) << fmt::format("{}", fmt::join(left, "\n"));

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

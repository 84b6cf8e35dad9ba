// Turns under the user's control: one at a time per conversation, cancelled at once whether the
// model is thinking or a command is running, and the conversation usable after; cells of each
// kind; deleting a conversation whole.
#include <gtest/gtest.h>

#include <sstream>
#include <thread>

#include "api_environment.h"
#include "postgres_environment.h"
#include "sandbox_environment.h"

namespace quarry::testing {
namespace {

std::string messages_path(const std::string& id) {
  return fmt::format("/api/v1/conversations/{}/messages", id);
}

TEST(TurnControl, ASecondTurnIsRefusedWhileOneRunsAndDeletingWaitsForIt) {
  QuarryServer server;
  ASSERT_TRUE(server.started());
  ApiClient api(server.url());
  const auto id = api.create_conversation("one at a time");
  BackgroundStream running(api, "POST", fmt::format("/api/v1/conversations/{}/cells", id),
                           nlohmann::json({{"kind", "python"},
                                           {"code",
                                            "import time\n"
                                            "print('busy', flush=True)\n"
                                            "time.sleep(3)\n"
                                            "open('/home/sandbox/outputs/done.csv', 'w')"
                                            ".write('a\\n1\\n')\n"}})
                               .dump());
  ASSERT_TRUE(running.wait_for_type("output"));

  auto second = api.post(messages_path(id), {{"content", "and another thing"}});
  EXPECT_EQ(second.status, 409);
  EXPECT_EQ(second.json["error"]["code"], "turn_running");
  auto cell = api.post(fmt::format("/api/v1/conversations/{}/cells", id),
                       {{"kind", "sql_query"}, {"code", "SELECT 1"}});
  EXPECT_EQ(cell.status, 409);
  auto deleted = api.del("/api/v1/conversations/" + id);
  EXPECT_EQ(deleted.status, 409);
  EXPECT_EQ(deleted.json["error"]["code"], "turn_running");

  auto finished = running.finish();
  ASSERT_EQ(finished.events.back().type, "done");
  EXPECT_EQ(finished.events.back().data["status"], "completed");
  // Only the first turn happened.
  auto document = api.get("/api/v1/conversations/" + id);
  EXPECT_EQ(document.json["turns"].size(), 1u);
  ASSERT_EQ(document.json["artifacts"].size(), 1u);
  const std::string sandbox = document.json["sandbox"]["sandbox_id"];

  // Now it can go, whole: history, artifacts, sandbox.
  EXPECT_EQ(api.del("/api/v1/conversations/" + id).status, 204);
  EXPECT_EQ(api.get("/api/v1/conversations/" + id).status, 404);
  EXPECT_EQ(api.get(document.json["artifacts"][0]["url"]).status, 404);
  EXPECT_FALSE(std::filesystem::exists(SandboxEnvironment::get().state_dir() / "artifacts" / id));
  auto alive = SandboxEnvironment::get().provider().is_alive(sandbox);
  EXPECT_TRUE(!alive || !*alive);
  EXPECT_EQ(api.del("/api/v1/conversations/" + id).status, 404);
  EXPECT_EQ(server.stop(SIGTERM), 0);
}

// The requests the scripted model got for `model`, and the hangups of its clients.
size_t requests_for(std::string_view model) {
  size_t count = 0;
  for (const auto& request : ApiEnvironment::get().requests_to_model()) {
    count += request["body"].value("model", "") == model;
  }
  return count;
}
std::vector<nlohmann::json> hangups_of(std::string_view model) {
  std::vector<nlohmann::json> found;
  for (auto& hangup : ApiEnvironment::get().model_hangups()) {
    if (hangup["model"] == model) found.push_back(std::move(hangup));
  }
  return found;
}

TEST(TurnControl, CancelWhileTheModelIsAskedStopsTheTurnAndKeepsTheConversation) {
  // The model would answer after a minute.
  QuarryServer server({.scenario = "stalled_answer"});
  ASSERT_TRUE(server.started());
  ApiClient api(server.url());
  const auto id = api.create_conversation();
  const size_t asked = requests_for("stalled_answer");
  const size_t hung_up = hangups_of("stalled_answer").size();
  BackgroundStream turn(api, "POST", messages_path(id),
                        R"({"content": "Take your time: what is in the tables?"})");
  ASSERT_TRUE(turn.wait_for_type("turn_started"));
  // Cancel once the model has the request, so it is the model call that is cut short.
  for (int i = 0; i < 100 && requests_for("stalled_answer") == asked; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_EQ(requests_for("stalled_answer"), asked + 1) << "the model never got the question";

  const auto cancelled_at = std::chrono::steady_clock::now();
  auto cancelled = api.post(fmt::format("/api/v1/conversations/{}/cancel", id), nullptr);
  ASSERT_EQ(cancelled.status, 202) << cancelled.body;
  EXPECT_EQ(cancelled.json["turn"], 1);
  ASSERT_TRUE(turn.wait_for_type("done", std::chrono::seconds(10)));
  const auto took = std::chrono::steady_clock::now() - cancelled_at;
  EXPECT_LT(took, std::chrono::seconds(3))
      << "the turn ended " << std::chrono::duration<double>(took).count() << " s after the cancel";
  auto stream = turn.finish();
  ASSERT_FALSE(stream.events.empty());
  const auto& done = stream.events.back();
  EXPECT_EQ(done.type, "done");
  EXPECT_EQ(done.data["status"], "cancelled");
  EXPECT_EQ(done.data["error"], "cancelled by the user");
  auto errors = of_type(stream.events, "error");
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0].data["code"], "cancelled");
  // The model's answer never came: the request was closed before it, and the model server saw
  // its client hang up while it made it wait (not a minute later).
  EXPECT_TRUE(of_type(stream.events, "text").empty());
  auto hangups = hangups_of("stalled_answer");
  for (int i = 0; i < 50 && hangups.size() == hung_up; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    hangups = hangups_of("stalled_answer");
  }
  ASSERT_EQ(hangups.size(), hung_up + 1) << "the model's request was never closed";
  EXPECT_EQ(hangups.back()["during"], "delay");
  EXPECT_LT(hangups.back()["waited_ms"].get<double>(), 10000);

  auto document = api.get("/api/v1/conversations/" + id);
  ASSERT_EQ(document.json["turns"].size(), 1u);
  EXPECT_EQ(document.json["turns"][0]["status"], "cancelled");
  EXPECT_EQ(document.json["turns"][0]["error"], "cancelled by the user");
  for (const auto& message : document.json["messages"])
    EXPECT_NE(message["role"], "assistant");

  // Nothing left to cancel; and the conversation goes on.
  auto again = api.post(fmt::format("/api/v1/conversations/{}/cancel", id), nullptr);
  EXPECT_EQ(again.status, 409);
  EXPECT_EQ(again.json["error"]["code"], "no_turn_running");
  auto cell = api.cell(id, "sql_query", "SELECT 41 + 1 AS answer");
  ASSERT_EQ(cell.events.back().data["status"], "completed");
  EXPECT_NE(of_type(cell.events, "tool_finished")[0].data["content"].get<std::string>().find("42"),
            std::string::npos);
  EXPECT_EQ(server.stop(SIGTERM), 0);
}

TEST(TurnControl, CancelWhileACommandRunsKillsItAndTheNextTurnKnows) {
  QuarryServer server({.scenario = "long_command"});
  ASSERT_TRUE(server.started());
  ApiClient api(server.url());
  const auto id = api.create_conversation();
  BackgroundStream turn(api, "POST", messages_path(id), R"({"content": "Run the long one."})");
  auto ready = turn.wait_for([](const StreamEvent& event) {
    return event.type == "sandbox" && event.data["kind"] == "sandbox_ready";
  });
  ASSERT_TRUE(ready);
  const std::string sandbox_id = ready->data["sandbox_id"];
  auto started = turn.wait_for([](const StreamEvent& event) {
    return event.type == "output" &&
           event.data["text"].get<std::string>().find("started") != std::string::npos;
  });
  ASSERT_TRUE(started);
  EXPECT_EQ(host_processes_of(sandbox_id).size(), 3u);  // init, the command, its child

  auto cancelled = api.post(fmt::format("/api/v1/conversations/{}/cancel", id), nullptr);
  ASSERT_EQ(cancelled.status, 202);
  auto stream = turn.finish();
  EXPECT_EQ(stream.events.back().data["status"], "cancelled");
  // The step is stopped and the child it started is killed; the Python kernel it ran in and the
  // sandbox stay for the next turn: init and the kernel.
  EXPECT_EQ(host_processes_of(sandbox_id).size(), 2u);
  auto document = api.get("/api/v1/conversations/" + id);
  EXPECT_EQ(document.json["turns"][0]["status"], "cancelled");
  EXPECT_EQ(document.json["sandbox"]["state"], "idle");
  const auto& messages = document.json["messages"];
  ASSERT_GE(messages.size(), 3u);
  EXPECT_EQ(messages[2]["role"], "tool");
  EXPECT_EQ(messages[2]["content"], "(stopped: the turn was cancelled)");

  // The next question: the model is told the step was stopped (the scripted model would refuse
  // a history with an unanswered call, as OpenAI does).
  auto next = api.ask(id, "Please try again");
  ASSERT_EQ(next.events.back().type, "done");
  EXPECT_EQ(next.events.back().data["status"], "completed") << next.events.back().data.dump();
  EXPECT_EQ(next.events.back().data["answer"],
            "The previous step was cancelled before it finished.");
  auto late = api.cell(id, "python", "import os\nprint(os.path.exists('/home/sandbox/late.txt'))");
  EXPECT_NE(
      of_type(late.events, "tool_finished")[0].data["content"].get<std::string>().find("False"),
      std::string::npos);
  EXPECT_EQ(server.stop(SIGTERM), 0);
}

// A Stop while a query runs cancels it in PostgreSQL: the step ends as stopped, rather than
// when the statement timeout ends the query.
TEST(TurnControl, CancelWhileAQueryRunsStopsItInTheDatabase) {
  QuarryServer server;
  ASSERT_TRUE(server.started());
  ApiClient api(server.url());
  const auto id = api.create_conversation();
  BackgroundStream cell(
      api, "POST", fmt::format("/api/v1/conversations/{}/cells", id),
      R"({"kind": "sql_query", "code": "SELECT pg_sleep(30) AS quarry_stopped_cell"})");
  ASSERT_TRUE(cell.wait_for_type("tool_started"));
  for (int i = 0; i < 100 && running_statements("quarry_stopped_cell") == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_EQ(running_statements("quarry_stopped_cell"), 1) << "the query never started";

  auto cancelled = api.post(fmt::format("/api/v1/conversations/{}/cancel", id), nullptr);
  ASSERT_EQ(cancelled.status, 202) << cancelled.body;
  auto stream = cell.finish();
  EXPECT_EQ(stream.events.back().data["status"], "cancelled");
  EXPECT_EQ(running_statements("quarry_stopped_cell"), 0);
  auto document = api.get("/api/v1/conversations/" + id);
  const auto& messages = document.json["messages"];
  ASSERT_GE(messages.size(), 3u);
  EXPECT_EQ(messages[2]["role"], "tool");
  EXPECT_EQ(messages[2]["content"], "(stopped: the turn was cancelled)");
  EXPECT_EQ(server.stop(SIGTERM), 0);
}

TEST(TurnControl, TurnsOfDifferentConversationsRunAtTheSameTime) {
  QuarryServer server;
  ASSERT_TRUE(server.started());
  ApiClient api(server.url());
  // Each cell prints when it started and ended, as the sandbox's clock saw it.
  const std::string code =
      "import time\nstart = time.time()\ntime.sleep(2)\nprint(f'{start} {time.time()}')\n";
  std::vector<std::unique_ptr<BackgroundStream>> turns;
  for (int i = 0; i < 3; ++i) {
    const auto id = api.create_conversation(fmt::format("at once {}", i));
    turns.push_back(std::make_unique<BackgroundStream>(
        api, "POST", fmt::format("/api/v1/conversations/{}/cells", id),
        nlohmann::json({{"kind", "python"}, {"code", code}}).dump()));
  }
  // Meanwhile the server answers other requests as usual.
  EXPECT_EQ(api.get("/api/v1/conversations?limit=1").status, 200);
  double latest_start = 0, earliest_end = 1e300;
  for (auto& turn : turns) {
    auto stream = turn->finish();
    ASSERT_FALSE(stream.events.empty());
    ASSERT_EQ(stream.events.back().data["status"], "completed");
    std::istringstream times(printed(stream.events));
    double start = 0, end = 0;
    times >> start >> end;
    latest_start = std::max(latest_start, start);
    earliest_end = std::min(earliest_end, end);
  }
  // Every one had started before any finished: they ran side by side.
  EXPECT_LT(latest_start, earliest_end);
  EXPECT_EQ(server.stop(SIGTERM), 0);
}

TEST(TurnControl, WithOneWorkerASecondTurnWaitsForTheFirstWhileTheServerAnswersOnAsUsual) {
  QuarryServer server({.server_config = "  workers: 1\n"});
  ASSERT_TRUE(server.started());
  ApiClient api(server.url());
  ASSERT_EQ(api.get("/api/v1/info").json["workers"], 1);
  // Each cell prints when it started, waits, and prints when it ended (the sandbox's clock is
  // the host's).
  const std::string code =
      "import time\nprint(f'start {time.time()}', flush=True)\ntime.sleep(3)\n"
      "print(f'end {time.time()}', flush=True)\n";
  const std::string cell = nlohmann::json({{"kind", "python"}, {"code", code}}).dump();
  const auto first_id = api.create_conversation("first");
  const auto second_id = api.create_conversation("second");
  BackgroundStream first(api, "POST", fmt::format("/api/v1/conversations/{}/cells", first_id),
                         cell);
  ASSERT_TRUE(first.wait_for_type("output"));
  // The second is taken (not refused: 200 and its turn_started), and waits for the worker.
  BackgroundStream second(api, "POST", fmt::format("/api/v1/conversations/{}/cells", second_id),
                          cell);
  ASSERT_TRUE(second.wait_for_type("turn_started"));
  EXPECT_FALSE(second.wait_for_type("output", std::chrono::seconds(1)));

  // Meanwhile, with both turns in flight, the server answers as usual, and quickly.
  const auto asked_at = std::chrono::steady_clock::now();
  EXPECT_EQ(api.get("/healthz").status, 200);
  auto listed = api.get("/api/v1/conversations");
  EXPECT_EQ(listed.status, 200);
  EXPECT_GE(listed.json["conversations"].size(), 2u);
  auto turns = api.get("/api/v1/conversations/" + second_id).json["turns"];
  ASSERT_EQ(turns.size(), 1u);
  EXPECT_EQ(turns[0]["status"], "running");
  EXPECT_LT(std::chrono::steady_clock::now() - asked_at, std::chrono::seconds(1));
  EXPECT_FALSE(first.wait_for_type("done", std::chrono::seconds(0)))
      << "the first turn ended before the server was asked: nothing was in flight";
  // ...and a follower of the first conversation gets its events as they come.
  BackgroundStream follower(api, "GET", fmt::format("/api/v1/conversations/{}/events", first_id));
  EXPECT_TRUE(follower.wait_for([](const StreamEvent& event) {
    return event.type == "output" && event.data["text"].get<std::string>().starts_with("end");
  }));
  follower.drop();

  auto times = [](const ApiResponse& stream, std::string_view which) {
    std::istringstream words(printed(stream.events));
    std::string word;
    double time = 0;
    while (words >> word >> time) {
      if (word == which) return time;
    }
    ADD_FAILURE() << "no '" << which << "' output";
    return 0.0;
  };
  auto one = first.finish();
  auto two = second.finish();
  ASSERT_FALSE(one.events.empty());
  ASSERT_FALSE(two.events.empty());
  EXPECT_EQ(one.events.back().data["status"], "completed");
  EXPECT_EQ(two.events.back().data["status"], "completed");
  // One after the other: the second began only once the first had ended.
  EXPECT_GE(times(two, "start"), times(one, "end"));
  EXPECT_EQ(server.stop(SIGTERM), 0);
}

TEST(TurnControl, CellsOfEveryKindAreStepsLikeTheModelsOwn) {
  ApiEnvironment::get().load_demo_data();
  QuarryServer server;
  ASSERT_TRUE(server.started());
  ApiClient api(server.url());
  const auto id = api.create_conversation();

  auto query = api.cell(id, "sql_query", "SELECT count(*) AS videos FROM trending_videos");
  ASSERT_EQ(query.events.back().data["status"], "completed");
  auto finished = of_type(query.events, "tool_finished");
  ASSERT_EQ(finished.size(), 1u);
  EXPECT_EQ(finished[0].data["tool"], "query_database");
  EXPECT_TRUE(finished[0].data["exec"].is_null());

  auto exported = api.cell(id, "sql_export",
                           "SELECT video_id, max(views) AS peak FROM trending_videos GROUP BY 1",
                           "peaks.parquet");
  ASSERT_EQ(exported.events.back().data["status"], "completed");
  EXPECT_NE(of_type(exported.events, "tool_finished")[0].data["content"].get<std::string>().find(
                "Wrote 6351 rows"),
            std::string::npos);

  auto python = api.cell(id, "python",
                         "import polars as pl\n"
                         "peaks = pl.read_parquet('/home/sandbox/data/peaks.parquet')\n"
                         "print(len(peaks))\n"
                         "peaks.head(3).write_csv('/home/sandbox/outputs/top.csv')\n");
  ASSERT_EQ(python.events.back().data["status"], "completed");
  auto run = of_type(python.events, "tool_finished")[0].data;
  EXPECT_EQ(run["ok"], true);
  EXPECT_EQ(run["exec"]["exit_code"], 0);
  ASSERT_EQ(of_type(python.events, "artifact").size(), 1u);
  auto listed = api.get(fmt::format("/api/v1/conversations/{}/artifacts", id));
  ASSERT_EQ(listed.status, 200);
  ASSERT_EQ(listed.json["artifacts"].size(), 1u);
  EXPECT_EQ(listed.json["artifacts"][0]["name"], "top.csv");
  auto top = api.get(listed.json["artifacts"][0]["url"]).body;
  EXPECT_TRUE(top.starts_with("video_id,peak\n")) << top;
  EXPECT_EQ(std::count(top.begin(), top.end(), '\n'), 4);

  // Recorded as steps: the user's note, a call and its result, metered like the model's.
  auto document = api.get("/api/v1/conversations/" + id);
  EXPECT_EQ(document.json["turns"].size(), 3u);
  for (const auto& turn : document.json["turns"])
    EXPECT_EQ(turn["kind"], "cell");
  const auto& messages = document.json["messages"];
  ASSERT_EQ(messages.size(), 9u);
  EXPECT_EQ(messages[0]["details"]["cell"], "sql_query");
  EXPECT_EQ(messages[1]["tool_calls"][0]["name"], "query_database");
  EXPECT_EQ(messages[2]["tool_call_id"], messages[1]["tool_calls"][0]["id"]);
  EXPECT_EQ(messages[2]["details"]["ok"], true);
  ASSERT_EQ(document.json["execs"].size(), 1u);
  EXPECT_EQ(document.json["execs"][0]["tool"], "run_python");
  EXPECT_EQ(document.json["execs"][0]["stdout"], "6351\n");
  // The title comes from the first cell.
  EXPECT_EQ(document.json["title"], "SELECT count(*) AS videos FROM trending_videos");
  EXPECT_EQ(server.stop(SIGTERM), 0);
}

TEST(TurnControl, AStepKeepsAtMostTheOutputLimitTheServerStates) {
  QuarryServer server({.sandbox_config = "  output_limit: 1KiB\n"});
  ASSERT_TRUE(server.started());
  ApiClient api(server.url());
  EXPECT_EQ(api.get("/api/v1/info").json["sandbox"]["output_limit_bytes"], 1024);
  const auto id = api.create_conversation();
  auto cell = api.cell(id, "python", "print('x' * 5000)\nprint('the end')");
  ASSERT_FALSE(cell.events.empty());
  auto finished = of_type(cell.events, "tool_finished");
  ASSERT_EQ(finished.size(), 1u);
  const std::string content = finished[0].data["content"].get<std::string>();
  EXPECT_NE(content.find("longer than 1 KiB per stream and was cut"), std::string::npos)
      << content.substr(content.size() > 600 ? content.size() - 600 : 0);
  EXPECT_EQ(content.find("the end"), std::string::npos) << "past the limit: " << content;
  EXPECT_EQ(server.stop(SIGTERM), 0);
}

}  // namespace
}  // namespace quarry::testing

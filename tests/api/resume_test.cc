// Streams that drop: the turn goes on without its client, and the client picks up from the last
// event it saw, with nothing lost or repeated, while the turn runs (getting what it makes from
// then on as it happens) or after it ended, and after the server restarted. A client following
// a conversation sees each turn as it comes.
#include <gtest/gtest.h>

#include <sstream>

#include "api_environment.h"
#include "sandbox_environment.h"

namespace quarry::testing {
namespace {

std::vector<std::string> ids(const std::vector<StreamEvent>& events) {
  std::vector<std::string> list;
  for (const auto& event : events)
    list.push_back(event.id);
  return list;
}

// The events of turn `turn` as the server replays them from its start.
std::vector<StreamEvent> replay(ApiClient& api, const std::string& id, int turn) {
  std::vector<StreamEvent> events;
  api.stream("GET", fmt::format("/api/v1/conversations/{}/events?after={}-0", id, turn), "",
             [&](const StreamEvent& event) {
               events.push_back(event);
               return !(event.type == "done" && event.data["turn"] == turn);
             });
  return events;
}

TEST(Resume, ADroppedStreamResumesWithNothingLostOrRepeated) {
  QuarryServer server({.scenario = "resume_live"});
  ASSERT_TRUE(server.started());
  ApiClient api(server.url());
  const auto id = api.create_conversation();

  // The client goes away in the middle of the step's output; the step then waits for its gate.
  std::vector<StreamEvent> seen;
  api.stream("POST", fmt::format("/api/v1/conversations/{}/messages", id),
             R"({"content": "Count to five for me"})", [&](const StreamEvent& event) {
               seen.push_back(event);
               return event.type != "output";
             });
  ASSERT_FALSE(seen.empty());
  ASSERT_EQ(seen.back().type, "output");
  EXPECT_EQ(seen.back().data["text"], "1\n");
  std::string sandbox_id;
  for (const auto& event : seen) {
    if (event.type == "sandbox" && event.data["kind"] == "sandbox_ready") {
      sandbox_id = event.data["sandbox_id"];
    }
  }
  ASSERT_FALSE(sandbox_id.empty());

  // It comes back with the last id it saw, while the turn still runs. Nothing is new yet (the
  // step waits for the gate): the stream is open and quiet.
  BackgroundStream resumed(api, "GET", fmt::format("/api/v1/conversations/{}/events", id), "",
                           {{"Last-Event-ID", seen.back().id}});
  ASSERT_TRUE(resumed.wait_open());
  EXPECT_FALSE(resumed.wait_for([](const StreamEvent&) { return true; }, std::chrono::seconds(1)));
  EXPECT_EQ(api.get("/api/v1/conversations/" + id).json["turns"][0]["status"], "running");
  // Only now does the turn go on: what the resumed stream gets next was made after it began.
  std::istringstream gate("open");
  ASSERT_TRUE(
      SandboxEnvironment::get().provider().write_file(sandbox_id, "/home/sandbox/gate", gate, -1));
  // ...and it comes as it is made: the turn still runs when the first of it arrives.
  ASSERT_TRUE(resumed.wait_for_type("output"));
  EXPECT_EQ(api.get("/api/v1/conversations/" + id).json["turns"][0]["status"], "running");
  ASSERT_TRUE(resumed.wait_for_type("done"));
  resumed.drop();  // it would follow the conversation's next turns
  auto live = resumed.finish();
  ASSERT_EQ(live.status, 200);
  ASSERT_FALSE(live.events.empty());
  EXPECT_EQ(live.events.front().type, "output");
  EXPECT_EQ(live.events.front().data["text"], "2\n");
  EXPECT_EQ(live.events.back().type, "done");
  EXPECT_EQ(live.events.back().data["status"], "completed");
  EXPECT_FALSE(of_type(live.events, "text").empty());

  std::vector<StreamEvent> together = seen;
  together.insert(together.end(), live.events.begin(), live.events.end());
  auto whole = replay(api, id, 1);
  EXPECT_EQ(ids(together), ids(whole));
  for (size_t i = 0; i < std::min(together.size(), whole.size()); ++i) {
    EXPECT_EQ(together[i].data, whole[i].data) << together[i].id;
  }
  // Every event of the turn, each once, in order.
  for (size_t i = 0; i < whole.size(); ++i)
    EXPECT_EQ(whole[i].id, fmt::format("1-{}", i + 1));
  EXPECT_EQ(printed(whole), "1\n2\n3\n4\n5\n");

  // A finished turn resumes from any point too, and is kept across a restart.
  auto tail = api.stream("GET", fmt::format("/api/v1/conversations/{}/events", id), "",
                         [](const StreamEvent& event) { return event.type != "done"; },
                         {{"Last-Event-ID", whole[whole.size() - 3].id}});
  EXPECT_EQ(ids(tail.events),
            (std::vector<std::string>{whole[whole.size() - 2].id, whole.back().id}));
  EXPECT_EQ(server.stop(SIGTERM), 0);

  QuarryServer restarted({.scenario = "resume_live"});
  ASSERT_TRUE(restarted.started());
  ApiClient again(restarted.url());
  auto kept = replay(again, id, 1);
  EXPECT_EQ(ids(kept), ids(whole));
  EXPECT_EQ(restarted.stop(SIGTERM), 0);
}

TEST(Resume, AFollowerSeesEachTurnAsItComes) {
  QuarryServer server;
  ASSERT_TRUE(server.started());
  ApiClient api(server.url());
  const auto id = api.create_conversation();
  api.cell(id, "sql_query", "SELECT 1");  // an earlier turn, which a new follower does not get

  BackgroundStream follower(api, "GET", fmt::format("/api/v1/conversations/{}/events", id));
  // Give the follower time to connect; then two turns run from another client.
  ASSERT_FALSE(follower.wait_for_type("turn_started", std::chrono::seconds(1)));
  api.cell(id, "sql_query", "SELECT 2");
  api.cell(id, "sql_query", "SELECT 3");
  auto second_done = follower.wait_for(
      [](const StreamEvent& event) { return event.type == "done" && event.data["turn"] == 3; });
  ASSERT_TRUE(second_done);
  follower.drop();
  auto followed = follower.finish();
  ASSERT_FALSE(followed.events.empty());
  EXPECT_EQ(followed.events.front().id, "2-1");
  EXPECT_EQ(of_type(followed.events, "done").size(), 2u);
  EXPECT_EQ(server.stop(SIGTERM), 0);
}

TEST(Resume, AnEventIdThatIsNotOneIsRefused) {
  QuarryServer server;
  ASSERT_TRUE(server.started());
  ApiClient api(server.url());
  const auto id = api.create_conversation();
  for (std::string bad : {"banana", "1-", "-3", "1-2-3", "99999999999999999999-1"}) {
    SCOPED_TRACE(bad);
    auto refused =
        api.get(fmt::format("/api/v1/conversations/{}/events", id), {{"Last-Event-ID", bad}});
    EXPECT_EQ(refused.status, 400);
    EXPECT_EQ(refused.json["error"]["code"], "invalid_event_id");
  }
  EXPECT_EQ(server.stop(SIGTERM), 0);
}

}  // namespace
}  // namespace quarry::testing

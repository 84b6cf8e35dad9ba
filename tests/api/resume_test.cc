// Streams that drop: the turn goes on without its client, and the client picks up from the last
// event it saw, with nothing lost or repeated, while the turn runs or after it ended, and after
// the server restarted. A client following a conversation sees each turn as it comes.
#include <gtest/gtest.h>

#include "api_environment.h"

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
  QuarryServer server({.scenario = "resume"});
  ASSERT_TRUE(server.started());
  ApiClient api(server.url());
  const auto id = api.create_conversation();

  // The client goes away in the middle of the step's output.
  std::vector<StreamEvent> seen;
  api.stream("POST", fmt::format("/api/v1/conversations/{}/messages", id),
             R"({"content": "Count to five for me"})", [&](const StreamEvent& event) {
               seen.push_back(event);
               return event.type != "output";
             });
  ASSERT_FALSE(seen.empty());
  ASSERT_EQ(seen.back().type, "output");

  // It comes back with the last id it saw, while the turn still runs.
  auto resumed = api.stream("GET", fmt::format("/api/v1/conversations/{}/events", id), "",
                            [](const StreamEvent& event) { return event.type != "done"; },
                            {{"Last-Event-ID", seen.back().id}});
  ASSERT_EQ(resumed.status, 200);
  ASSERT_FALSE(resumed.events.empty());
  EXPECT_EQ(resumed.events.back().type, "done");
  EXPECT_EQ(resumed.events.back().data["status"], "completed");
  // The answer was still streaming when the client came back: the turn did not wait for it.
  EXPECT_FALSE(of_type(resumed.events, "text").empty());

  std::vector<StreamEvent> together = seen;
  together.insert(together.end(), resumed.events.begin(), resumed.events.end());
  auto whole = replay(api, id, 1);
  EXPECT_EQ(ids(together), ids(whole));
  for (size_t i = 0; i < std::min(together.size(), whole.size()); ++i) {
    EXPECT_EQ(together[i].data, whole[i].data) << together[i].id;
  }
  // Every event of the turn, each once, in order.
  for (size_t i = 0; i < whole.size(); ++i)
    EXPECT_EQ(whole[i].id, fmt::format("1-{}", i + 1));
  std::string counted;
  for (const auto& event : of_type(whole, "output"))
    counted += event.data["text"].get<std::string>();
  EXPECT_EQ(counted, "1\n2\n3\n4\n5\n");

  // A finished turn resumes from any point too, and is kept across a restart.
  auto tail = api.stream("GET", fmt::format("/api/v1/conversations/{}/events", id), "",
                         [](const StreamEvent& event) { return event.type != "done"; },
                         {{"Last-Event-ID", whole[whole.size() - 3].id}});
  EXPECT_EQ(ids(tail.events),
            (std::vector<std::string>{whole[whole.size() - 2].id, whole.back().id}));
  EXPECT_EQ(server.stop(SIGTERM), 0);

  QuarryServer restarted({.scenario = "resume"});
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

// A limited number of sandboxes shared through the real API, with real sandboxes: a turn that
// finds none free waits and is told its place, an idle sandbox is evicted for it (a busy one
// never), a wait past the queue timeout fails the turn saying the system is busy, a full queue
// answers 429 with Retry-After, and the warm pool hands out ready sandboxes but never a dead one.
#include <gtest/gtest.h>
#include <signal.h>

#include <set>

#include "api_environment.h"
#include "common/file_util.h"
#include "sandbox_environment.h"

namespace quarry::testing {
namespace {

std::string cells_path(const std::string& id) {
  return fmt::format("/api/v1/conversations/{}/cells", id);
}

std::string python_cell(const std::string& code) {
  return nlohmann::json({{"kind", "python"}, {"code", code}}).dump();
}

// The sandbox events of a stream of the given kind.
std::vector<nlohmann::json> sandbox_events(const ApiResponse& stream, std::string_view kind) {
  std::vector<nlohmann::json> found;
  for (const auto& event : of_type(stream.events, "sandbox")) {
    if (event.data["kind"] == kind) found.push_back(event.data);
  }
  return found;
}

// The conversation's recorded events of the given kind.
std::vector<nlohmann::json> history_events(ApiClient& api, const std::string& id,
                                           std::string_view kind) {
  std::vector<nlohmann::json> found;
  const auto document = api.get("/api/v1/conversations/" + id);
  for (const auto& event : document.json["events"]) {
    if (event["kind"] == kind) found.push_back(event);
  }
  return found;
}

nlohmann::json capacity(ApiClient& api) {
  return api.get("/api/v1/sandboxes").json["capacity"];
}

// The sandboxes of the API tests' servers that exist now.
std::vector<sandbox::SandboxInfo> live_sandboxes(const sandbox::Labels& labels = {}) {
  sandbox::Labels wanted = labels;
  wanted["quarry.instance"] = "api-test";
  auto found = SandboxEnvironment::get().provider().find(wanted);
  EXPECT_TRUE(found);
  return found ? *found : std::vector<sandbox::SandboxInfo>{};
}

TEST(Capacity, AnIdleSandboxIsEvictedForAWaitingTurnAndABusyOneNever) {
  QuarryServer server({.tokens = true, .capacity_config = "  max_sandboxes: 1\n"});
  ASSERT_TRUE(server.started());
  ApiClient alice(server.url()), bob(server.url());
  alice.use_token(server.token("alice"));
  bob.use_token(server.token("bob"));
  const auto first = alice.create_conversation("alice's");
  const auto second = bob.create_conversation("bob's");

  // Alice's conversation holds the one sandbox, idle after its cell.
  auto ran = alice.cell(first, "python", "print('alice was here')");
  ASSERT_EQ(ran.events.back().data["status"], "completed") << ran.body;
  const std::string alices =
      alice.get("/api/v1/conversations/" + first).json["sandbox"]["sandbox_id"];

  // Bob's turn finds none free: alice's idle one is deleted for it.
  BackgroundStream bobs(bob, "POST", cells_path(second),
                        python_cell("import time\nprint('bob busy', flush=True)\ntime.sleep(3)\n"));
  ASSERT_TRUE(bobs.wait_for([](const StreamEvent& event) { return event.type == "output"; }));
  auto evicted = history_events(alice, first, "sandbox_deleted");
  ASSERT_EQ(evicted.size(), 1u);
  EXPECT_EQ(evicted[0]["reason"], "evicted");
  EXPECT_EQ(evicted[0]["sandbox_id"], alices);
  EXPECT_EQ(capacity(bob)["evictions"], 1);

  // Alice's next turn waits while bob's sandbox is busy, and is told its place.
  BackgroundStream alices_turn(alice, "POST", cells_path(first), python_cell("print('again')"));
  auto queued = alices_turn.wait_for([](const StreamEvent& event) {
    return event.type == "sandbox" && event.data["kind"] == "queued";
  });
  ASSERT_TRUE(queued);
  EXPECT_EQ(queued->data["details"]["position"], 1);
  auto during = capacity(alice);
  EXPECT_EQ(during["queue"]["waiting"], 1);
  EXPECT_EQ(during["sandboxes"]["busy"], 1);
  EXPECT_EQ(during["limits"]["max_sandboxes"], 1);

  // Bob's turn is never disturbed; once it ends its sandbox is idle, and evicted for alice.
  auto bob_done = bobs.finish();
  EXPECT_EQ(bob_done.events.back().data["status"], "completed") << bob_done.body;
  EXPECT_TRUE(sandbox_events(bob_done, "sandbox_deleted").empty());
  auto alice_done = alices_turn.finish();
  ASSERT_EQ(alice_done.events.back().data["status"], "completed") << alice_done.body;
  auto ready = sandbox_events(alice_done, "sandbox_ready");
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_GT(ready[0]["details"]["waited_ms"].get<double>(), 0);
  auto bobs_deleted = history_events(bob, second, "sandbox_deleted");
  ASSERT_EQ(bobs_deleted.size(), 1u);
  EXPECT_EQ(bobs_deleted[0]["reason"], "evicted");
  // The evicted turn's history says it: its stream showed nothing of bob's.
  EXPECT_EQ(history_events(alice, first, "queued").size(), 1u);
  EXPECT_EQ(capacity(alice)["evictions"], 2);
  EXPECT_EQ(server.stop(SIGTERM), 0);
  EXPECT_TRUE(live_sandboxes().empty());
}

TEST(Capacity, AWaitPastTheQueueTimeoutFailsTheTurnSayingTheSystemIsBusy) {
  QuarryServer server({.capacity_config = "  max_sandboxes: 1\n  queue_timeout: 1s\n"});
  ASSERT_TRUE(server.started());
  ApiClient api(server.url());
  const auto busy = api.create_conversation("busy");
  const auto waiting = api.create_conversation("waiting");
  BackgroundStream running(api, "POST", cells_path(busy),
                           python_cell("import time\nprint('busy', flush=True)\ntime.sleep(4)\n"));
  ASSERT_TRUE(running.wait_for_type("output"));

  auto refused = api.cell(waiting, "python", "print('never')");
  ASSERT_FALSE(refused.events.empty()) << refused.body;
  EXPECT_FALSE(sandbox_events(refused, "queued").empty());
  const auto& done = refused.events.back();
  EXPECT_EQ(done.data["status"], "failed");
  const std::string error = done.data["error"];
  EXPECT_NE(error.find("the system is busy"), std::string::npos) << error;
  EXPECT_NE(error.find("try again in about"), std::string::npos) << error;
  EXPECT_TRUE(of_type(refused.events, "output").empty());
  EXPECT_EQ(capacity(api)["timeouts"], 1);

  // Nothing was lost: the waiting conversation runs once the other's turn is over.
  EXPECT_EQ(running.finish().events.back().data["status"], "completed");
  auto again = api.cell(waiting, "python", "print('now')");
  EXPECT_EQ(again.events.back().data["status"], "completed") << again.body;
  auto document = api.get("/api/v1/conversations/" + waiting);
  ASSERT_EQ(document.json["turns"].size(), 2u);
  EXPECT_EQ(document.json["turns"][0]["status"], "failed");
  EXPECT_EQ(document.json["turns"][1]["status"], "completed");
  EXPECT_EQ(server.stop(SIGTERM), 0);
}

TEST(Capacity, TurnsBeyondAFullQueueAreRefusedWith429AndRetryAfter) {
  QuarryServer server({.capacity_config = "  max_sandboxes: 1\n  max_queue: 1\n"});
  ASSERT_TRUE(server.started());
  ApiClient api(server.url());
  const auto busy = api.create_conversation();
  const auto waiting = api.create_conversation();
  const auto third = api.create_conversation();
  BackgroundStream running(api, "POST", cells_path(busy),
                           python_cell("import time\nprint('busy', flush=True)\ntime.sleep(3)\n"));
  ASSERT_TRUE(running.wait_for_type("output"));
  BackgroundStream queued(api, "POST", cells_path(waiting), python_cell("print('queued')"));
  ASSERT_TRUE(queued.wait_for([](const StreamEvent& event) {
    return event.type == "sandbox" && event.data["kind"] == "queued";
  }));

  auto refused = api.post(cells_path(third), {{"kind", "python"}, {"code", "print(1)"}});
  EXPECT_EQ(refused.status, 429) << refused.body;
  EXPECT_EQ(refused.json["error"]["code"], "busy");
  EXPECT_NE(refused.json["error"]["message"].get<std::string>().find("capacity.max_queue"),
            std::string::npos);
  const std::string retry = refused.header("Retry-After");
  ASSERT_FALSE(retry.empty());
  EXPECT_GE(std::stoi(retry), 1);
  // Refused before it began: the conversation has no turn.
  EXPECT_TRUE(api.get("/api/v1/conversations/" + third).json["turns"].empty());
  EXPECT_EQ(capacity(api)["refused"], 1);

  EXPECT_EQ(running.finish().events.back().data["status"], "completed");
  EXPECT_EQ(queued.finish().events.back().data["status"], "completed");
  EXPECT_EQ(server.stop(SIGTERM), 0);
}

TEST(Capacity, TheWarmPoolHandsOutReadySandboxesAndNeverADeadOne) {
  QuarryServer server({.capacity_config = "  max_sandboxes: 3\n  warm_pool: {min_idle: 1}\n"});
  ASSERT_TRUE(server.started());
  ApiClient api(server.url());
  // The one sandbox in the pool: started by it and no conversation's yet.
  auto pooled = [&] {
    for (int i = 0; i < 100; ++i) {
      const auto sandboxes = api.get("/api/v1/sandboxes");
      std::set<std::string> held;
      for (const auto& item : sandboxes.json["sandboxes"])
        held.insert(item["sandbox_id"]);
      std::vector<std::string> ready;
      for (const auto& info : live_sandboxes({{"quarry.origin", "pool"}})) {
        if (!held.contains(info.id)) ready.push_back(info.id);
      }
      if (sandboxes.json["capacity"]["sandboxes"]["warm"] == 1 && ready.size() == 1) {
        return ready[0];
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    ADD_FAILURE() << "the pool never had a warm sandbox";
    return std::string();
  };

  // The pooled sandbox dies: the first turn gets a new one, not it.
  const std::string dead = pooled();
  ASSERT_FALSE(dead.empty());
  ASSERT_NO_FATAL_FAILURE(kill_init_of(dead));
  const auto first = api.create_conversation();
  auto ran = api.cell(first, "python", "print('in a live sandbox')");
  ASSERT_EQ(ran.events.back().data["status"], "completed") << ran.body;
  auto ready = sandbox_events(ran, "sandbox_ready");
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_NE(ready[0]["sandbox_id"], dead);
  EXPECT_EQ(ready[0]["details"]["start"], "cold");
  EXPECT_EQ(capacity(api)["dead_warm"], 1);

  // The pool refills; the next conversation's first step takes the warm sandbox.
  const std::string warm = pooled();
  const auto second = api.create_conversation();
  auto quick = api.cell(second, "python", "print('warm')");
  ASSERT_EQ(quick.events.back().data["status"], "completed") << quick.body;
  ready = sandbox_events(quick, "sandbox_ready");
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_EQ(ready[0]["sandbox_id"], warm);
  EXPECT_EQ(ready[0]["details"]["start"], "warm");
  EXPECT_FALSE(pooled().empty()) << "drained, the pool fills again";
  EXPECT_EQ(capacity(api)["starts"]["warm"], 1);

  // A normal stop leaves nothing: not the conversations' sandboxes, not the pool's.
  EXPECT_EQ(server.stop(SIGTERM), 0);
  EXPECT_TRUE(live_sandboxes().empty());
}

}  // namespace
}  // namespace quarry::testing

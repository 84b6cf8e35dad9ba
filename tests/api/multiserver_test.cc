// Several `quarry serve` on one PostgreSQL history, as behind a load balancer: a turn started
// through one server streams through another while it runs, and when a server is killed in the
// middle of a turn a live one takes over what it left (its sandbox destroyed, its turn recorded
// interrupted) and the conversation goes on through the others; an artifact one server
// collected is served by another that has a state directory of its own; the capacity limits
// hold across the servers (a turn waiting for room costs one idle sandbox elsewhere, however many
// servers there are) and a cancel works through any of them. No sandbox is left behind.
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <thread>

#include "api_environment.h"
#include "conversation/postgres_history_store.h"
#include "postgres_environment.h"
#include "sandbox_environment.h"

namespace quarry::testing {
namespace {

// A history database of its own for one test's servers, dropped at its end.
class SharedHistory {
 public:
  SharedHistory() {
    static std::atomic<int> counter = 0;
    name_ = fmt::format("multiserver_{}_{}", ::getpid(), counter++);
    admin_sql(fmt::format("DROP DATABASE IF EXISTS {}", name_));
    admin_sql(fmt::format("CREATE DATABASE {}", name_));
  }
  ~SharedHistory() { admin_sql(fmt::format("DROP DATABASE {} WITH (FORCE)", name_)); }

  // A server on it; its instance id labels its sandboxes.
  ServerOptions server(const std::string& instance) const {
    ServerOptions options;
    options.instance_id = instance;
    // In a key=value string the last dbname wins. A short timeout: a killed server is taken
    // over within seconds.
    options.conversations_config =
        fmt::format("  store: postgres\n  url: \"{} dbname={}\"\n  server_timeout: 2s\n",
                    PostgresEnvironment::get().server().admin_conninfo, name_);
    return options;
  }
  // A server on it whose capacity.max_sandboxes is `max_sandboxes` (with no warm pool, the
  // default, so turns take them first).
  ServerOptions limited(const std::string& instance, int max_sandboxes) const {
    ServerOptions options = server(instance);
    options.capacity_config = fmt::format("  max_sandboxes: {}\n", max_sandboxes);
    return options;
  }

 private:
  std::string name_;
};

// Ends the PostgreSQL session that holds conversation `id`'s turn lock, as a restart of the
// database or an operator would; fails the test if no session holds it.
void terminate_turn_lock(const std::string& id) {
  const auto key = static_cast<uint64_t>(conversation::PostgresHistoryStore::turn_lock_key(id));
  admin_sql(fmt::format(
      "DO $$ BEGIN IF (SELECT count(pg_terminate_backend(pid)) FROM pg_locks WHERE locktype = "
      "'advisory' AND granted AND classid = {} AND objid = {} AND objsubid = 1) <> 1 THEN RAISE "
      "EXCEPTION 'no session holds the turn lock'; END IF; END $$",
      key >> 32, key & 0xffffffffu));
}

std::string cells_path(const std::string& id) {
  return fmt::format("/api/v1/conversations/{}/cells", id);
}

std::string python_cell(const std::string& code) {
  return nlohmann::json({{"kind", "python"}, {"code", code}}).dump();
}

std::vector<std::string> ids(const std::vector<StreamEvent>& events) {
  std::vector<std::string> list;
  for (const auto& event : events)
    list.push_back(event.id);
  return list;
}

std::vector<sandbox::SandboxInfo> sandboxes(const sandbox::Labels& labels) {
  auto found = SandboxEnvironment::get().provider().find(labels);
  EXPECT_TRUE(found) << found.error().message;
  return found ? *found : std::vector<sandbox::SandboxInfo>{};
}

// How many of a conversation's sandboxes were evicted, by its events.
int evictions(ApiClient& server, const std::string& conversation_id) {
  const auto conversation = server.get("/api/v1/conversations/" + conversation_id);
  int evicted = 0;
  for (const auto& event : conversation.json["events"]) {
    evicted += event["kind"] == "sandbox_deleted" && event["reason"] == "evicted";
  }
  return evicted;
}

// Waits up to 5 s for `condition`, which another process makes true; whether it came.
template <typename Condition>
bool eventually(Condition condition) {
  for (int wait = 0; wait < 100 && !condition(); ++wait)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  return condition();
}

// Stops the servers as an operator would (SIGTERM): each destroys the sandboxes it made.
void stop_all(std::initializer_list<QuarryServer*> servers) {
  for (auto* server : servers)
    server->signal(SIGTERM);
  for (auto* server : servers)
    EXPECT_EQ(server->wait(), 0) << server->log();
}

TEST(Multiserver, ATurnStartedThroughOneServerStreamsThroughAnother) {
  SharedHistory history;
  QuarryServer a(history.server("multi-a")), b(history.server("multi-b")),
      c(history.server("multi-c"));
  ASSERT_TRUE(a.started() && b.started() && c.started());
  ApiClient through_a(a.url()), through_b(b.url()), through_c(c.url());
  const auto id = through_a.create_conversation("shared");
  EXPECT_EQ(through_b.get("/api/v1/conversations/" + id).status, 200);

  // The cell runs on a and waits for a gate, so what b streams is made while it watches.
  BackgroundStream started(
      through_a, "POST", cells_path(id),
      python_cell("import os, time\nprint('waiting', flush=True)\n"
                  "while not os.path.exists('/home/sandbox/gate'):\n    time.sleep(0.05)\n"
                  "print('through', flush=True)\n"));
  ASSERT_TRUE(started.wait_for_type("output"));
  // b picks the turn up from its start; c follows the conversation without saying where from,
  // and is given the running turn (which b's and c's own hubs know nothing of).
  BackgroundStream on_b(through_b, "GET", fmt::format("/api/v1/conversations/{}/events", id), "",
                        {{"Last-Event-ID", "1-0"}});
  BackgroundStream on_c(through_c, "GET", fmt::format("/api/v1/conversations/{}/events", id));
  for (auto* stream : {&on_b, &on_c})
    ASSERT_TRUE(stream->wait_for_type("output"));
  EXPECT_EQ(through_c.get("/api/v1/conversations/" + id).json["turns"][0]["status"], "running");
  const std::string sandbox_id =
      through_b.get("/api/v1/conversations/" + id).json["sandbox"]["sandbox_id"];
  std::istringstream gate("open");
  ASSERT_TRUE(
      SandboxEnvironment::get().provider().write_file(sandbox_id, "/home/sandbox/gate", gate, -1));

  auto from_a = started.finish();
  ASSERT_EQ(from_a.events.back().type, "done");
  EXPECT_EQ(from_a.events.back().data["status"], "completed") << from_a.body;
  for (auto* stream : {&on_b, &on_c}) {
    auto done = stream->wait_for_type("done");
    ASSERT_TRUE(done);
    EXPECT_EQ(done->data["status"], "completed");
    stream->drop();  // a follower goes on with the next turns
    auto seen = stream->finish();
    // Everything a's client saw, in the same order with the same ids, and nothing else.
    EXPECT_EQ(ids(seen.events), ids(from_a.events));
    EXPECT_EQ(printed(seen.events), "waiting\nthrough\n");
  }

  stop_all({&a, &b, &c});
  for (const char* instance : {"multi-a", "multi-b", "multi-c"}) {
    EXPECT_TRUE(sandboxes({{"quarry.instance", instance}}).empty()) << instance;
  }
}

TEST(Multiserver, AServerKilledMidTurnIsTakenOverAndTheConversationGoesOn) {
  SharedHistory history;
  QuarryServer a(history.server("multi-a")), b(history.server("multi-b")),
      c(history.server("multi-c"));
  ASSERT_TRUE(a.started() && b.started() && c.started());
  ApiClient through_a(a.url()), through_b(b.url()), through_c(c.url());
  through_a.expect_breaks();
  const auto id = through_a.create_conversation("survives a server");
  auto first = through_a.cell(id, "python", "print('first', flush=True)");
  ASSERT_EQ(first.events.back().data["status"], "completed") << first.body;

  BackgroundStream sleeping(through_a, "POST", cells_path(id),
                            python_cell("import time\nprint('sleeping', flush=True)\n"
                                        "time.sleep(600)\n"));
  ASSERT_TRUE(sleeping.wait_for_type("output"));
  BackgroundStream watching(through_b, "GET", fmt::format("/api/v1/conversations/{}/events", id),
                            "", {{"Last-Event-ID", "2-0"}});
  ASSERT_TRUE(watching.wait_for_type("output"));
  const std::string sandbox_id =
      through_b.get("/api/v1/conversations/" + id).json["sandbox"]["sandbox_id"];
  auto made_by_a = sandboxes({{"quarry.instance", "multi-a"}});
  ASSERT_EQ(made_by_a.size(), 1u);
  EXPECT_EQ(made_by_a[0].id, sandbox_id);
  const std::string a_boot = made_by_a[0].labels.at("quarry.boot");

  a.stop(SIGKILL);
  // The stream through b ends as the turn does: interrupted, once a live server took a over.
  auto done = watching.wait_for_type("done", std::chrono::seconds(60));
  ASSERT_TRUE(done) << b.log() << c.log();
  EXPECT_EQ(done->data["status"], "interrupted");
  watching.drop();
  EXPECT_TRUE(sandboxes({{"quarry.boot", a_boot}}).empty());
  // The taker logs it as it ends the turns it found: a moment after, at most.
  auto took_over = [&](QuarryServer& server) {
    return server.log().find("took over server " + a_boot) != std::string::npos;
  };
  EXPECT_TRUE(eventually([&] { return took_over(b) || took_over(c); }))
      << "neither b nor c says it took over a";
  EXPECT_FALSE(took_over(b) && took_over(c)) << "both b and c took over a";

  // The conversation goes on through c, in a new sandbox, told why.
  auto next = through_c.cell(id, "python", "print('after', 2 + 2)");
  ASSERT_EQ(next.events.back().data["status"], "completed") << next.body;
  EXPECT_EQ(printed(next.events), "after 4\n");

  const auto document = through_b.get("/api/v1/conversations/" + id).json;
  ASSERT_EQ(document["turns"].size(), 3u);
  EXPECT_EQ(document["turns"][0]["status"], "completed");
  EXPECT_EQ(document["turns"][1]["status"], "interrupted");
  EXPECT_EQ(document["turns"][2]["status"], "completed");
  bool orphan_recorded = false;
  for (const auto& event : document["events"]) {
    orphan_recorded =
        orphan_recorded || (event["kind"] == "sandbox_deleted" && event["reason"] == "orphan" &&
                            event["sandbox_id"] == sandbox_id);
  }
  EXPECT_TRUE(orphan_recorded) << document["events"].dump(2);
  EXPECT_NE(document["sandbox"]["sandbox_id"], sandbox_id);

  stop_all({&b, &c});
  for (const char* instance : {"multi-a", "multi-b", "multi-c"}) {
    EXPECT_TRUE(sandboxes({{"quarry.instance", instance}}).empty()) << instance;
  }
}

TEST(Multiserver, CapacityLimitsHoldAcrossTheServers) {
  SharedHistory history;
  // One sandbox in all, whichever server makes it.
  QuarryServer a(history.limited("multi-a", 1)), b(history.limited("multi-b", 1));
  ASSERT_TRUE(a.started() && b.started());
  ApiClient through_a(a.url()), through_b(b.url());

  auto held = through_a.post("/daytona/api/sandbox", nlohmann::json::object());
  ASSERT_EQ(held.status, 200) << held.body;
  // b has room of its own, but not across the servers.
  auto refused = through_b.post("/daytona/api/sandbox", nlohmann::json::object());
  EXPECT_EQ(refused.status, 429) << refused.body;
  EXPECT_NE(refused.json["message"].get<std::string>().find("capacity.max_sandboxes"),
            std::string::npos)
      << refused.body;
  const auto seen_by_b = through_b.get("/api/v1/sandboxes").json["capacity"];
  EXPECT_EQ(seen_by_b["sandboxes"]["elsewhere"], 1) << seen_by_b.dump();
  EXPECT_EQ(seen_by_b["sandboxes"]["busy"], 0);

  // A turn on b waits for the one sandbox a holds (a Daytona API sandbox: never evicted), and
  // runs once a lets it go.
  const auto id = through_b.create_conversation("waits for a");
  BackgroundStream waiting(through_b, "POST", cells_path(id), python_cell("print('ran on b')"));
  auto queued = waiting.wait_for([](const StreamEvent& event) {
    return event.type == "sandbox" && event.data["kind"] == "queued";
  });
  ASSERT_TRUE(queued) << b.log();
  std::this_thread::sleep_for(std::chrono::seconds(1));
  EXPECT_EQ(through_b.get("/api/v1/conversations/" + id).json["turns"][0]["status"], "running");
  EXPECT_TRUE(sandboxes({{"quarry.instance", "multi-b"}}).empty()) << "b went over the limit";
  EXPECT_EQ(through_a.del("/daytona/api/sandbox/" + held.json["id"].get<std::string>()).status,
            200);
  auto done = waiting.finish();
  ASSERT_EQ(done.events.back().type, "done") << done.body;
  EXPECT_EQ(done.events.back().data["status"], "completed") << done.body;
  // Now b holds the one (idle in its conversation): a is refused in turn.
  auto refused_on_a = through_a.post("/daytona/api/sandbox", nlohmann::json::object());
  EXPECT_EQ(refused_on_a.status, 429) << refused_on_a.body;
  // A turn on a waits for it, asks the other servers for room, and b evicts its idle sandbox:
  // the turn runs without anyone deleting anything by hand.
  const auto on_a = through_a.create_conversation("needs b's room");
  auto ran = through_a.cell(on_a, "python", "print('ran on a')");
  ASSERT_EQ(ran.events.back().data["status"], "completed") << ran.body << b.log();
  EXPECT_FALSE(of_type(ran.events, "sandbox").empty()) << ran.body;
  EXPECT_EQ(evictions(through_b, id), 1) << "b's idle sandbox was not evicted for a's turn";

  stop_all({&a, &b});
  for (const char* instance : {"multi-a", "multi-b"}) {
    EXPECT_TRUE(sandboxes({{"quarry.instance", instance}}).empty()) << instance;
  }
}

// Three servers, room for two sandboxes, each held idle by a conversation on b and on c: a turn
// on a asks both for room, and only one of them evicts; the other conversation keeps its
// sandbox.
TEST(Multiserver, ATurnWaitingForRoomCostsOneIdleSandboxHoweverManyServersHearIt) {
  SharedHistory history;
  QuarryServer a(history.limited("multi-a", 2)), b(history.limited("multi-b", 2)),
      c(history.limited("multi-c", 2));
  ASSERT_TRUE(a.started() && b.started() && c.started());
  ApiClient through_a(a.url()), through_b(b.url()), through_c(c.url());
  const auto on_b = through_b.create_conversation("idle on b");
  const auto on_c = through_c.create_conversation("idle on c");
  for (auto [client, id] : {std::pair{&through_b, on_b}, std::pair{&through_c, on_c}}) {
    auto ran = client->cell(id, "python", "x = 1");
    ASSERT_EQ(ran.events.back().data["status"], "completed") << ran.body;
  }

  const auto on_a = through_a.create_conversation("needs room");
  auto ran = through_a.cell(on_a, "python", "print('ran on a')");
  ASSERT_EQ(ran.events.back().data["status"], "completed") << ran.body << b.log() << c.log();
  EXPECT_EQ(evictions(through_b, on_b) + evictions(through_c, on_c), 1)
      << "b: " << evictions(through_b, on_b) << ", c: " << evictions(through_c, on_c);
  const auto kept = sandboxes({{"quarry.instance", "multi-b"}}).size() +
                    sandboxes({{"quarry.instance", "multi-c"}}).size();
  EXPECT_EQ(kept, 1u) << "one of b's and c's idle sandboxes should be left";

  stop_all({&a, &b, &c});
  for (const char* instance : {"multi-a", "multi-b", "multi-c"}) {
    EXPECT_TRUE(sandboxes({{"quarry.instance", instance}}).empty()) << instance;
  }
}

// The sandboxes each server counts as its own, and those it counts on the other servers, as
// their Load pages show them: "a: 1 own, 0 elsewhere; b: ...".
std::string counted(ApiClient& a, ApiClient& b) {
  std::string text;
  for (auto [name, server] : {std::pair{"a", &a}, std::pair{"b", &b}}) {
    const auto sandboxes = server->get("/api/v1/sandboxes").json["capacity"]["sandboxes"];
    int own = 0;
    for (const char* use : {"warm", "starting", "busy", "idle", "deleting"})
      own += sandboxes[use].get<int>();
    text += fmt::format("{}{}: {} own, {} elsewhere", text.empty() ? "" : "; ", name, own,
                        sandboxes["elsewhere"].get<int>());
  }
  return text;
}

// Behind a load balancer a conversation's turns go to any server: its sandbox, made by a and
// used next through b, is one sandbox to the limits, held by the server that used it last
// (not by both, which would leave room for one sandbox fewer until a stopped); deleted by a
// server that no longer holds it, it holds no place anywhere.
TEST(Multiserver, ASandboxAConversationTakesToAnotherServerIsCountedOnce) {
  SharedHistory history;
  QuarryServer a(history.limited("multi-a", 2)), b(history.limited("multi-b", 2));
  ASSERT_TRUE(a.started() && b.started());
  ApiClient through_a(a.url()), through_b(b.url());
  const auto id = through_a.create_conversation("moves between servers");
  auto first = through_a.cell(id, "python", "x = 41");
  ASSERT_EQ(first.events.back().data["status"], "completed") << first.body;
  auto second = through_b.cell(id, "python", "print(x + 1)");
  ASSERT_EQ(second.events.back().data["status"], "completed") << second.body;
  EXPECT_TRUE(of_type(second.events, "sandbox").empty()) << "b did not go on in a's sandbox";

  const std::string held_by_b = "a: 0 own, 1 elsewhere; b: 1 own, 0 elsewhere";
  (void)eventually([&] { return counted(through_a, through_b) == held_by_b; });
  EXPECT_EQ(counted(through_a, through_b), held_by_b);
  // With room for two, one conversation more starts at once on either server.
  const auto other = through_a.create_conversation("the second place");
  auto ran = through_a.cell(other, "python", "print('room')");
  ASSERT_EQ(ran.events.back().data["status"], "completed") << ran.body;
  for (const auto& event : of_type(ran.events, "sandbox"))
    EXPECT_NE(event.data["kind"], "queued") << ran.body;

  // Deleted through a, which does not hold it: no server counts it any more.
  EXPECT_EQ(through_a.del("/api/v1/conversations/" + id).status, 204);
  const std::string only_the_other = "a: 1 own, 0 elsewhere; b: 0 own, 1 elsewhere";
  (void)eventually([&] { return counted(through_a, through_b) == only_the_other; });
  EXPECT_EQ(counted(through_a, through_b), only_the_other);

  stop_all({&a, &b});
  for (const char* instance : {"multi-a", "multi-b"}) {
    EXPECT_TRUE(sandboxes({{"quarry.instance", instance}}).empty()) << instance;
  }
}

// b has a state directory of its own, as a server on another machine would: it never had a's
// files, so what it serves comes from the bytes the shared history keeps.
TEST(Multiserver, AnArtifactCollectedThroughOneServerIsServedByAnother) {
  SharedHistory history;
  QuarryServer a(history.server("multi-a"));
  auto on_its_own = history.server("multi-b");
  on_its_own.own_state_dir = true;
  QuarryServer b(on_its_own);
  ASSERT_TRUE(a.started() && b.started());
  ASSERT_NE(a.state_dir(), b.state_dir());
  ApiClient through_a(a.url()), through_b(b.url());
  const auto id = through_a.create_conversation("artifacts");
  auto cell = through_a.cell(id, "python",
                             "open('/home/sandbox/outputs/sales.csv', 'w')"
                             ".write('region,amount\\nnorth,3\\nsouth,1\\neast,2\\n')\n"
                             "open('/home/sandbox/outputs/bytes.png', 'wb')"
                             ".write(bytes(range(256)) * 300)\n");
  ASSERT_EQ(cell.events.back().data["status"], "completed") << cell.body;
  ASSERT_EQ(of_type(cell.events, "artifact").size(), 2u) << cell.body;

  auto listed = through_b.get(fmt::format("/api/v1/conversations/{}/artifacts", id));
  ASSERT_EQ(listed.status, 200) << listed.body;
  std::map<std::string, std::string> url;
  for (const auto& artifact : listed.json["artifacts"])
    url[artifact["name"]] = artifact["url"];
  ASSERT_EQ(url.size(), 2u) << listed.body;
  ASSERT_TRUE(url.contains("bytes.png") && url.contains("sales.csv")) << listed.body;

  std::string every_byte;  // NULs and bytes that are not UTF-8 among them
  for (int copy = 0; copy < 300; ++copy) {
    for (int value = 0; value < 256; ++value)
      every_byte.push_back(static_cast<char>(value));
  }
  auto png = through_b.get(url["bytes.png"]);
  ASSERT_EQ(png.status, 200) << png.body;
  EXPECT_EQ(png.header("Content-Type"), "image/png");
  EXPECT_EQ(png.body.size(), every_byte.size());
  EXPECT_TRUE(png.body == every_byte) << "b served other bytes than the analysis wrote";
  auto csv = through_b.get(url["sales.csv"] + "?download=1");
  ASSERT_EQ(csv.status, 200) << csv.body;
  EXPECT_EQ(csv.body, "region,amount\nnorth,3\nsouth,1\neast,2\n");
  auto table = through_b.get(url["sales.csv"] + "/table?sort=amount&order=desc");
  ASSERT_EQ(table.status, 200) << table.body;
  EXPECT_EQ(table.json["total_rows"], 3);
  EXPECT_EQ(table.json["columns"][1]["name"], "amount");
  ASSERT_EQ(table.json["rows"].size(), 3u) << table.body;
  EXPECT_EQ(table.json["rows"][0], nlohmann::json::parse(R"(["north", 3])"));
  EXPECT_EQ(table.json["rows"][2], nlohmann::json::parse(R"(["south", 1])"));
  // Kept by b in the layout every server uses, under its own state directory.
  EXPECT_TRUE(std::filesystem::is_directory(b.state_dir() / "artifacts" / id));

  // Once the conversation is deleted (through a), no server serves its artifacts, and b's
  // copies go too (b hears of the delete).
  EXPECT_EQ(through_a.del("/api/v1/conversations/" + id).status, 204);
  EXPECT_EQ(through_b.get(url["bytes.png"]).status, 404);
  EXPECT_EQ(through_a.get(url["bytes.png"]).status, 404);
  const auto copies = b.state_dir() / "artifacts" / id;
  EXPECT_TRUE(eventually([&] { return !std::filesystem::exists(copies); }))
      << "b kept its copies of a deleted conversation's";

  stop_all({&a, &b});
  for (const char* instance : {"multi-a", "multi-b"}) {
    EXPECT_TRUE(sandboxes({{"quarry.instance", instance}}).empty()) << instance;
  }
}

// A server that is down when a conversation is deleted does not hear it: when it starts again,
// its copies of that conversation's artifacts go, and what it keeps of conversations still
// alive, or unknown to this history (another history's, before a switch), stays.
TEST(Multiserver, AServerDownWhenAConversationIsDeletedDropsItsCopiesWhenItStartsAgain) {
  SharedHistory history;
  QuarryServer a(history.server("multi-a"));
  auto options_b = history.server("multi-b");
  options_b.own_state_dir = true;
  auto b = std::make_unique<QuarryServer>(options_b);
  ASSERT_TRUE(a.started() && b->started());
  ApiClient through_a(a.url()), through_b(b->url());
  const auto deleted = through_a.create_conversation("deleted while b is down");
  auto cell = through_a.cell(
      deleted, "python", "open('/home/sandbox/outputs/notes.csv', 'w').write('a,b\\n1,2\\n')\n");
  ASSERT_EQ(cell.events.back().data["status"], "completed") << cell.body;
  auto listed = through_b.get(fmt::format("/api/v1/conversations/{}/artifacts", deleted));
  ASSERT_EQ(listed.status, 200) << listed.body;
  ASSERT_EQ(listed.json["artifacts"].size(), 1u) << listed.body;
  ASSERT_EQ(through_b.get(listed.json["artifacts"][0]["url"]).status, 200);
  const auto state = b->state_dir();
  const auto copies = state / "artifacts" / deleted;
  ASSERT_TRUE(std::filesystem::is_directory(copies)) << "b kept no copy of what it served";
  const auto alive = through_a.create_conversation("alive");
  const auto unknown = std::string("c-of-another-history");
  for (const auto& id : {alive, unknown}) {
    std::filesystem::create_directories(state / "artifacts" / id / "1" / "call");
    std::ofstream(state / "artifacts" / id / "1" / "call" / "kept.txt") << "kept";
  }

  ASSERT_EQ(b->stop(SIGTERM), 0) << b->log();
  EXPECT_EQ(through_a.del("/api/v1/conversations/" + deleted).status, 204);
  EXPECT_TRUE(std::filesystem::exists(copies)) << "nobody was to remove b's copies";

  options_b.state_dir = state;
  b = std::make_unique<QuarryServer>(options_b);
  ASSERT_TRUE(b->started());
  EXPECT_FALSE(std::filesystem::exists(copies))
      << "b kept its copies of a conversation deleted while it was down";
  for (const auto& id : {alive, unknown}) {
    EXPECT_TRUE(std::filesystem::exists(state / "artifacts" / id / "1" / "call" / "kept.txt"))
        << id;
  }
  EXPECT_NE(b->log().find("removed the artifacts of 1 conversation(s) deleted while this server "
                          "was down"),
            std::string::npos)
      << b->log();

  stop_all({&a, b.get()});
  for (const char* instance : {"multi-a", "multi-b"}) {
    EXPECT_TRUE(sandboxes({{"quarry.instance", instance}}).empty()) << instance;
  }
}

TEST(Multiserver, ATurnIsCancelledThroughAnyServer) {
  SharedHistory history;
  QuarryServer a(history.server("multi-a")), b(history.server("multi-b"));
  ASSERT_TRUE(a.started() && b.started());
  ApiClient through_a(a.url()), through_b(b.url());
  const auto id = through_a.create_conversation("cancelled elsewhere");
  BackgroundStream sleeping(through_a, "POST", cells_path(id),
                            python_cell("import time\nprint('sleeping', flush=True)\n"
                                        "time.sleep(600)\n"));
  ASSERT_TRUE(sleeping.wait_for_type("output"));

  // The turn runs on a; the user, sent to b by the load balancer, cancels it there.
  auto cancelled = through_b.post(fmt::format("/api/v1/conversations/{}/cancel", id), nullptr);
  EXPECT_EQ(cancelled.status, 202) << cancelled.body;
  EXPECT_EQ(cancelled.json["turn"], 1);
  EXPECT_EQ(cancelled.json["status"], "cancelling");
  auto done = sleeping.finish();
  ASSERT_EQ(done.events.back().type, "done") << done.body;
  EXPECT_EQ(done.events.back().data["status"], "cancelled") << done.body;
  const auto turn = through_b.get("/api/v1/conversations/" + id).json["turns"][0];
  EXPECT_EQ(turn["status"], "cancelled");
  EXPECT_EQ(turn["error"], "cancelled by the user");
  // Nothing runs any more, through either server.
  for (auto* client : {&through_a, &through_b}) {
    auto again = client->post(fmt::format("/api/v1/conversations/{}/cancel", id), nullptr);
    EXPECT_EQ(again.status, 409) << again.body;
  }
  stop_all({&a, &b});
}

// PostgreSQL ending the session that holds a turn's lock (restarted, the backend terminated, its
// network dead) frees the conversation for a turn through any server, which would take the
// running one for the remains of a dead process. The turn that lost its lock stops at once, says
// why, and the conversation goes on.
TEST(Multiserver, ATurnThatLostItsLockStopsAndTheConversationGoesOn) {
  SharedHistory history;
  QuarryServer a(history.server("multi-a")), b(history.server("multi-b"));
  ASSERT_TRUE(a.started() && b.started());
  ApiClient through_a(a.url()), through_b(b.url());
  const auto id = through_a.create_conversation("lock lost");
  BackgroundStream sleeping(through_a, "POST", cells_path(id),
                            python_cell("import time\nprint('sleeping', flush=True)\n"
                                        "time.sleep(600)\n"));
  ASSERT_TRUE(sleeping.wait_for_type("output"));

  terminate_turn_lock(id);
  auto done = sleeping.wait_for_type("done");
  ASSERT_TRUE(done) << "the turn went on without its lock";
  EXPECT_EQ(done->data["status"], "cancelled");
  const std::string error = done->data["error"];
  EXPECT_NE(error.find("lost its session with the history database"), std::string::npos) << error;
  EXPECT_NE(error.find("send the message again"), std::string::npos) << error;

  auto again = through_b.cell(id, "python", "print(6 * 7)");
  ASSERT_FALSE(again.events.empty());
  EXPECT_EQ(again.events.back().data["status"], "completed");
  EXPECT_EQ(printed(again.events), "42\n");
  const auto turns = through_b.get("/api/v1/conversations/" + id).json["turns"];
  ASSERT_EQ(turns.size(), 2u) << turns.dump();
  EXPECT_EQ(turns[0]["status"], "cancelled");
  EXPECT_EQ(turns[0]["error"], error);
  EXPECT_EQ(turns[1]["status"], "completed");
  stop_all({&a, &b});
}

// So for `quarry ask` on the shared history: its turn stops, says why, and the conversation
// goes on through a server.
TEST(Multiserver, AnAskThatLostItsLockStopsAndSaysWhy) {
  SharedHistory history;
  auto options = history.server("multi-a");
  options.scenario = "long_command";
  QuarryServer a(options);
  ASSERT_TRUE(a.started());
  ApiClient through_a(a.url());
  const auto id = through_a.create_conversation("ask lock lost");
  const auto said = a.state_dir() / "ask-stderr";
  ChildProcess asking(
      {SandboxEnvironment::get().quarry_binary().string(), "--config", a.config().string(),
       "--state-dir", a.state_dir().string(), "ask", "--conversation", id, "Run the long one"},
      said);
  ASSERT_TRUE(asking.line_with("[run_python"));
  // The step runs once the turn is recorded running with a sandbox.
  bool running = false;
  for (int i = 0; i < 200 && !running; ++i) {
    const auto document = through_a.get("/api/v1/conversations/" + id).json;
    running = document["sandbox"].is_object() && document["sandbox"]["state"] == "busy";
    if (!running) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(running) << through_a.get("/api/v1/conversations/" + id).body;
  terminate_turn_lock(id);
  (void)asking.rest();  // read to its end, so that it never waits on a full pipe
  const int status = asking.wait();
  const std::string error = read_file(said).value_or("");
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << status << ": " << error;
  EXPECT_NE(error.find(std::string(conversation::kTurnLockLost)), std::string::npos) << error;
  const auto turns = through_a.get("/api/v1/conversations/" + id).json["turns"];
  ASSERT_EQ(turns.size(), 1u) << turns.dump();
  EXPECT_EQ(turns[0]["status"], "cancelled");
  EXPECT_EQ(turns[0]["error"], conversation::kTurnLockLost);

  auto again = through_a.cell(id, "python", "print(6 * 7)");
  ASSERT_FALSE(again.events.empty());
  EXPECT_EQ(again.events.back().data["status"], "completed") << again.body;
  EXPECT_EQ(printed(again.events), "42\n");
  stop_all({&a});
}

}  // namespace
}  // namespace quarry::testing

// What an operator's monitoring asks: /healthz (the process answers) and /readyz (what it needs
// is reachable: the database, the history store, the sandbox provider), which answers 503 with
// what is wrong when something is not.
#include <gtest/gtest.h>

#include <future>
#include <thread>

#include "api_environment.h"

namespace quarry::testing {
namespace {

TEST(Health, ReadyWhenEverythingItNeedsAnswers) {
  QuarryServer server;
  ASSERT_TRUE(server.started());
  ApiClient anyone(server.url());
  auto health = anyone.get("/healthz");
  EXPECT_EQ(health.status, 200);
  EXPECT_EQ(health.json["status"], "ok");
  auto ready = anyone.get("/readyz");
  ASSERT_EQ(ready.status, 200) << ready.body;
  EXPECT_EQ(ready.json["status"], "ready");
  EXPECT_FALSE(ready.json.contains("reason"));
  EXPECT_EQ(ready.json["checks"],
            nlohmann::json({{"database", "ok"}, {"history", "ok"}, {"sandboxes", "ok"}}));
  EXPECT_EQ(server.stop(SIGTERM), 0);
}

TEST(Health, NotReadyWhenTheDatabaseIsUnreachableAndSaysSo) {
  // A database.url whose port nothing listens on (with a password that must not be shown).
  QuarryServer server(
      {.database_url = "postgresql://quarry_reader:not-the-password@127.0.0.1:1/analytics"});
  ASSERT_TRUE(server.started());
  ApiClient anyone(server.url());
  // Alive, not ready.
  EXPECT_EQ(anyone.get("/healthz").status, 200);
  auto ready = anyone.get("/readyz");
  ASSERT_EQ(ready.status, 503) << ready.body;
  EXPECT_EQ(ready.json["status"], "unavailable");
  const std::string reason = ready.json.value("reason", "");
  EXPECT_TRUE(reason.starts_with("database: ")) << reason;
  EXPECT_NE(reason.find("127.0.0.1"), std::string::npos) << reason;
  EXPECT_NE(reason.find("port 1"), std::string::npos) << reason;
  EXPECT_NE(reason.find("refused"), std::string::npos) << reason;
  EXPECT_NE(reason.find("check database.url"), std::string::npos) << reason;
  EXPECT_EQ(reason.find('\n'), std::string::npos) << "one line: " << reason;
  EXPECT_EQ(reason.find("history"), std::string::npos) << "only what is wrong: " << reason;
  EXPECT_NE(ready.json["checks"]["database"], "ok");
  EXPECT_EQ(ready.json["checks"]["history"], "ok");
  EXPECT_EQ(ready.json["checks"]["sandboxes"], "ok");
  // Anyone may ask /readyz: the database's password is not in its answer.
  EXPECT_EQ(ready.body.find("not-the-password"), std::string::npos) << ready.body;
  EXPECT_EQ(server.stop(SIGTERM), 0);
}

TEST(Health, WithUsersOnlyASignedInCallerIsToldWhatFailed) {
  QuarryServer server(
      {.tokens = true,
       .database_url = "postgresql://quarry_reader:not-the-password@127.0.0.1:1/analytics"});
  ASSERT_TRUE(server.started());
  // Anyone learns which check fails, not where the database is.
  ApiClient anyone(server.url());
  auto ready = anyone.get("/readyz");
  ASSERT_EQ(ready.status, 503) << ready.body;
  EXPECT_EQ(ready.json["status"], "unavailable");
  EXPECT_EQ(ready.json["checks"],
            nlohmann::json({{"database", "failing"}, {"history", "ok"}, {"sandboxes", "ok"}}));
  const std::string reason = ready.json.value("reason", "");
  EXPECT_TRUE(reason.starts_with("database failing")) << reason;
  EXPECT_NE(reason.find("with a token"), std::string::npos) << "says how to learn more: " << reason;
  EXPECT_EQ(ready.body.find("127.0.0.1"), std::string::npos) << ready.body;
  EXPECT_EQ(ready.body.find("port 1"), std::string::npos) << ready.body;
  // A caller with a token is told, and the server's log has it too.
  ApiClient alice(server.url());
  alice.use_token(server.token("alice"));
  auto told = alice.get("/readyz");
  ASSERT_EQ(told.status, 503) << told.body;
  EXPECT_NE(told.json.value("reason", "").find("127.0.0.1"), std::string::npos) << told.body;
  EXPECT_NE(told.json["checks"]["database"], "failing");
  EXPECT_EQ(told.body.find("not-the-password"), std::string::npos) << told.body;
  // A token that is not valid is no error here: /readyz answers anyone.
  ApiClient stranger(server.url());
  stranger.use_token("not-a-token");
  EXPECT_EQ(stranger.get("/readyz").json["checks"]["database"], "failing");
  EXPECT_EQ(server.stop(SIGTERM), 0);
  EXPECT_NE(server.log().find("not ready: database: "), std::string::npos);
}

// Anyone may ask /readyz, and a load balancer's probes, or anyone's, may come in a storm: while
// the database hangs, they share one check (one connection, one connect timeout) rather than
// each opening a connection and holding a request thread for its timeout.
TEST(Health, ProbesAtOnceShareOneCheckOfTheDatabase) {
  HungDatabase database;
  QuarryServer server({.database_url = database.url()});
  ASSERT_TRUE(server.started());
  const int before = database.accepted();
  constexpr int kProbes = 6;
  std::vector<ApiResponse> answers(kProbes);
  std::vector<std::thread> probes;
  for (int i = 0; i < kProbes; ++i) {
    probes.emplace_back([&, i] { answers[i] = ApiClient(server.url()).get("/readyz"); });
  }
  for (auto& probe : probes)
    probe.join();
  for (const auto& answer : answers) {
    EXPECT_EQ(answer.status, 503) << answer.body;
    EXPECT_NE(answer.json["checks"]["database"], "ok") << answer.body;
    EXPECT_EQ(answer.json["checks"]["history"], "ok") << answer.body;
  }
  EXPECT_EQ(database.accepted() - before, 1) << "connections the probes opened to the database";

  // A second on, the answer is old: the next probe checks again, and one that comes while it
  // waits on the database is answered at once with the last answer.
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  auto checking =
      std::async(std::launch::async, [&] { return ApiClient(server.url()).get("/readyz"); });
  for (int i = 0; i < 200 && database.accepted() - before < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(database.accepted() - before, 2) << "the next check reached the database";
  auto meanwhile = ApiClient(server.url()).get("/readyz");
  EXPECT_EQ(meanwhile.status, 503) << meanwhile.body;
  EXPECT_NE(meanwhile.json["checks"]["database"], "ok") << meanwhile.body;
  EXPECT_EQ(checking.wait_for(std::chrono::seconds(0)), std::future_status::timeout)
      << "the probe that came meanwhile waited for the check";
  EXPECT_EQ(checking.get().status, 503);
  EXPECT_EQ(database.accepted() - before, 2);
  EXPECT_EQ(server.stop(SIGTERM), 0);
}

}  // namespace
}  // namespace quarry::testing

// What an operator's monitoring asks: /healthz (the process answers) and /readyz (what it needs
// is reachable: the database, the history store, the sandbox provider), which answers 503 with
// what is wrong when something is not.
#include <gtest/gtest.h>

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

}  // namespace
}  // namespace quarry::testing

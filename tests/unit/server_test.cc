// The server's pieces that need no process: routing, strict bodies, query strings, event ids,
// cookies and hosts, tokens and sessions, the history the model sees.
#include <gtest/gtest.h>
#include <unistd.h>

#include "agent/agent.h"
#include "agent/sse_parser.h"
#include "common/file_util.h"
#include "conversation/sqlite_history_store.h"
#include "counting_provider.h"
#include "server/api.h"
#include "server/auth.h"
#include "server/http_server.h"
#include "server/json_body.h"
#include "server/router.h"
#include "server/server_heartbeat.h"
#include "server/stream_hub.h"

namespace quarry::server {
namespace {

TEST(Router, MatchesPathsAndSaysWhatExists) {
  auto route = match_route("GET", "/api/v1/conversations/abc123/events");
  ASSERT_TRUE(route);
  EXPECT_EQ(route->route->id, RouteId::kEvents);
  EXPECT_EQ(route->params.at("id"), "abc123");
  EXPECT_EQ(match_route("GET", "/api/v1/artifacts/7")->params.at("artifact_id"), "7");
  EXPECT_EQ(match_route("GET", "/")->route->id, RouteId::kIndex);

  std::string allow;
  auto wrong_method = match_route("PATCH", "/api/v1/conversations/abc", &allow);
  ASSERT_FALSE(wrong_method);
  EXPECT_EQ(wrong_method.error().status, 405);
  EXPECT_EQ(allow, "GET, DELETE");
  for (const char* path : {"/api/v1/conversations/", "/api/v1/conversations//events",
                           "/api/v2/conversations", "/api/v1/conversations/a/b/c", ""}) {
    SCOPED_TRACE(path);
    auto missing = match_route("GET", path);
    ASSERT_FALSE(missing);
    EXPECT_EQ(missing.error().status, 404);
    EXPECT_EQ(missing.error().code, "no_route");
  }
}

TEST(JsonBody, ReadsStrictlyAndSaysWhatIsWrong) {
  struct Case {
    std::string body, content_type, code, message;
  };
  const std::vector<Case> cases = {
      {"{", "application/json", "invalid_json", "the body is not valid JSON"},
      {"[1]", "application/json", "invalid_json", "must be a JSON object, not array"},
      {R"({"content": "x", "extra": 1})", "application/json", "unknown_field",
       "unknown field 'extra' (the fields here are: content)"},
      {R"({"content": 5})", "application/json", "invalid_field",
       "'content' must be a string, not number"},
      {"{}", "application/json", "missing_field", "'content' is required"},
      {R"({"content": "x"})", "text/plain", "unsupported_media_type", "application/json"},
      {"\"\xff\"", "application/json", "invalid_json", "not valid JSON"},
      {R"({"content": 1e400})", "application/json", "invalid_json", "number overflow"},
      {"{\"content\": " + std::string(65, '[') + std::string(65, ']') + "}", "application/json",
       "invalid_json", "nests deeper than 64 levels"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.body);
    auto body = JsonBody::parse(c.body, c.content_type, {"content"});
    ApiResult<std::string> content =
        body ? body->string("content", 10) : std::unexpected(body.error());
    ASSERT_FALSE(content);
    EXPECT_EQ(content.error().code, c.code);
    EXPECT_NE(content.error().message.find(c.message), std::string::npos)
        << content.error().message;
  }
  auto body = JsonBody::parse(R"({"content": "hello"})", "application/json; charset=utf-8",
                              {"content", "title"});
  ASSERT_TRUE(body);
  EXPECT_EQ(*body->string("content"), "hello");
  EXPECT_FALSE(*body->optional_string("title"));
  EXPECT_EQ(body->string("content", 3).error().code, "invalid_field");  // too long
  EXPECT_TRUE(JsonBody::parse("", "", {}));                             // no body at all is {}
}

TEST(Query, DecodesAndRefusesBrokenEscapes) {
  auto query = parse_query("limit=5&cursor=1764.ab%2Fc&name=a+b&flag");
  ASSERT_TRUE(query);
  EXPECT_EQ(query->at("limit"), "5");
  EXPECT_EQ(query->at("cursor"), "1764.ab/c");
  EXPECT_EQ(query->at("name"), "a b");
  EXPECT_EQ(query->at("flag"), "");
  for (const char* bad : {"a=%", "a=%4", "a=%zz"}) {
    EXPECT_FALSE(parse_query(bad)) << bad;
  }
}

TEST(AccessLog, ShowsTheValuesOfTheApisOwnParametersOnly) {
  struct Case {
    std::string query;
    std::string logged;
  };
  const std::vector<Case> cases = {
      {"limit=5&cursor=1764.ab", "cursor=1764.ab&limit=5"},
      {"after=3-0&download=1&conversation=abc", "after=3-0&conversation=abc&download=1"},
      {"token=qry_x&limit=1", "limit=1&token=[redacted]"},
      {"TOKEN=qry_x&Access_Token=qry_x&api-key=qry_x",
       "Access_Token=[redacted]&TOKEN=[redacted]&api-key=[redacted]"},
      {"%74oken=qry_x", "token=[redacted]"},  // decoded first
      {"qry_0123456789abcdef", "[redacted]=[redacted]"},
      {"x=1&passw0rd=2", "[redacted]=[redacted]&x=[redacted]"},
  };
  for (const auto& [query, logged] : cases) {
    SCOPED_TRACE(query);
    auto parsed = parse_query(query);
    ASSERT_TRUE(parsed);
    const std::string line = loggable_query(*parsed);
    EXPECT_EQ(line, logged);
    EXPECT_EQ(line.find("qry_"), std::string::npos);
  }
}

TEST(EventIds, RoundTripAndRefuseWhatIsNotOne) {
  EXPECT_EQ(to_string(EventId{3, 17}), "3-17");
  auto id = parse_event_id("3-17");
  ASSERT_TRUE(id);
  EXPECT_EQ(id->turn, 3);
  EXPECT_EQ(id->seq, 17);
  for (const char* bad : {"", "3", "3-", "-1", "a-1", "1-2-3", "1 -2", "99999999999-1"}) {
    EXPECT_FALSE(parse_event_id(bad)) << bad;
  }
  EXPECT_LT((EventId{2, 100}), (EventId{3, 0}));
  EXPECT_EQ(sse_frame({3, 17, "text", R"({"text":"hi"})"}),
            "id: 3-17\nevent: text\ndata: {\"text\":\"hi\"}\n\n");
}

TEST(Auth, CookiesAndHosts) {
  EXPECT_EQ(cookie_value("a=1; quarry_session=abc; b=2", "quarry_session"), "abc");
  EXPECT_EQ(cookie_value("quarry_session=x", "quarry_session"), "x");
  EXPECT_FALSE(cookie_value("xquarry_session=x", "quarry_session"));
  EXPECT_FALSE(cookie_value("", "quarry_session"));
  for (const char* host :
       {"localhost:8080", "127.0.0.1", "127.1.2.3:1", "[::1]:8080", "LOCALHOST"}) {
    EXPECT_TRUE(is_loopback_host_header(host)) << host;
  }
  for (const char* host : {"example.com", "127.0.0.1.example.com:80", "10.0.0.1:8080", "[::2]", "",
                           "localhost.example"}) {
    EXPECT_FALSE(is_loopback_host_header(host)) << host;
  }
}

class TokensTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = std::filesystem::temp_directory_path() / fmt::format("quarry-tokens-{}", ::getpid()) /
            "tokens.json";
    std::filesystem::remove_all(path_.parent_path());
  }
  void TearDown() override { std::filesystem::remove_all(path_.parent_path()); }
  std::filesystem::path path_;
  ManualClock clock_;
};

TEST_F(TokensTest, TheFileKeepsOnlyHashesAndRemovingATokenEndsItsSessions) {
  auto alice = token_file::create(path_, "alice", clock_);
  ASSERT_TRUE(alice) << alice.error().message;
  EXPECT_TRUE(alice->starts_with("qry_"));
  EXPECT_EQ(alice->size(), 68u);
  auto bob = token_file::create(path_, "bob", clock_);
  ASSERT_TRUE(bob);
  EXPECT_EQ(token_file::create(path_, "alice", clock_).error().code, ErrorCode::kAlreadyExists);
  EXPECT_EQ(token_file::create(path_, "../x", clock_).error().code, ErrorCode::kInvalidArgument);
  auto text = read_file(path_);
  EXPECT_EQ(text->find(*alice), std::string::npos);
  EXPECT_EQ(std::filesystem::status(path_).permissions() & std::filesystem::perms::all,
            std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);

  Sessions sessions(clock_, std::chrono::hours(1));
  Authenticator auth(std::make_unique<TokenStore>(path_), sessions);
  EXPECT_EQ(auth.authenticate({"Bearer " + *alice, ""})->user, "alice");
  EXPECT_EQ(auth.authenticate({"Bearer qry_nope", ""}).error().status, 401);
  EXPECT_EQ(auth.authenticate({"bearer  " + *alice, ""})->user, "alice");  // any case, any spaces
  EXPECT_EQ(auth.authenticate({"Basic " + *alice, ""}).error().status, 401);
  EXPECT_EQ(auth.authenticate({"Bearer", ""}).error().status, 401);
  auto [id, session] = sessions.create("bob", *bob);
  auto cookie = "quarry_session=" + id;
  auto by_cookie = auth.authenticate({"", cookie});
  ASSERT_TRUE(by_cookie);
  EXPECT_EQ(by_cookie->user, "bob");
  EXPECT_EQ(by_cookie->method, AuthMethod::kCookie);
  // Changes by cookie need the CSRF token and the same origin.
  RequestOrigin origin{"127.0.0.1:8080", "", ""};
  EXPECT_EQ(auth.check_change(*by_cookie, origin).error().code, "csrf_failed");
  origin.csrf = session.csrf_token;
  EXPECT_TRUE(auth.check_change(*by_cookie, origin));
  origin.origin = "http://127.0.0.1:8080";
  EXPECT_TRUE(auth.check_change(*by_cookie, origin));
  origin.origin = "http://evil.example";
  EXPECT_EQ(auth.check_change(*by_cookie, origin).error().code, "cross_origin");

  ASSERT_TRUE(token_file::remove(path_, "bob"));
  // The file changed within the same clock tick on some filesystems: make sure it is seen.
  std::filesystem::last_write_time(
      path_, std::filesystem::last_write_time(path_) + std::chrono::seconds(1));
  EXPECT_EQ(auth.authenticate({"Bearer " + *bob, ""}).error().status, 401);
  EXPECT_EQ(auth.authenticate({"", cookie}).error().status, 401);
  EXPECT_EQ(auth.authenticate({"Bearer " + *alice, ""})->user, "alice");
  EXPECT_EQ(token_file::remove(path_, "bob").error().code, ErrorCode::kNotFound);

  // A token rotated after a leak: the session signed in with the old one ends, though its
  // user has a token again.
  auto [alice_id, alice_session] = sessions.create("alice", *alice);
  const auto alice_cookie = "quarry_session=" + alice_id;
  EXPECT_EQ(auth.authenticate({"", alice_cookie})->user, "alice");
  ASSERT_TRUE(token_file::remove(path_, "alice"));
  auto rotated = token_file::create(path_, "alice", clock_);
  ASSERT_TRUE(rotated);
  std::filesystem::last_write_time(
      path_, std::filesystem::last_write_time(path_) + std::chrono::seconds(2));
  EXPECT_EQ(auth.authenticate({"", alice_cookie}).error().status, 401);
  EXPECT_EQ(auth.authenticate({"Bearer " + *rotated, ""})->user, "alice");

  // Sessions end when they expire.
  auto [later, kept] = sessions.create("alice", *rotated);
  clock_.advance(std::chrono::minutes(61));
  EXPECT_FALSE(sessions.find(later));
}

TEST(Auth, WithoutTokensOnlyLoopbackNamesAreServed) {
  ManualClock clock;
  Sessions sessions(clock, std::chrono::hours(1));
  Authenticator auth(nullptr, sessions);
  EXPECT_EQ(auth.authenticate({"", ""})->user, "local");
  EXPECT_TRUE(auth.check_origin({"localhost:8080", "", ""}));
  EXPECT_EQ(auth.check_origin({"rebound.example:8080", "", ""}).error().code, "host_not_allowed");
  EXPECT_EQ(auth.sign_in("anything").error().code, "no_tokens");
}

TEST(SseParser, KeepsTheLastEventId) {
  agent::SseParser parser;
  auto events = parser.feed("id: 1-1\nevent: text\ndata: a\n\ndata: b\n\nid: 1-3\ndata: c\n\n");
  ASSERT_TRUE(events);
  ASSERT_EQ(events->size(), 3u);
  EXPECT_EQ((*events)[0].id, "1-1");
  EXPECT_EQ((*events)[1].id, "1-1");  // an event without an id keeps the last one
  EXPECT_EQ((*events)[2].id, "1-3");
}

}  // namespace
}  // namespace quarry::server

namespace quarry::agent {
namespace {

// A history in a directory of its own, removed with it.
struct ScratchHistory {
  explicit ScratchHistory(std::string_view name)
      : dir(std::filesystem::temp_directory_path() /
            fmt::format("quarry-{}-{}", name, ::getpid())) {
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    store = *conversation::SqliteHistoryStore::open(dir / "history.db", clock);
  }
  ~ScratchHistory() {
    store.reset();
    std::filesystem::remove_all(dir);
  }
  std::filesystem::path dir;
  ManualClock clock;
  std::unique_ptr<conversation::SqliteHistoryStore> store;
};

// "done" is published after the turn lock is released, so the next turn may begin first. A
// watcher of the first turn read its finished events from the history, where "done" was not
// yet, and went on to the next turn: its stream never ended.
TEST(StreamHubTest, AWatcherOfATurnWhoseNextBeganStillGetsItsDone) {
  ScratchHistory history("hub");
  auto& store = history.store;
  const auto id = store->create_conversation("c")->id;
  server::StreamHub hub(*store);
  ASSERT_EQ(store->begin_turn(id, conversation::TurnKind::kCell), 1);
  auto first = hub.begin(id, 1);
  first->publish("text", {{"text", "one"}});
  ASSERT_TRUE(store->finish_turn(id, 1, conversation::TurnStatus::kCompleted, ""));
  ASSERT_EQ(store->begin_turn(id, conversation::TurnKind::kCell), 2);
  auto second = hub.begin(id, 2);
  second->publish("turn_started", {});

  auto waiting = hub.next(id, {1, 1});
  ASSERT_TRUE(waiting) << waiting.error().message;
  EXPECT_TRUE(waiting->events.empty());
  EXPECT_EQ(waiting->position, (server::EventId{1, 1})) << "it waits in its turn";
  first->publish("done", {{"status", "completed"}});
  hub.end(*first);
  auto done = hub.next(id, {1, 1});
  ASSERT_TRUE(done) << done.error().message;
  ASSERT_EQ(done->events.size(), 1u);
  EXPECT_EQ(done->events[0].type, "done");
  // Then the next turn, from memory.
  auto next = hub.next(id, done->position);
  ASSERT_TRUE(next);
  ASSERT_EQ(next->events.size(), 1u);
  EXPECT_EQ(next->events[0].turn, 2);
  hub.end(*second);
}

// A server lives for months and streams many conversations, and with several servers on one
// history it hears of every event recorded anywhere: it must not keep something for each.
TEST(StreamHubTest, ForgetsAConversationNobodyWatchesAndNoTurnRuns) {
  ScratchHistory history("hub");
  auto& store = history.store;
  server::StreamHub hub(*store);
  server::net::io_context io;
  for (int i = 0; i < 20; ++i) {
    const auto id = store->create_conversation("c")->id;
    auto watch = hub.watch(id);
    ASSERT_EQ(store->begin_turn(id, conversation::TurnKind::kCell), 1);
    auto turn = hub.begin(id, 1);
    turn->publish("done", {{"status", "completed"}});
    auto timer = std::make_shared<server::net::steady_timer>(io);
    ASSERT_TRUE(hub.arm(id, {1, 1}, timer));
    hub.end(*turn);
    hub.disarm(id, timer);
    EXPECT_EQ(hub.conversations(), 1u) << "watched still";
  }
  for (int i = 0; i < 20; ++i) {
    hub.heard(fmt::format("elsewhere-{}", i), {1, 1});  // recorded by another server
  }
  EXPECT_EQ(hub.conversations(), 0u);
}

// A watcher reads the history off the I/O thread, then arms on it. An event recorded between
// the two wakes nobody: the watcher must still find it when it arms, even though nothing else
// kept the conversation in the hub meanwhile.
TEST(StreamHubTest, AnEventBetweenAWatchersReadAndItsArmingIsNotMissed) {
  ScratchHistory history("hub");
  auto& store = history.store;
  const auto id = store->create_conversation("c")->id;
  server::StreamHub hub(*store);
  server::net::io_context io;
  auto timer = std::make_shared<server::net::steady_timer>(io);
  auto watch = hub.watch(id);

  auto read = hub.next(id, {});
  ASSERT_TRUE(read) << read.error().message;
  EXPECT_TRUE(read->events.empty());
  hub.heard(id, {1, 1});  // another server's turn
  EXPECT_FALSE(hub.arm(id, read->position, timer)) << "it reads again";

  const auto other = store->create_conversation("c")->id;
  auto other_watch = hub.watch(other);
  read = hub.next(other, {});
  ASSERT_TRUE(read) << read.error().message;
  ASSERT_EQ(store->begin_turn(other, conversation::TurnKind::kCell), 1);
  auto turn = hub.begin(other, 1);
  turn->publish("done", {{"status", "completed"}});
  hub.end(*turn);
  EXPECT_FALSE(hub.arm(other, read->position, timer)) << "a turn here, begun and ended meanwhile";
}

TEST(UnansweredCalls, AreAnsweredSoTheHistoryIsValidForTheModel) {
  ScratchHistory history("calls");
  auto& store = history.store;
  auto id = store->create_conversation("c")->id;
  using conversation::Message;
  using conversation::Role;
  auto add = [&](Role role, std::string content, nlohmann::json calls = nullptr,
                 std::string call_id = "") {
    Message message;
    message.turn = 1;
    message.role = role;
    message.content = std::move(content);
    message.tool_calls = std::move(calls);
    message.tool_call_id = std::move(call_id);
    store->append_message(id, message);
  };
  add(Role::kUser, "question");
  add(Role::kAssistant, "",
      nlohmann::json::array({{{"id", "a"}, {"name", "run_python"}, {"arguments", "{}"}},
                             {{"id", "b"}, {"name", "query_database"}, {"arguments", "{}"}}}));
  add(Role::kTool, "result of a", nullptr, "a");
  // The process died here: b has no result.
  auto added = close_unanswered_calls(*store, id);
  ASSERT_TRUE(added);
  EXPECT_EQ(*added, 1);
  auto messages = *store->messages(id);
  ASSERT_EQ(messages.size(), 4u);
  EXPECT_EQ(messages[3].role, Role::kTool);
  EXPECT_EQ(messages[3].tool_call_id, "b");
  EXPECT_EQ(messages[3].turn, 1);
  EXPECT_NE(messages[3].content.find("interrupted"), std::string::npos);
  EXPECT_EQ(messages[3].details["interrupted"], true);
  EXPECT_EQ(*close_unanswered_calls(*store, id), 0);  // once is enough
}

}  // namespace
namespace {

// A registry in memory whose database can be out of reach: one other server, silent for long,
// and when this server's beats were recorded and when it claimed the other.
class OutageRegistry final : public conversation::ServerRegistry {
 public:
  using Time = std::chrono::steady_clock::time_point;
  Result<void> enter(const conversation::ServerRecord&) override { return {}; }
  Result<bool> beat(std::string_view) override {
    std::lock_guard lock(mutex);
    if (down) return make_error(ErrorCode::kUnavailable, "the database cannot be reached");
    beats.push_back(std::chrono::steady_clock::now());
    return true;
  }
  Result<void> leave(std::string_view) override { return {}; }
  Result<std::vector<conversation::ServerRecord>> servers() override {
    conversation::ServerRecord other;
    other.boot_id = "other";
    other.silent_for = std::chrono::hours(1);
    return std::vector{other};
  }
  Result<std::optional<conversation::TakeOver>> claim(std::string_view,
                                                      std::chrono::milliseconds) override {
    std::lock_guard lock(mutex);
    claims.push_back(std::chrono::steady_clock::now());
    return std::nullopt;  // another server takes it over
  }
  Result<void> taken_over(const conversation::TakeOver&) override { return {}; }
  Result<void> request_cancel(std::string_view, int) override { return {}; }
  Result<void> request_room(std::string_view, std::string_view) override { return {}; }
  Result<bool> claim_room(int64_t) override { return false; }
  Result<std::vector<std::string>> deleted_among(const std::vector<std::string>&) override {
    return std::vector<std::string>{};
  }
  Result<std::unique_ptr<conversation::Subscription>> listen(conversation::Listeners) override {
    return make_error(ErrorCode::kInternal, "not listened to here");
  }

  std::mutex mutex;
  bool down = false;
  std::vector<Time> beats, claims;
};

// The database restarting for longer than the timeout makes every server's heartbeat old. The
// first server to beat again must not take the others for dead (destroying their sandboxes
// under their running turns) before they could beat again too.
TEST(ServerHeartbeatTest, AfterAnOutageNoServerIsTakenForDeadBeforeTheOthersCouldBeatAgain) {
  ScratchHistory history("heartbeat");
  testing_support::CountingProvider provider;
  conversation::ConversationManager manager(provider, *history.store, history.clock, {});
  server::StreamHub hub(*history.store);
  OutageRegistry registry;
  constexpr auto kTimeout = std::chrono::milliseconds(300);
  conversation::ServerRecord self;
  self.boot_id = "self";
  server::ServerHeartbeat heartbeat(registry, manager, hub, self, kTimeout);
  registry.down = true;
  ASSERT_TRUE(heartbeat.start());
  std::this_thread::sleep_for(2 * kTimeout);
  {
    std::lock_guard lock(registry.mutex);
    EXPECT_TRUE(registry.claims.empty()) << "claimed while its own beats failed";
    registry.down = false;
  }
  bool claimed = false;
  for (int i = 0; i < 500 && !claimed; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    std::lock_guard lock(registry.mutex);
    claimed = !registry.claims.empty();
  }
  ASSERT_TRUE(claimed) << "the silent server is claimed in the end";
  std::lock_guard lock(registry.mutex);
  ASSERT_FALSE(registry.beats.empty());
  EXPECT_GE(registry.claims.front() - registry.beats.front(), kTimeout)
      << "claimed "
      << std::chrono::duration_cast<std::chrono::milliseconds>(registry.claims.front() -
                                                               registry.beats.front())
             .count()
      << " ms after its first beat since the outage";
}

}  // namespace

}  // namespace quarry::agent

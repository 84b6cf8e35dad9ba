// The API's handlers: each takes a parsed, authenticated request and answers JSON, a file (an
// artifact) or a stream of a conversation's events. They run on the server's pool for blocking
// work (they read the history and may destroy sandboxes), never on the I/O thread. Every route
// is in the OpenAPI document (openapi.yaml).
#pragma once

#include <chrono>
#include <filesystem>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "conversation/conversation_manager.h"
#include "server/auth.h"
#include "server/router.h"
#include "server/stream_hub.h"
#include "server/turn_runner.h"

namespace quarry::server {

// A query's parameters in their order, repeated names repeated.
using QueryList = std::vector<std::pair<std::string, std::string>>;

struct ApiRequest {
  RouteMatch route;
  std::string method;
  std::string path;  // without the query
  std::map<std::string, std::string, std::less<>> query;
  QueryList query_list;  // the same, in order, for parameters that repeat
  std::string host;      // the Host header: how the client reached this server
  std::string body;
  std::string content_type;
  std::string last_event_id;  // the Last-Event-ID header
  Identity identity;
};

using Headers = std::vector<std::pair<std::string, std::string>>;

struct JsonReply {
  int status = 200;
  nlohmann::json body;  // null: no body (204)
  Headers headers;
};

// A file sent as it is: an artifact, or a file of the web UI.
struct FileReply {
  std::filesystem::path path;
  std::string content_type;
  Headers headers;  // e.g. Content-Security-Policy, Content-Disposition
};

// A conversation's events from `after` on: those of one turn (until its "done") or, when
// `follow`, every turn as it comes until the client leaves.
struct StreamReply {
  std::string conversation_id;
  EventId after;
  bool follow = false;
};

// Bytes made in memory, sent with their media type (a file read out of a sandbox, a multipart
// body).
struct BytesReply {
  int status = 200;
  std::string content_type;
  std::string body;
  Headers headers;
};

using ApiReply = std::variant<JsonReply, FileReply, StreamReply, BytesReply>;

struct ServerInfo {
  std::string version;
  std::string listen;
  uint64_t max_body = 0;
  size_t workers = 0;
  // Why questions cannot be asked (no model client could be made), if so.
  std::optional<std::string> model_unavailable;
};

class Api {
 public:
  struct Services {
    const Config& config;
    std::filesystem::path state_dir;
    conversation::HistoryStore& history;
    conversation::ConversationManager& manager;
    sandbox::SandboxProvider& provider;
    TurnRunner& turns;
    StreamHub& hub;
    Authenticator& auth;
    Sessions& sessions;
    ServerInfo info;
    std::filesystem::path web_dir;  // the UI's index.html and assets/
  };
  explicit Api(Services services);

  ApiReply handle(const ApiRequest& request);

 private:
  ApiResult<ApiReply> dispatch(const ApiRequest& request);
  // The conversation `id` if it is the user's; another user's is as unknown as a missing one.
  ApiResult<conversation::Conversation> owned(const ApiRequest& request, std::string_view id);
  // The conversation's turn the history records as running (in this server or another sharing
  // the history), if any.
  std::optional<int> running_turn(const std::string& conversation_id);

  ApiResult<ApiReply> page();
  ApiResult<ApiReply> asset(const ApiRequest& request);
  ApiResult<ApiReply> ready(const ApiRequest& request);
  ApiResult<ApiReply> info(const ApiRequest& request);
  ApiResult<ApiReply> read_session(const ApiRequest& request);
  ApiResult<ApiReply> create_session(const ApiRequest& request);
  ApiResult<ApiReply> delete_session(const ApiRequest& request);
  ApiResult<ApiReply> list_conversations(const ApiRequest& request);
  ApiResult<ApiReply> create_conversation(const ApiRequest& request);
  ApiResult<ApiReply> read_conversation(const ApiRequest& request);
  ApiResult<ApiReply> delete_conversation(const ApiRequest& request);
  ApiResult<ApiReply> create_message(const ApiRequest& request);
  ApiResult<ApiReply> create_cell(const ApiRequest& request);
  ApiResult<ApiReply> events(const ApiRequest& request);
  ApiResult<ApiReply> cancel(const ApiRequest& request);
  // The number of the conversation's turn recorded running, which another server sharing the
  // history runs (this one's are TurnRunner's); 0 for none, or for a history of one server.
  Result<int> running_elsewhere(const std::string& conversation_id);
  ApiResult<ApiReply> list_artifacts(const ApiRequest& request);
  ApiResult<ApiReply> read_artifact(const ApiRequest& request);
  ApiResult<ApiReply> artifact_table(const ApiRequest& request);
  // An artifact and its file on this server.
  struct StoredArtifact {
    conversation::Artifact record;
    std::filesystem::path file;
  };
  // The artifact `id` names, if it belongs to the user, and its file (restored from the history
  // when another server collected it); its file must still be stored.
  ApiResult<StoredArtifact> owned_artifact(const ApiRequest& request, std::string_view id);
  ApiResult<ApiReply> list_execs(const ApiRequest& request);
  ApiResult<ApiReply> list_sandboxes(const ApiRequest& request);

  Services services_;
  std::string openapi_;  // the document, as JSON text
  // /readyz's last checks, shared by the probes of the next second, and by those that come while
  // the next check runs: anyone may ask, and a storm of probes opens one database connection,
  // not one each, and holds one request thread for the database's connect timeout. What they
  // found wrong is logged once each time it changes.
  struct Readiness {
    nlohmann::json checks;
    std::vector<std::string> problems;
    std::chrono::steady_clock::time_point checked_at;
  };
  Readiness check_readiness();
  std::mutex readiness_check_mutex_;  // held by the probe that checks
  std::mutex readiness_mutex_;        // guards readiness_ and logged_problems_
  std::optional<Readiness> readiness_;
  std::string logged_problems_;
};

// "a=1&b=x%20y" -> {a: 1, b: "x y"} (a repeated name: its last value); a malformed escape is an
// error.
ApiResult<std::map<std::string, std::string, std::less<>>> parse_query(std::string_view query);
// The same, every pair in its order ("states=a&states=b" is two).
ApiResult<QueryList> parse_query_list(std::string_view query);
// The parameters of a list by name, each with its last value.
std::map<std::string, std::string, std::less<>> query_map(const QueryList& list);

}  // namespace quarry::server

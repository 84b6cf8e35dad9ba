#include "server/api.h"

#include <spdlog/spdlog.h>

#include <charconv>

#include "agent/artifacts.h"
#include "config/allowlist.h"
#include "config/config.h"
#include "conversation/history_json.h"
#include "conversation/lifecycle.h"
#include "data/connection.h"
#include "data/database.h"
#include "data/table_view.h"
#include "server/api_json.h"
#include "server/json_body.h"
#include "server/openapi.h"

namespace quarry::server {
namespace {

constexpr size_t kDefaultPage = 50;
constexpr size_t kMaxPage = 200;
constexpr size_t kMaxQuestionBytes = 100'000;
constexpr size_t kMaxCellBytes = 1 << 20;

JsonReply json(nlohmann::json body, int status = 200) {
  return JsonReply{status, std::move(body), {}};
}

// Refuses query parameters the route does not take, naming the ones it does.
ApiResult<void> check_query(const ApiRequest& request, const Route& route) {
  if (route.page) return {};
  std::vector<std::string_view> allowed;
  for (auto name : route.query) {
    if (!name.empty()) allowed.push_back(name);
  }
  for (const auto& [name, value] : request.query) {
    if (std::find(allowed.begin(), allowed.end(), name) == allowed.end()) {
      return api_error(400, "unknown_parameter", "unknown query parameter '{}' ({})", name,
                       allowed.empty()
                           ? std::string("this route takes none")
                           : fmt::format("this route takes: {}", fmt::join(allowed, ", ")));
    }
  }
  return {};
}

ApiResult<size_t> page_size(const ApiRequest& request) {
  auto found = request.query.find("limit");
  if (found == request.query.end()) return kDefaultPage;
  size_t limit = 0;
  const auto& text = found->second;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), limit);
  if (error != std::errc() || end != text.data() + text.size() || limit < 1 || limit > kMaxPage) {
    return api_error(400, "invalid_parameter",
                     "limit must be a whole number from 1 to {}, not '{}'", kMaxPage, text);
  }
  return limit;
}

std::optional<int64_t> whole_number(std::string_view text) {
  int64_t value = 0;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || error != std::errc() || end != text.data() + text.size() || value < 0) {
    return std::nullopt;
  }
  return value;
}

std::string_view method_name(AuthMethod method) {
  switch (method) {
    case AuthMethod::kNone:
      return "none";
    case AuthMethod::kBearer:
      return "bearer";
    case AuthMethod::kCookie:
      return "cookie";
  }
  return "none";
}

// The cookie of a session; an empty id with Max-Age=0 removes it.
std::string session_cookie(std::string_view id, std::chrono::milliseconds lifetime) {
  return fmt::format("{}={}; Path=/; HttpOnly; SameSite=Strict; Max-Age={}", kSessionCookie, id,
                     std::chrono::duration_cast<std::chrono::seconds>(lifetime).count());
}

std::string_view content_type_of(std::string_view type) {
  if (type == "png") return "image/png";
  if (type == "svg") return "image/svg+xml";
  if (type == "html") return "text/html; charset=utf-8";
  if (type == "csv") return "text/csv; charset=utf-8";
  if (type == "json") return "application/json";
  if (type == "parquet") return "application/vnd.apache.parquet";
  if (type == "js") return "text/javascript; charset=utf-8";
  if (type == "css") return "text/css; charset=utf-8";
  if (type == "map") return "application/json";
  return "application/octet-stream";
}

// Artifacts are sandbox output, i.e. untrusted: each is its own opaque origin (CSP sandbox, no
// allow-same-origin), so a hostile chart can neither read the API nor use the user's session,
// and it may load nothing from anywhere. HTML and SVG may run their own inline scripts
// (interactive charts); nothing else may run at all.
std::string_view artifact_policy(std::string_view type) {
  if (type == "html" || type == "svg") {
    return "sandbox allow-scripts; default-src 'none'; script-src 'unsafe-inline' "
           "'unsafe-eval' blob: data:; style-src 'unsafe-inline'; img-src data: blob:; "
           "font-src data:; frame-ancestors 'self'";
  }
  return "sandbox; default-src 'none'; frame-ancestors 'self'";
}

// The UI's own pages: its scripts and styles from this server only, nothing inline, nothing
// from elsewhere; artifacts may be framed (they sandbox themselves), the page itself may not.
constexpr std::string_view kPagePolicy =
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
    "connect-src 'self'; frame-src 'self'; object-src 'none'; base-uri 'none'; "
    "form-action 'self'; frame-ancestors 'none'";

// filename="..." with anything unusual replaced, and filename*= with the name in UTF-8.
std::string content_disposition(bool download, std::string_view name) {
  auto base = name.substr(name.rfind('/') == std::string_view::npos ? 0 : name.rfind('/') + 1);
  std::string plain, encoded;
  for (unsigned char c : base) {
    const bool safe = std::isalnum(c) || c == '.' || c == '_' || c == '-';
    plain += safe ? static_cast<char>(c) : '_';
    encoded += safe ? fmt::format("{:c}", c) : fmt::format("%{:02X}", c);
  }
  return fmt::format("{}; filename=\"{}\"; filename*=UTF-8''{}", download ? "attachment" : "inline",
                     plain, encoded);
}

ApiError turn_conflict(const Error& error) {
  if (error.code == ErrorCode::kAborted) return {409, "turn_running", error.message};
  // Even the queue for sandboxes is full (answered with Retry-After).
  if (error.code == ErrorCode::kResourceExhausted) return {429, "busy", error.message};
  return from_error(error);
}

}  // namespace

ApiResult<QueryList> parse_query_list(std::string_view query) {
  auto decode = [](std::string_view text) -> std::optional<std::string> {
    std::string out;
    for (size_t i = 0; i < text.size(); ++i) {
      if (text[i] == '+') {
        out += ' ';
      } else if (text[i] == '%') {
        unsigned value = 0;
        if (i + 2 >= text.size()) return std::nullopt;
        auto [end, error] = std::from_chars(text.data() + i + 1, text.data() + i + 3, value, 16);
        if (error != std::errc() || end != text.data() + i + 3) return std::nullopt;
        out += static_cast<char>(value);
        i += 2;
      } else {
        out += text[i];
      }
    }
    return out;
  };
  QueryList parameters;
  while (!query.empty()) {
    auto end = query.find('&');
    auto pair = query.substr(0, end);
    query = end == std::string_view::npos ? std::string_view() : query.substr(end + 1);
    if (pair.empty()) continue;
    auto equals = pair.find('=');
    auto name = decode(pair.substr(0, equals));
    auto value = decode(equals == std::string_view::npos ? "" : pair.substr(equals + 1));
    if (!name || !value) {
      return api_error(400, "invalid_parameter",
                       "the query has a malformed %-escape in '{}'; escape '%' as %25", pair);
    }
    parameters.emplace_back(std::move(*name), std::move(*value));
  }
  return parameters;
}

std::map<std::string, std::string, std::less<>> query_map(const QueryList& list) {
  std::map<std::string, std::string, std::less<>> parameters;
  for (const auto& [name, value] : list)
    parameters[name] = value;  // the last of a repeated name
  return parameters;
}

ApiResult<std::map<std::string, std::string, std::less<>>> parse_query(std::string_view query) {
  auto list = parse_query_list(query);
  if (!list) return std::unexpected(list.error());
  return query_map(*list);
}

Api::Api(Services services) : services_(std::move(services)) {
  auto document = openapi_document();
  openapi_ = document ? document->dump() : "{}";
  if (!document) spdlog::error("the OpenAPI document is broken: {}", document.error().message);
}

ApiReply Api::handle(const ApiRequest& request) {
  try {
    auto reply = dispatch(request);
    if (reply) return std::move(*reply);
    Headers headers;
    if (reply.error().status == 401) {
      // A token the sign-in refused.
      headers.emplace_back("WWW-Authenticate", kBearerChallenge);
    }
    if (reply.error().status == 429) {
      // The queue for sandboxes is full: when it might not be.
      headers.emplace_back("Retry-After",
                           std::to_string(services_.manager.scheduler().retry_after().count()));
    }
    return JsonReply{reply.error().status, reply.error().body(), std::move(headers)};
  } catch (const std::exception& error) {
    spdlog::error("{} {} failed: {}", request.method, request.path, error.what());
    ApiError internal{
        500, "internal",
        fmt::format("quarry failed while answering: {}; see the server's log", error.what())};
    return JsonReply{500, internal.body(), {}};
  }
}

ApiResult<ApiReply> Api::dispatch(const ApiRequest& request) {
  if (auto checked = check_query(request, *request.route.route); !checked) {
    return std::unexpected(checked.error());
  }
  const RouteId id = request.route.route->id;
  switch (id) {
    case RouteId::kIndex:
      return page();
    case RouteId::kAsset:
      return asset(request);
    case RouteId::kHealth:
      return json({{"status", "ok"}});
    case RouteId::kReady:
      return ready(request);
    case RouteId::kOpenApi:
      return json(nlohmann::json::parse(openapi_));
    case RouteId::kInfo:
      return info(request);
    case RouteId::kSessionRead:
      return read_session(request);
    case RouteId::kSessionCreate:
      return create_session(request);
    case RouteId::kSessionDelete:
      return delete_session(request);
    case RouteId::kConversationList:
      return list_conversations(request);
    case RouteId::kConversationCreate:
      return create_conversation(request);
    case RouteId::kConversationRead:
      return read_conversation(request);
    case RouteId::kConversationDelete:
      return delete_conversation(request);
    case RouteId::kMessageCreate:
      return create_message(request);
    case RouteId::kCellCreate:
      return create_cell(request);
    case RouteId::kEvents:
      return events(request);
    case RouteId::kCancel:
      return cancel(request);
    case RouteId::kArtifactList:
      return list_artifacts(request);
    case RouteId::kArtifactRead:
      return read_artifact(request);
    case RouteId::kArtifactTable:
      return artifact_table(request);
    case RouteId::kExecList:
      return list_execs(request);
    case RouteId::kSandboxList:
      return list_sandboxes(request);
  }
  return api_error(500, "internal", "no handler for {}", request.path);
}

std::optional<int> Api::running_turn(const std::string& conversation_id) {
  auto turns = services_.history.turns(conversation_id);
  if (!turns || turns->empty() || turns->back().status != conversation::TurnStatus::kRunning) {
    return std::nullopt;
  }
  return turns->back().number;
}

ApiResult<conversation::Conversation> Api::owned(const ApiRequest& request, std::string_view id) {
  auto conversation = services_.history.conversation(id);
  if (!conversation) {
    if (conversation.error().code == ErrorCode::kNotFound) {
      return api_error(404, "not_found", "there is no conversation '{}'", id);
    }
    return std::unexpected(from_error(conversation.error()));
  }
  if (conversation->owner != request.identity.user) {
    return api_error(404, "not_found", "there is no conversation '{}'", id);
  }
  return std::move(*conversation);
}

ApiResult<ApiReply> Api::page() {
  const auto index = services_.web_dir / "index.html";
  std::error_code error;
  if (!std::filesystem::is_regular_file(index, error)) {
    return api_error(503, "ui_not_built",
                     "the web UI is not built ({} is missing): scripts/build builds it into "
                     "build/web, or set server.web_dir; the API works without it, see "
                     "/api/openapi.json",
                     index.string());
  }
  return FileReply{
      index, "text/html; charset=utf-8", {{"Content-Security-Policy", std::string(kPagePolicy)}}};
}

ApiResult<ApiReply> Api::asset(const ApiRequest& request) {
  const auto& name = request.route.params.at("file");
  auto missing = [&] { return api_error(404, "not_found", "there is no file '/assets/{}'", name); };
  // One plain name: the route gives one path segment; no hidden files, no "..".
  if (name.starts_with(".") || name.find('\\') != std::string::npos) return missing();
  const auto path = services_.web_dir / "assets" / name;
  std::error_code error;
  if (!std::filesystem::is_regular_file(std::filesystem::symlink_status(path, error))) {
    return missing();
  }
  const auto extension = path.extension().string();
  return FileReply{path,
                   std::string(content_type_of(extension.empty() ? "" : extension.substr(1))),
                   {{"Content-Security-Policy", std::string(kPagePolicy)}}};
}

Api::Readiness Api::check_readiness() {
  constexpr auto kFresh = std::chrono::seconds(1);
  auto last = [&](bool fresh_only) -> std::optional<Readiness> {
    std::lock_guard lock(readiness_mutex_);
    if (!readiness_) return std::nullopt;
    if (fresh_only && std::chrono::steady_clock::now() - readiness_->checked_at >= kFresh) {
      return std::nullopt;
    }
    return readiness_;
  };
  if (auto fresh = last(true)) return *fresh;
  std::unique_lock checking(readiness_check_mutex_, std::try_to_lock);
  if (!checking) {
    // Another probe checks now (a hung database takes its connect timeout): the last answer
    // rather than another request thread waiting; only the first check is waited for.
    if (auto earlier = last(false)) return *earlier;
    checking.lock();
    if (auto fresh = last(true)) return *fresh;
  }
  nlohmann::json checks = nlohmann::json::object();
  std::vector<std::string> problems;
  auto check = [&](std::string_view name, const Result<void>& result) {
    if (result) {
      checks[name] = "ok";
      return;
    }
    // One line, for monitors that show the reason as it is (libpq's have "\n\t" in them).
    std::string message;
    for (char c : result.error().message) {
      if (c == '\n') {
        message += "; ";
      } else if (c != '\t' || (!message.empty() && message.back() != ' ')) {
        message += c == '\t' ? ' ' : c;
      }
    }
    checks[name] = message;
    problems.push_back(fmt::format("{}: {}", name, message));
  };
  check("database", [&]() -> Result<void> {
    ASSIGN_OR_RETURN(auto target,
                     data::resolve_database(services_.config.database, services_.state_dir));
    auto reached = [&]() -> Result<void> {
      ASSIGN_OR_RETURN(auto connection,
                       data::Connection::open(target.reader, std::chrono::seconds(3)));
      RETURN_IF_ERROR(connection.exec("SELECT 1"));
      return {};
    }();
    if (!reached && target.external) {
      // Which setting names that server.
      return make_error(reached.error().code, "{} (check database.url)", reached.error().message);
    }
    return reached;
  }());
  check("history", [&]() -> Result<void> {
    conversation::ConversationQuery one;
    one.limit = 1;
    RETURN_IF_ERROR(services_.history.conversations(one));
    return {};
  }());
  check("sandboxes", [&]() -> Result<void> {
    RETURN_IF_ERROR(services_.provider.find(
        {{std::string(conversation::kInstanceLabel), services_.config.conversations.instance_id}}));
    return {};
  }());
  const std::string found = fmt::format("{}", fmt::join(problems, "; "));
  std::lock_guard lock(readiness_mutex_);
  if (found != logged_problems_) {
    if (found.empty()) {
      spdlog::info("ready again: the database, the history store and the sandboxes answer");
    } else {
      spdlog::warn("not ready: {}", found);
    }
    logged_problems_ = found;
  }
  readiness_ = Readiness{std::move(checks), std::move(problems), std::chrono::steady_clock::now()};
  return *readiness_;
}

ApiResult<ApiReply> Api::ready(const ApiRequest& request) {
  auto [checks, problems, ignored] = check_readiness();
  const std::string found = fmt::format("{}", fmt::join(problems, "; "));
  if (problems.empty()) return json({{"status", "ready"}, {"checks", checks}});
  // Anyone may ask /readyz. Where the server has users, what failed (a database's host and
  // port, a path) is told only to a signed-in caller; anyone else learns which check failed.
  std::string reason = found;
  if (services_.auth.requires_tokens() && request.identity.method == AuthMethod::kNone) {
    std::vector<std::string> failing;
    for (auto& [name, result] : checks.items()) {
      if (result == "ok") continue;
      failing.push_back(name);
      result = "failing";
    }
    reason =
        fmt::format("{} failing; the server's log says why, as does /readyz asked with a token",
                    fmt::join(failing, ", "));
  }
  return json({{"status", "unavailable"}, {"reason", reason}, {"checks", checks}}, 503);
}

ApiResult<ApiReply> Api::info(const ApiRequest& request) {
  const auto& config = services_.config;
  const auto& server = services_.info;
  nlohmann::json model = {{"available", !server.model_unavailable},
                          {"name", config.model.name},
                          {"base_url", config.model.base_url}};
  model["reason"] = server.model_unavailable ? nlohmann::json(*server.model_unavailable) : nullptr;
  const auto& resources = config.sandbox.resources;
  return json({{"version", server.version},
               {"user", request.identity.user},
               {"auth", services_.auth.requires_tokens() ? "tokens" : "none"},
               {"model", model},
               {"workers", server.workers},
               {"max_body_bytes", server.max_body},
               {"sandbox",
                {{"cpus", resources.cpus},
                 {"memory_bytes", resources.memory_bytes},
                 {"disk_bytes", resources.disk_bytes},
                 {"pids", resources.pids},
                 {"exec_timeout_ms", config.sandbox.exec_timeout.count()},
                 {"output_limit_bytes", config.sandbox.output_limit_bytes},
                 {"idle_timeout_ms", config.sandbox.idle_timeout.count()},
                 {"data_dir", config.sandbox.data_dir},
                 {"output_dir", config.sandbox.output_dir}}}});
}

ApiResult<ApiReply> Api::read_session(const ApiRequest& request) {
  const auto& identity = request.identity;
  nlohmann::json body = {{"user", identity.user}, {"method", method_name(identity.method)}};
  body["csrf_token"] = identity.method == AuthMethod::kCookie ? nlohmann::json(identity.csrf_token)
                                                              : nlohmann::json(nullptr);
  return json(std::move(body));
}

ApiResult<ApiReply> Api::create_session(const ApiRequest& request) {
  auto body = JsonBody::parse(request.body, request.content_type, {"token"});
  if (!body) return std::unexpected(body.error());
  auto token = body->string("token", 1024);
  if (!token) return std::unexpected(token.error());
  auto user = services_.auth.sign_in(*token);
  if (!user) return std::unexpected(user.error());
  auto [id, session] = services_.sessions.create(*user, *token);
  JsonReply reply = json({{"user", session.user},
                          {"method", "cookie"},
                          {"csrf_token", session.csrf_token},
                          {"expires_at", conversation::format_time(session.expires_at)}},
                         201);
  reply.headers.emplace_back("Set-Cookie", session_cookie(id, services_.sessions.lifetime()));
  return reply;
}

ApiResult<ApiReply> Api::delete_session(const ApiRequest& request) {
  if (request.identity.method == AuthMethod::kCookie) {
    services_.sessions.remove(request.identity.session_id);
  }
  JsonReply reply{204, nullptr, {}};
  reply.headers.emplace_back("Set-Cookie", session_cookie("", std::chrono::milliseconds(0)));
  return reply;
}

ApiResult<ApiReply> Api::list_conversations(const ApiRequest& request) {
  auto limit = page_size(request);
  if (!limit) return std::unexpected(limit.error());
  conversation::ConversationQuery query;
  query.owner = request.identity.user;
  query.limit = *limit + 1;  // one more tells whether there is a next page
  if (auto cursor = request.query.find("cursor"); cursor != request.query.end()) {
    // "<updated_at ms>.<id>" of the last conversation of the previous page.
    const auto& text = cursor->second;
    auto dot = text.find('.');
    auto ms = whole_number(std::string_view(text).substr(0, dot));
    // Up to the year 9999: a time beyond the clock's range would wrap to another page.
    constexpr int64_t kLatestMs = 253'402'300'799'999;
    if (dot == std::string::npos || !ms || *ms < 0 || *ms > kLatestMs || dot + 1 == text.size()) {
      return api_error(400, "invalid_parameter",
                       "cursor '{}' is not one this server gave; use the next_cursor of the "
                       "previous page",
                       text);
    }
    query.after = std::pair{from_unix_ms(*ms), text.substr(dot + 1)};
  }
  auto list = services_.history.conversations(query);
  if (!list) return std::unexpected(from_error(list.error()));
  nlohmann::json next = nullptr;
  if (list->size() > *limit) {
    list->resize(*limit);
    next = fmt::format("{}.{}", to_unix_ms(list->back().updated_at), list->back().id);
  }
  nlohmann::json items = nlohmann::json::array();
  for (const auto& conversation : *list)
    items.push_back(conversation::to_json(conversation));
  return json({{"conversations", items}, {"next_cursor", next}});
}

namespace {

// A conversation's `network`: {"mode": "none"}, or {"mode": "allowlist", "allow": [...]} with
// every domain covered by the server's allowlist. Narrower only: the server's configuration
// is the most any conversation gets.
ApiResult<NetworkPolicy> narrowed_network(const nlohmann::json& body, const NetworkPolicy& server) {
  for (const auto& [key, value] : body.items()) {
    if (key != "mode" && key != "allow") {
      return api_error(400, "invalid_field", "'network.{}' is not a field (use mode and allow)",
                       key);
    }
  }
  const auto mode = body.find("mode");
  if (mode == body.end() || !mode->is_string()) {
    return api_error(400, "invalid_field", "'network.mode' must be \"none\" or \"allowlist\"");
  }
  const auto allow = body.find("allow");
  if (*mode == "none") {
    if (allow != body.end()) {
      return api_error(400, "invalid_field", "'network.allow' is only for mode \"allowlist\"");
    }
    return NetworkPolicy{};
  }
  if (*mode != "allowlist") {
    return api_error(400, "invalid_field",
                     "'network.mode' must be \"none\" or \"allowlist\", not {}", mode->dump());
  }
  if (server.mode != NetworkMode::kAllowlist) {
    return api_error(400, "invalid_field",
                     "this server's sandboxes have no network (sandbox.network.mode: none), so a "
                     "conversation cannot have any; leave 'network' out");
  }
  if (allow == body.end() || !allow->is_array() || allow->empty()) {
    return api_error(400, "invalid_field",
                     "'network.allow' must be a list of at least one domain, within the server's "
                     "({})",
                     fmt::join(server.allow, ", "));
  }
  std::vector<std::string> wanted;
  for (const auto& entry : *allow) {
    if (!entry.is_string()) {
      return api_error(400, "invalid_field", "'network.allow' holds {}, not a domain",
                       entry.dump());
    }
    wanted.push_back(entry.get<std::string>());
  }
  auto narrowed = narrow_allowlist(server, wanted);
  if (!narrowed) {
    return api_error(400, "invalid_field", "'network.allow': {}", narrowed.error().message);
  }
  return std::move(*narrowed);
}

}  // namespace

ApiResult<ApiReply> Api::create_conversation(const ApiRequest& request) {
  auto body = JsonBody::parse(request.body, request.content_type, {"title", "network", "packages"});
  if (!body) return std::unexpected(body.error());
  auto title = body->optional_string("title", 200);
  if (!title) return std::unexpected(title.error());
  auto network_field = body->optional_object("network");
  if (!network_field) return std::unexpected(network_field.error());
  std::optional<NetworkPolicy> network;
  if (*network_field) {
    auto narrowed = narrowed_network(**network_field, services_.config.sandbox.network);
    if (!narrowed) return std::unexpected(narrowed.error());
    network = std::move(*narrowed);
  }
  // Installed into each sandbox of the conversation (resolved and installed once per set, then
  // started from its snapshot).
  auto packages = body->string_list("packages", 32, 200);
  if (!packages) return std::unexpected(packages.error());
  for (size_t index = 0; index < packages->size(); ++index) {
    if (!valid_package_requirement((*packages)[index])) {
      return api_error(400, "invalid_field",
                       "'packages[{}]': '{}' is not a package requirement (e.g. tabulate or "
                       "tabulate==0.9.0)",
                       index, (*packages)[index]);
    }
  }
  auto created = services_.history.create_conversation(title->value_or(""), request.identity.user,
                                                       network, *packages);
  if (!created) return std::unexpected(from_error(created.error()));
  JsonReply reply = json(conversation::to_json(*created), 201);
  reply.headers.emplace_back("Location", fmt::format("/api/v1/conversations/{}", created->id));
  return reply;
}

ApiResult<ApiReply> Api::read_conversation(const ApiRequest& request) {
  auto conversation = owned(request, request.route.params.at("id"));
  if (!conversation) return std::unexpected(conversation.error());
  auto document = conversation::conversation_document(services_.history, conversation->id);
  if (!document) return std::unexpected(from_error(document.error()));
  for (auto& artifact : (*document)["artifacts"]) {
    artifact["url"] = artifact_url(artifact["id"].get<int64_t>());
  }
  return json(std::move(*document));
}

ApiResult<ApiReply> Api::delete_conversation(const ApiRequest& request) {
  auto conversation = owned(request, request.route.params.at("id"));
  if (!conversation) return std::unexpected(conversation.error());
  if (auto deleted = services_.manager.delete_conversation(conversation->id); !deleted) {
    if (deleted.error().code == ErrorCode::kAborted) {
      return api_error(409, "turn_running",
                       "conversation {} has a turn running; cancel it (POST "
                       "/api/v1/conversations/{}/cancel) or wait for it, then delete",
                       conversation->id, conversation->id);
    }
    return std::unexpected(from_error(deleted.error()));
  }
  if (auto removed =
          conversation::remove_artifacts(services_.state_dir / "artifacts", conversation->id);
      !removed) {
    spdlog::warn("conversation {} was deleted but its artifact files were not: {}",
                 conversation->id, removed.error().message);
  }
  return JsonReply{204, nullptr, {}};
}

ApiResult<ApiReply> Api::create_message(const ApiRequest& request) {
  auto conversation = owned(request, request.route.params.at("id"));
  if (!conversation) return std::unexpected(conversation.error());
  auto body = JsonBody::parse(request.body, request.content_type, {"content"});
  if (!body) return std::unexpected(body.error());
  auto content = body->string("content", kMaxQuestionBytes);
  if (!content) return std::unexpected(content.error());
  if (content->find_first_not_of(" \t\r\n") == std::string::npos) {
    return api_error(400, "invalid_field", "'content' is empty; write a question");
  }
  if (services_.info.model_unavailable) {
    return api_error(503, "model_unavailable",
                     "questions cannot be answered: {}; cells (POST .../cells) still run",
                     *services_.info.model_unavailable);
  }
  auto turn = services_.turns.ask(conversation->id, std::move(*content));
  if (!turn) return std::unexpected(turn_conflict(turn.error()));
  return StreamReply{conversation->id, {*turn, 0}, false};
}

ApiResult<ApiReply> Api::create_cell(const ApiRequest& request) {
  auto conversation = owned(request, request.route.params.at("id"));
  if (!conversation) return std::unexpected(conversation.error());
  auto body = JsonBody::parse(request.body, request.content_type, {"kind", "code", "filename"});
  if (!body) return std::unexpected(body.error());
  auto kind_name = body->string("kind", 64);
  if (!kind_name) return std::unexpected(kind_name.error());
  auto code = body->string("code", kMaxCellBytes);
  if (!code) return std::unexpected(code.error());
  auto filename = body->optional_string("filename", 200);
  if (!filename) return std::unexpected(filename.error());
  auto kind = agent::cell_kind_from(*kind_name);
  if (!kind) return api_error(400, "invalid_field", "{}", kind.error().message);
  agent::Cell cell{*kind, std::move(*code), filename->value_or("")};
  if (auto checked = agent::check_cell(cell); !checked) {
    return api_error(400, "invalid_field", "{}", checked.error().message);
  }
  auto turn = services_.turns.run_cell(conversation->id, std::move(cell));
  if (!turn) return std::unexpected(turn_conflict(turn.error()));
  return StreamReply{conversation->id, {*turn, 0}, false};
}

ApiResult<ApiReply> Api::events(const ApiRequest& request) {
  auto conversation = owned(request, request.route.params.at("id"));
  if (!conversation) return std::unexpected(conversation.error());
  std::string after = request.last_event_id;  // a reconnecting EventSource's own
  if (after.empty()) {
    if (auto found = request.query.find("after"); found != request.query.end()) {
      after = found->second;
    }
  }
  StreamReply reply{conversation->id, {}, true};
  if (!after.empty()) {
    auto id = parse_event_id(after);
    if (!id) {
      return api_error(400, "invalid_event_id",
                       "'{}' is not an event id; event ids look like 3-17 (turn 3, event 17); "
                       "use 3-0 to replay turn 3 from its start",
                       after);
    }
    reply.after = *id;
  } else if (auto live = services_.hub.live_turn(conversation->id)) {
    reply.after = {*live, 0};  // the running turn from its start
  } else if (auto elsewhere = running_turn(conversation->id)) {
    reply.after = {*elsewhere, 0};  // the turn another server runs, from its start
  } else {
    reply.after = {conversation->turns, std::numeric_limits<int64_t>::max()};  // what comes next
  }
  return reply;
}

Result<int> Api::running_elsewhere(const std::string& conversation_id) {
  if (!services_.history.registry()) return 0;
  ASSIGN_OR_RETURN(auto turns, services_.history.turns(conversation_id));
  if (turns.empty() || turns.back().status != conversation::TurnStatus::kRunning) return 0;
  return turns.back().number;
}

ApiResult<ApiReply> Api::cancel(const ApiRequest& request) {
  auto conversation = owned(request, request.route.params.at("id"));
  if (!conversation) return std::unexpected(conversation.error());
  auto body = JsonBody::parse(request.body, request.content_type, {});
  if (!body) return std::unexpected(body.error());
  auto turn = services_.turns.cancel(conversation->id, "cancelled by the user");
  if (!turn && turn.error().code == ErrorCode::kNotFound) {
    // Not running here: on a shared history it may run on another server, which is asked.
    turn = running_elsewhere(conversation->id);
    if (turn && *turn > 0) {
      if (auto asked = services_.history.registry()->request_cancel(conversation->id, *turn);
          !asked) {
        return std::unexpected(from_error(asked.error()));
      }
    } else if (turn) {
      return api_error(409, "no_turn_running", "conversation {} has no turn running to cancel",
                       conversation->id);
    }
  }
  if (!turn) return std::unexpected(from_error(turn.error()));
  return json({{"turn", *turn}, {"status", "cancelling"}}, 202);
}

ApiResult<ApiReply> Api::list_artifacts(const ApiRequest& request) {
  auto conversation = owned(request, request.route.params.at("id"));
  if (!conversation) return std::unexpected(conversation.error());
  auto artifacts = services_.history.artifacts(conversation->id);
  if (!artifacts) return std::unexpected(from_error(artifacts.error()));
  nlohmann::json items = nlohmann::json::array();
  for (const auto& artifact : *artifacts)
    items.push_back(artifact_json(artifact));
  return json({{"artifacts", items}});
}

ApiResult<Api::StoredArtifact> Api::owned_artifact(const ApiRequest& request,
                                                   std::string_view text) {
  auto not_found = [&] { return api_error(404, "not_found", "there is no artifact '{}'", text); };
  auto id = whole_number(text);
  if (!id) return not_found();
  auto found = services_.history.artifact(*id);
  if (!found) {
    if (found.error().code == ErrorCode::kNotFound) return not_found();
    return std::unexpected(from_error(found.error()));
  }
  auto& [conversation_id, artifact] = *found;
  if (!owned(request, conversation_id)) return not_found();
  auto file = conversation::artifact_file(services_.state_dir / "artifacts", services_.history,
                                          conversation_id, artifact);
  if (!file) return std::unexpected(from_error(file.error()));
  if (!*file) {
    return api_error(404, "not_found",
                     "artifact {} ({}) is recorded, but its file is no longer stored", *id,
                     artifact.name);
  }
  return StoredArtifact{std::move(artifact), std::move(**file)};
}

ApiResult<ApiReply> Api::read_artifact(const ApiRequest& request) {
  auto stored = owned_artifact(request, request.route.params.at("artifact_id"));
  if (!stored) return std::unexpected(stored.error());
  const auto& artifact = stored->record;
  bool attachment = false;
  if (auto download = request.query.find("download"); download != request.query.end()) {
    if (download->second != "0" && download->second != "1" && !download->second.empty()) {
      return api_error(400, "invalid_parameter",
                       "'download' is '{}'; use download=1 to save the file, or leave it out",
                       download->second);
    }
    attachment = download->second != "0";
  }
  return FileReply{stored->file,
                   std::string(content_type_of(artifact.type)),
                   {{"Content-Security-Policy", std::string(artifact_policy(artifact.type))},
                    {"Content-Disposition", content_disposition(attachment, artifact.name)}}};
}

ApiResult<ApiReply> Api::artifact_table(const ApiRequest& request) {
  auto stored = owned_artifact(request, request.route.params.at("artifact_id"));
  if (!stored) return std::unexpected(stored.error());
  const auto& artifact = stored->record;
  if (artifact.type != "csv" && artifact.type != "parquet") {
    return api_error(400, "not_a_table", "artifact {} ({}) is {}, not a table (csv or parquet)",
                     artifact.id, artifact.name, artifact.type);
  }
  data::TablePageRequest page;
  auto limit = page_size(request);
  if (!limit) return std::unexpected(limit.error());
  page.limit = *limit;
  if (auto offset = request.query.find("offset"); offset != request.query.end()) {
    auto value = whole_number(offset->second);
    if (!value) {
      return api_error(400, "invalid_parameter", "offset must be a whole number, not '{}'",
                       offset->second);
    }
    page.offset = static_cast<uint64_t>(*value);
  }
  if (auto sort = request.query.find("sort"); sort != request.query.end()) {
    page.sort = sort->second;
  }
  if (auto order = request.query.find("order"); order != request.query.end()) {
    if (order->second != "asc" && order->second != "desc") {
      return api_error(400, "invalid_parameter", "order must be asc or desc, not '{}'",
                       order->second);
    }
    page.descending = order->second == "desc";
  }
  auto table = data::read_table_page(stored->file, artifact.type, page);
  if (!table) {
    if (table.error().code == ErrorCode::kInvalidArgument) {
      return api_error(400, "invalid_parameter", "{}", table.error().message);
    }
    if (table.error().code == ErrorCode::kFailedPrecondition) {
      return api_error(422, "unreadable_table", "artifact {} ({}): {}", artifact.id, artifact.name,
                       table.error().message);
    }
    if (table.error().code == ErrorCode::kResourceExhausted) {
      return api_error(422, "table_too_large", "artifact {} ({}): {}", artifact.id, artifact.name,
                       table.error().message);
    }
    return std::unexpected(from_error(table.error()));
  }
  return json(std::move(*table));
}

ApiResult<ApiReply> Api::list_execs(const ApiRequest& request) {
  auto limit = page_size(request);
  if (!limit) return std::unexpected(limit.error());
  conversation::ExecQuery query;
  query.owner = request.identity.user;
  if (auto found = request.query.find("conversation"); found != request.query.end()) {
    auto conversation = owned(request, found->second);
    if (!conversation) return std::unexpected(conversation.error());
    query.conversation_id = conversation->id;
  }
  auto totals = services_.history.exec_totals(query);
  if (!totals) return std::unexpected(from_error(totals.error()));
  if (auto cursor = request.query.find("cursor"); cursor != request.query.end()) {
    auto before = whole_number(cursor->second);
    if (!before) {
      return api_error(400, "invalid_parameter",
                       "cursor '{}' is not one this server gave; use the next_cursor of the "
                       "previous page",
                       cursor->second);
    }
    query.before_id = *before;
  }
  query.limit = *limit + 1;
  auto execs = services_.history.find_execs(query);
  if (!execs) return std::unexpected(from_error(execs.error()));
  nlohmann::json next = nullptr;
  if (execs->size() > *limit) {
    execs->resize(*limit);
    next = std::to_string(execs->back().second.id);
  }
  nlohmann::json items = nlohmann::json::array();
  for (const auto& [conversation_id, exec] : *execs) {
    auto item = conversation::to_json(exec, false);
    item["conversation_id"] = conversation_id;
    items.push_back(std::move(item));
  }
  return json(
      {{"execs", items}, {"totals", conversation::to_json(*totals)}, {"next_cursor", next}});
}

ApiResult<ApiReply> Api::list_sandboxes(const ApiRequest& request) {
  auto all = services_.history.sandbox_references();
  if (!all) return std::unexpected(from_error(all.error()));
  auto live = [](const conversation::SandboxReference& reference) {
    auto state = conversation::lifecycle_from_string(reference.state);
    return state && (conversation::holds_sandbox(*state) ||
                     *state == conversation::SandboxLifecycle::kStarting);
  };
  nlohmann::json everyone = nlohmann::json::object();
  for (const auto& [conversation_id, reference] : *all) {
    if (!live(reference)) continue;
    everyone[reference.state] = everyone.value(reference.state, 0) + 1;
  }
  auto own = services_.history.sandbox_references(request.identity.user);
  if (!own) return std::unexpected(from_error(own.error()));
  nlohmann::json mine = nlohmann::json::object();
  nlohmann::json items = nlohmann::json::array();
  for (const auto& [conversation_id, reference] : *own) {
    if (!live(reference)) continue;
    mine[reference.state] = mine.value(reference.state, 0) + 1;
    auto item = conversation::to_json(reference);
    item.erase("files");
    item["conversation_id"] = conversation_id;
    items.push_back(std::move(item));
  }
  return json({{"sandboxes", items},
               {"by_state", mine},
               {"all_by_state", everyone},
               {"capacity", capacity_json(services_.manager.scheduler().stats(true))}});
}

}  // namespace quarry::server

#include "sandbox/daytona/daytona_client.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <mutex>
#include <random>
#include <thread>

#include "common/file_util.h"
#include "common/json.h"
#include "common/multipart.h"
#include "common/units.h"

namespace quarry::sandbox::daytona {
namespace {

// An exec's answer comes this long after its timeout at the latest (the SDK waits as long).
constexpr auto kExecMargin = std::chrono::seconds(5);
constexpr size_t kPageLimit = 100;
constexpr size_t kMaxPages = 1000;

double random01() {
  thread_local std::mt19937_64 random{std::random_device{}()};
  return std::uniform_real_distribution<double>(0.0, 1.0)(random);
}

ErrorCode code_of(int status) {
  switch (status) {
    case 400:
    case 422:
      return ErrorCode::kInvalidArgument;
    case 401:
    case 403:
      return ErrorCode::kPermissionDenied;
    case 404:
      return ErrorCode::kNotFound;
    case 408:
      return ErrorCode::kDeadlineExceeded;
    case 409:
      return ErrorCode::kAborted;
    case 429:
      return ErrorCode::kResourceExhausted;
    default:
      return status >= 500 ? ErrorCode::kUnavailable : ErrorCode::kInternal;
  }
}

// Worth sending again: the server (or a proxy before it) did not do it, or may do it later.
bool transient(int status) {
  return status == 429 || status == 502 || status == 503 || status == 504;
}

}  // namespace

std::string error_message(int status, std::string_view body) {
  auto json = parse_json_or_discarded(body);
  if (json.is_object()) {
    auto message = json.find("message");
    if (message != json.end() && message->is_string()) return message->get<std::string>();
    // Validation errors list each problem.
    if (message != json.end() && message->is_array()) {
      std::string joined;
      for (const auto& item : *message) {
        if (!joined.empty()) joined += "; ";
        joined += item.is_string() ? item.get<std::string>() : item.dump();
      }
      return joined;
    }
    auto error = json.find("error");
    if (error != json.end() && error->is_string()) return error->get<std::string>();
  }
  if (body.empty()) return fmt::format("HTTP {} with an empty body", status);
  std::string start(body.substr(0, 200));
  for (char& c : start) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  return start;
}

DaytonaClient::DaytonaClient(ClientOptions options, HttpClient http)
    : options_(std::move(options)), http_(std::move(http)) {}

Result<DaytonaClient> DaytonaClient::create(ClientOptions options) {
  if (options.api_key.empty()) {
    return make_error(ErrorCode::kInvalidArgument, "the Daytona API key is empty");
  }
  // The CA file is read now, so a bad one fails at start and not at the first sandbox.
  ASSIGN_OR_RETURN(auto http, HttpClient::create({.connect_timeout = options.connect_timeout,
                                                  .timeout = options.request_timeout,
                                                  .ca_file = options.ca_file}));
  return DaytonaClient(std::move(options), std::move(http));
}

Result<HttpResponse> DaytonaClient::send(const Call& call,
                                         std::initializer_list<int> expected) const {
  HttpRequest request;
  request.method = call.method;
  request.url = *call.base;
  request.target = call.base->target(call.path);
  request.headers = {{"Authorization", "Bearer " + options_.api_key},
                     {"Accept", "application/json"},
                     {"X-Daytona-Source", "quarry"}};
  if (!call.content_type.empty()) request.headers.push_back({"Content-Type", call.content_type});
  request.body = call.body;
  request.timeout = call.timeout;
  request.max_body_bytes = call.max_body;
  // Where the call went, for messages: never with the key.
  const std::string where = fmt::format(
      "{} {}", call.method, call.base->to_string() + call.path.substr(0, call.path.find('?')));
  for (uint32_t attempt = 0;; ++attempt) {
    auto response = http_.send(request, {}, call.cancel_fd);
    std::optional<Duration> wait;
    Error failure;
    if (!response) {
      // A broken connection: the server may have done it. Only calls that may be repeated are.
      failure = response.error().with_context(fmt::format("daytona: {}", where));
      // A hung server counts as one too: the call is cut at its deadline and sent again.
      const ErrorCode code = response.error().code;
      if (!call.retry ||
          (code != ErrorCode::kUnavailable && code != ErrorCode::kDeadlineExceeded)) {
        return std::unexpected(std::move(failure));
      }
    } else {
      const int status = response->status;
      if (status < 400 || std::find(expected.begin(), expected.end(), status) != expected.end()) {
        return response;
      }
      failure = Error{code_of(status), fmt::format("daytona: {}: {} {}", where, status,
                                                   error_message(status, response->body))};
      // 429: not done, by definition; a 502 with an empty body: the proxy could not reach the
      // sandbox's daemon (Daytona's toolbox does that when a sandbox is busy or moving).
      const bool not_done = status == 429 || (status == 502 && response->body.empty());
      if (!transient(status) || (!call.retry && !not_done))
        return std::unexpected(std::move(failure));
      if (status == 429) {
        wait = parse_retry_after(response->header("Retry-After"), std::chrono::system_clock::now());
      }
    }
    if (attempt >= options_.max_retries) {
      return std::unexpected(
          failure.with_context(fmt::format("gave up after {} attempts", attempt + 1)));
    }
    const Duration delay = wait ? std::min<Duration>(*wait, std::chrono::seconds(60))
                                : backoff_delay(attempt + 1, random01(), options_.backoff);
    spdlog::debug("{}; trying again in {} ms", failure.message,
                  std::chrono::duration_cast<std::chrono::milliseconds>(delay).count());
    // The pause before the next attempt ends early, and the call with it, on a cancel.
    if (signalled_within(call.cancel_fd, std::chrono::ceil<std::chrono::milliseconds>(delay))) {
      return make_error(ErrorCode::kCancelled, "daytona: {}: cancelled", where);
    }
  }
}

Result<nlohmann::json> DaytonaClient::send_json(const Call& call) const {
  ASSIGN_OR_RETURN(auto response, send(call));
  if (response.body.empty()) return nlohmann::json();
  auto json = parse_json_or_discarded(response.body);
  if (json.is_discarded()) {
    return make_error(ErrorCode::kInternal, "daytona: {} {}: the answer is not JSON: {}",
                      call.method, call.path, error_message(response.status, response.body));
  }
  return json;
}

Result<nlohmann::json> DaytonaClient::create_sandbox(const nlohmann::json& body) const {
  return send_json({.method = "POST",
                    .base = &options_.api_url,
                    .path = "/sandbox",
                    .body = body.dump(),
                    .content_type = "application/json",
                    .retry = false});
}

Result<nlohmann::json> DaytonaClient::get_sandbox(std::string_view id) const {
  return send_json(
      {.method = "GET", .base = &options_.api_url, .path = "/sandbox/" + percent_encode(id)});
}

Result<std::vector<nlohmann::json>> DaytonaClient::list_sandboxes(
    const std::map<std::string, std::string>& labels) const {
  const std::string filter = percent_encode(nlohmann::json(labels).dump());
  std::vector<nlohmann::json> sandboxes;
  std::string cursor;
  for (size_t page = 0; page < kMaxPages; ++page) {
    std::string path = fmt::format("/sandbox?limit={}&labels={}", kPageLimit, filter);
    if (!cursor.empty()) path += "&cursor=" + percent_encode(cursor);
    ASSIGN_OR_RETURN(auto answer,
                     send_json({.method = "GET", .base = &options_.api_url, .path = path}));
    if (answer.is_array()) {  // before Daytona 0.180: every sandbox at once
      for (auto& item : answer)
        sandboxes.push_back(std::move(item));
      return sandboxes;
    }
    auto items = answer.find("items");
    if (!answer.is_object() || items == answer.end() || !items->is_array()) {
      return make_error(ErrorCode::kInternal,
                        "daytona: GET /sandbox answered without an 'items' list");
    }
    for (auto& item : *items)
      sandboxes.push_back(std::move(item));
    auto next = answer.find("nextCursor");
    if (next == answer.end() || !next->is_string() || next->get<std::string>().empty()) {
      return sandboxes;
    }
    cursor = next->get<std::string>();
  }
  return make_error(ErrorCode::kInternal, "daytona: GET /sandbox gave more than {} pages",
                    kMaxPages);
}

Result<void> DaytonaClient::delete_sandbox(std::string_view id) const {
  ASSIGN_OR_RETURN(auto response, send({.method = "DELETE",
                                        .base = &options_.api_url,
                                        .path = "/sandbox/" + percent_encode(id)}));
  (void)response;
  return {};
}

Result<Executed> DaytonaClient::execute(const Url& toolbox, std::string_view id,
                                        std::string_view command, std::string_view cwd,
                                        const std::map<std::string, std::string>& envs,
                                        int timeout_seconds, Duration deadline) const {
  nlohmann::json body = {{"command", command}};
  if (!cwd.empty()) body["cwd"] = cwd;
  if (!envs.empty()) body["envs"] = envs;
  if (timeout_seconds > 0) body["timeout"] = timeout_seconds;
  const Duration timeout = deadline.count() > 0 ? deadline
                           : timeout_seconds > 0
                               ? Duration(std::chrono::seconds(timeout_seconds)) + kExecMargin
                               : options_.request_timeout;
  ASSIGN_OR_RETURN(auto response,
                   send({.method = "POST",
                         .base = &toolbox,
                         .path = fmt::format("/{}/process/execute", percent_encode(id)),
                         .body = body.dump(),
                         .content_type = "application/json",
                         .timeout = timeout,
                         .retry = false},
                        {408}));
  if (response.status == 408) return Executed{.exit_code = -1, .result = "", .timed_out = true};
  auto json = parse_json_or_discarded(response.body);
  if (!json.is_object()) {
    return make_error(ErrorCode::kInternal, "daytona: process/execute answered no JSON object: {}",
                      error_message(response.status, response.body));
  }
  Executed executed;
  // The SDK reads `code` when `exitCode` is missing.
  auto code = json.contains("exitCode") ? json["exitCode"] : json.value("code", nlohmann::json());
  if (!code.is_number_integer()) {
    return make_error(ErrorCode::kInternal, "daytona: process/execute answered no exit code");
  }
  executed.exit_code = code.get<int>();
  executed.result = json.value("result", "");
  return executed;
}

Result<void> DaytonaClient::upload(const Url& toolbox, std::string_view id, std::string_view path,
                                   std::string data, int cancel_fd) const {
  const std::vector<OutPart> parts = {
      {.name = "files[0].path", .filename = "", .content_type = "", .data = std::string(path)},
      {.name = "files[0].file",
       .filename = std::string(path.substr(path.rfind('/') + 1)),
       .content_type = "application/octet-stream",
       .data = std::move(data)}};
  auto body = write_multipart(parts);
  ASSIGN_OR_RETURN(auto response,
                   send({.method = "POST",
                         .base = &toolbox,
                         .path = fmt::format("/{}/files/bulk-upload", percent_encode(id)),
                         .body = std::move(body.body),
                         .content_type = std::move(body.content_type),
                         .cancel_fd = cancel_fd}));
  (void)response;
  return {};
}

Result<std::string> DaytonaClient::download(const Url& toolbox, std::string_view id,
                                            std::string_view path, uint64_t max_bytes,
                                            int cancel_fd) const {
  // Room for the part's boundary and headers besides the file.
  constexpr uint64_t kFraming = 64 * 1024;
  auto response = send({.method = "POST",
                        .base = &toolbox,
                        .path = fmt::format("/{}/files/bulk-download", percent_encode(id)),
                        .body = nlohmann::json{{"paths", {std::string(path)}}}.dump(),
                        .content_type = "application/json",
                        .max_body = max_bytes + kFraming,
                        .cancel_fd = cancel_fd});
  if (!response && response.error().code == ErrorCode::kResourceExhausted) {
    return make_error(ErrorCode::kResourceExhausted, "'{}' is larger than {}", path,
                      format_size(max_bytes));
  }
  if (!response) return std::unexpected(response.error());
  const std::string where = fmt::format("daytona: downloading '{}'", path);
  ASSIGN_OR_RETURN(auto boundary,
                   with_context(multipart_boundary(response->header("Content-Type")), where));
  ASSIGN_OR_RETURN(auto parts, with_context(parse_multipart(response->body, boundary), where));
  for (const auto& part : parts) {
    if (part.filename.value_or("") != path) continue;
    if (part.name == "file") {
      if (part.data.size() > max_bytes) {
        return make_error(ErrorCode::kResourceExhausted, "'{}' is larger than {}", path,
                          format_size(max_bytes));
      }
      return std::string(part.data);
    }
    if (part.name == "error") {
      auto error = parse_json_or_discarded(part.data);
      int status = 500;
      if (error.is_object() && error.contains("statusCode") &&
          error["statusCode"].is_number_integer()) {
        status = error["statusCode"].get<int>();
      }
      return make_error(code_of(status), "{}: {} {}", where, status,
                        error_message(status, part.data));
    }
  }
  return make_error(ErrorCode::kInternal, "{}: the answer has no part for the file", where);
}

Result<nlohmann::json> DaytonaClient::list_files(const Url& toolbox, std::string_view id,
                                                 std::string_view path) const {
  return send_json(
      {.method = "GET",
       .base = &toolbox,
       .path = fmt::format("/{}/files?path={}", percent_encode(id), percent_encode(path))});
}

Result<void> DaytonaClient::create_folder(const Url& toolbox, std::string_view id,
                                          std::string_view path, std::string_view mode) const {
  ASSIGN_OR_RETURN(auto response,
                   send({.method = "POST",
                         .base = &toolbox,
                         .path = fmt::format("/{}/files/folder?path={}&mode={}", percent_encode(id),
                                             percent_encode(path), mode)}));
  (void)response;
  return {};
}

}  // namespace quarry::sandbox::daytona

#include "server/daytona/daytona_api.h"

#include <fmt/chrono.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <array>
#include <boost/beast/http/status.hpp>
#include <charconv>
#include <cmath>
#include <spanstream>
#include <sstream>

#include "common/json.h"
#include "common/multipart.h"
#include "common/text.h"
#include "common/units.h"
#include "config/allowlist.h"
#include "conversation/history_json.h"
#include "server/router.h"

namespace quarry::server::daytona {
namespace {

constexpr std::string_view kApi = "/daytona/api";
constexpr std::string_view kToolbox = "/daytona/toolbox";
// The daemon's name for itself in its errors: with a code such as FILE_NOT_FOUND, the SDK raises
// its precise error class (DaytonaFileNotFoundError).
constexpr std::string_view kDaemonSource = "DAYTONA_DAEMON";
// The image a buildInfo may name: this server's own (quarry builds no images from Dockerfiles).
constexpr std::string_view kImageName = "quarry";
constexpr size_t kDefaultPage = 100;
constexpr size_t kMaxPage = 200;
constexpr size_t kMaxLabels = 64;
constexpr size_t kMaxEnv = 256;
constexpr size_t kMaxCommandBytes = 1 << 20;

enum class Op {
  kCreate,
  kList,
  kRead,
  kDelete,
  kStart,
  kStop,
  kLabels,
  kInterval,
  kToolboxUrl,
  kExecute,
  kUpload,
  kBulkDownload,
  kDownload,
  kListFiles,
  kDeleteFile,
  kFolder,
  kHomeDir,
};

struct DaytonaRoute {
  std::string_view method;
  std::string_view pattern;
  Op op;
};

constexpr std::array kRoutes = {
    DaytonaRoute{"POST", "/daytona/api/sandbox", Op::kCreate},
    DaytonaRoute{"GET", "/daytona/api/sandbox", Op::kList},
    DaytonaRoute{"GET", "/daytona/api/sandbox/{id}", Op::kRead},
    DaytonaRoute{"DELETE", "/daytona/api/sandbox/{id}", Op::kDelete},
    DaytonaRoute{"POST", "/daytona/api/sandbox/{id}/start", Op::kStart},
    DaytonaRoute{"POST", "/daytona/api/sandbox/{id}/stop", Op::kStop},
    DaytonaRoute{"PUT", "/daytona/api/sandbox/{id}/labels", Op::kLabels},
    DaytonaRoute{"POST", "/daytona/api/sandbox/{id}/{which}/{minutes}", Op::kInterval},
    DaytonaRoute{"GET", "/daytona/api/sandbox/{id}/toolbox-proxy-url", Op::kToolboxUrl},
    DaytonaRoute{"POST", "/daytona/toolbox/{id}/process/execute", Op::kExecute},
    DaytonaRoute{"POST", "/daytona/toolbox/{id}/files/bulk-upload", Op::kUpload},
    DaytonaRoute{"POST", "/daytona/toolbox/{id}/files/bulk-download", Op::kBulkDownload},
    DaytonaRoute{"GET", "/daytona/toolbox/{id}/files/download", Op::kDownload},
    DaytonaRoute{"GET", "/daytona/toolbox/{id}/files", Op::kListFiles},
    DaytonaRoute{"DELETE", "/daytona/toolbox/{id}/files", Op::kDeleteFile},
    DaytonaRoute{"POST", "/daytona/toolbox/{id}/files/folder", Op::kFolder},
    DaytonaRoute{"GET", "/daytona/toolbox/{id}/user-home-dir", Op::kHomeDir},
    DaytonaRoute{"GET", "/daytona/toolbox/{id}/work-dir", Op::kHomeDir},
};

JsonReply json(nlohmann::json body, int status = 200) {
  return JsonReply{status, std::move(body), {}};
}

std::string now_text() {
  return conversation::format_time(std::chrono::system_clock::now());
}

// The daemon's code for a status, where a handler named none.
std::string_view daemon_code(int status) {
  switch (status) {
    case 400:
      return "BAD_REQUEST";
    case 401:
      return "UNAUTHORIZED";
    case 403:
      return "FORBIDDEN";
    case 404:
      return "NOT_FOUND";
    case 408:
      return "REQUEST_TIMEOUT";
    case 409:
      return "CONFLICT";
    case 410:
      return "GONE";
    case 422:
      return "UNPROCESSABLE_ENTITY";
  }
  return "INTERNAL_SERVER_ERROR";
}

bool is_daemon_code(std::string_view code) {
  return !code.empty() && std::all_of(code.begin(), code.end(),
                                      [](char c) { return (c >= 'A' && c <= 'Z') || c == '_'; });
}

// A Daytona error: the status and its message (Daytona's own wording where it has one). `code`
// is the daemon's (FILE_NOT_FOUND) for the toolbox, empty for the main API.
std::unexpected<ApiError> refuse(int status, std::string message, std::string code = {}) {
  return std::unexpected(ApiError{status, std::move(code), std::move(message)});
}

// Status and message of an error from the rooms below, as Daytona would answer it.
std::unexpected<ApiError> refuse(const Error& error, std::string code = {}) {
  ApiError mapped = from_error(error);
  if (mapped.status == 409 && error.code == ErrorCode::kFailedPrecondition) mapped.status = 400;
  return refuse(mapped.status, error.message, std::move(code));
}

// The request's JSON object; an empty body is {}.
ApiResult<nlohmann::json> json_object(const ApiRequest& request) {
  if (request.body.empty()) return nlohmann::json::object();
  if (request.content_type.find("application/json") == std::string::npos) {
    return refuse(400,
                  fmt::format("the body must be application/json, not '{}'", request.content_type));
  }
  auto parsed = parse_json(request.body);
  if (!parsed)
    return refuse(400, fmt::format("the body is not valid JSON: {}", parsed.error().message));
  if (!parsed->is_object()) return refuse(400, "the body is not a JSON object");
  return std::move(*parsed);
}

// Typed fields of a body: absent and null are nullopt; another type is a 400 naming the field.
ApiResult<std::optional<std::string>> string_field(const nlohmann::json& body,
                                                   std::string_view name) {
  auto found = body.find(name);
  if (found == body.end() || found->is_null()) return std::nullopt;
  if (!found->is_string()) return refuse(400, fmt::format("{} must be a string", name));
  return found->get<std::string>();
}

ApiResult<std::optional<bool>> bool_field(const nlohmann::json& body, std::string_view name) {
  auto found = body.find(name);
  if (found == body.end() || found->is_null()) return std::nullopt;
  if (!found->is_boolean()) return refuse(400, fmt::format("{} must be a boolean value", name));
  return found->get<bool>();
}

ApiResult<std::optional<int64_t>> int_field(const nlohmann::json& body, std::string_view name) {
  auto found = body.find(name);
  if (found == body.end() || found->is_null()) return std::nullopt;
  if (!found->is_number_integer()) {
    return refuse(400, fmt::format("{} must be an integer number", name));
  }
  return found->get<int64_t>();
}

ApiResult<std::map<std::string, std::string>> string_map(const nlohmann::json& body,
                                                         std::string_view name, size_t max_items) {
  std::map<std::string, std::string> out;
  auto found = body.find(name);
  if (found == body.end() || found->is_null()) return out;
  if (!found->is_object()) return refuse(400, fmt::format("{} must be an object", name));
  if (found->size() > max_items) {
    return refuse(400, fmt::format("{} may have at most {} entries", name, max_items));
  }
  for (const auto& [key, value] : found->items()) {
    if (!value.is_string()) {
      return refuse(400, fmt::format("{}.{} must be a string", name, key));
    }
    out[key] = value.get<std::string>();
  }
  return out;
}

// An environment variable's name, as a shell takes it.
bool valid_env_name(std::string_view name) {
  if (name.empty() || std::isdigit(static_cast<unsigned char>(name.front()))) return false;
  return std::all_of(name.begin(), name.end(),
                     [](unsigned char c) { return std::isalnum(c) || c == '_'; });
}

ApiResult<void> check_env(const std::map<std::string, std::string>& env, std::string_view field) {
  for (const auto& [name, value] : env) {
    if (!valid_env_name(name) || value.find('\0') != std::string::npos) {
      return refuse(400, fmt::format("{}: '{}' is not an environment variable's name (letters, "
                                     "digits and _, not starting with a digit)",
                                     field, name));
    }
  }
  return {};
}

// A value that asks for something: Daytona's defaults (false, 0, "", [], {}, null) do not.
bool asks_for_something(const nlohmann::json& value) {
  if (value.is_null()) return false;
  if (value.is_boolean()) return value.get<bool>();
  if (value.is_number()) return value.get<double>() != 0;
  if (value.is_string() || value.is_array() || value.is_object()) return !value.empty();
  return true;
}

std::optional<int64_t> whole_number(std::string_view text) {
  int64_t value = 0;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || error != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

int64_t whole_gib(uint64_t bytes) {
  return std::llround(static_cast<double>(bytes) / static_cast<double>(kGiB));
}

// Go's time.String() layout, which the daemon's FileInfo.modTime has: "2006-01-02 15:04:05 +0000
// UTC".
std::string go_time(std::chrono::system_clock::time_point time) {
  return fmt::format("{:%Y-%m-%d %H:%M:%S} +0000 UTC",
                     fmt::gmtime(std::chrono::system_clock::to_time_t(time)));
}

// Marks the sandbox in use for a toolbox call, and active again when the call ends.
class InUse {
 public:
  InUse(Sandboxes& sandboxes, std::string id) : sandboxes_(sandboxes), id_(std::move(id)) {}
  ~InUse() { sandboxes_.release(id_); }
  InUse(const InUse&) = delete;
  InUse& operator=(const InUse&) = delete;

 private:
  Sandboxes& sandboxes_;
  std::string id_;
};

}  // namespace

bool is_upload_path(std::string_view path) {
  return match_path("/daytona/toolbox/{id}/files/bulk-upload", path).has_value();
}

nlohmann::json error_body(const ApiError& error, std::string_view method, std::string_view path) {
  const auto reason =
      boost::beast::http::obsolete_reason(static_cast<boost::beast::http::status>(error.status));
  if (path.starts_with(kToolbox)) {
    const std::string code =
        is_daemon_code(error.code) ? error.code : std::string(daemon_code(error.status));
    nlohmann::json body = {{"statusCode", error.status},
                           {"message", error.message},
                           {"code", code},
                           {"timestamp", now_text()},
                           {"path", path},
                           {"method", method}};
    if (code.starts_with("FILE_") || code == "INVALID_FILE_PATH") body["source"] = kDaemonSource;
    return body;
  }
  return {{"path", path},
          {"timestamp", now_text()},
          {"statusCode", error.status},
          {"error", std::string(reason.data(), reason.size())},
          {"message", error.message}};
}

ApiReply DaytonaApi::handle(const ApiRequest& request) {
  try {
    auto reply = dispatch(request);
    if (reply) return std::move(*reply);
    Headers headers;
    if (reply.error().status == 429) headers.emplace_back("Retry-After", "10");
    return JsonReply{reply.error().status, error_body(reply.error(), request.method, request.path),
                     std::move(headers)};
  } catch (const std::exception& error) {
    spdlog::error("{} {} failed: {}", request.method, request.path, error.what());
    const ApiError internal{
        500, "",
        fmt::format("quarry failed while answering: {}; see the server's log", error.what())};
    return JsonReply{500, error_body(internal, request.method, request.path), {}};
  }
}

ApiResult<ApiReply> DaytonaApi::dispatch(const ApiRequest& request) {
  for (const auto& route : kRoutes) {
    if (route.method != request.method) continue;
    auto params = match_path(route.pattern, request.path);
    if (!params) continue;
    const std::string id = params->count("id") ? params->at("id") : "";
    switch (route.op) {
      case Op::kCreate:
        return create(request);
      case Op::kList:
        return list(request);
      case Op::kRead:
        return read(request, id);
      case Op::kDelete:
        return remove(request, id);
      case Op::kStart:
        return start(request, id);
      case Op::kStop:
        return stop(request, id);
      case Op::kLabels:
        return replace_labels(request, id);
      case Op::kInterval:
        return set_interval(request, id, params->at("which"), params->at("minutes"));
      case Op::kToolboxUrl:
        return toolbox_proxy_url(request, id);
      default:
        break;
    }
    // The toolbox: a call on one of the user's sandboxes, which is active while it runs.
    auto sandbox = services_.sandboxes.use(request.identity.user, id);
    if (!sandbox) return refuse(sandbox.error());
    InUse in_use(services_.sandboxes, id);
    switch (route.op) {
      case Op::kExecute:
        return execute(request, *sandbox);
      case Op::kUpload:
        return upload(request, *sandbox);
      case Op::kBulkDownload:
        return bulk_download(request, *sandbox);
      case Op::kDownload:
        return download(request, *sandbox);
      case Op::kListFiles:
        return list_files(request, *sandbox);
      case Op::kDeleteFile:
        return delete_file(request, *sandbox);
      case Op::kFolder:
        return create_folder(request, *sandbox);
      case Op::kHomeDir: {
        auto ran = run(*sandbox, {"sh", "-c", "pwd"});
        if (!ran) return std::unexpected(ran.error());
        std::string dir = ran->stdout_text;
        while (!dir.empty() && dir.back() == '\n')
          dir.pop_back();
        return json({{"dir", dir}});
      }
      default:
        break;
    }
  }
  // As Daytona's server (NestJS) answers a path it does not serve, Socket.IO's included: the SDK
  // then watches a sandbox's state by polling GET /sandbox/{id}.
  return refuse(404, fmt::format("Cannot {} {}", request.method, request.path));
}

nlohmann::json DaytonaApi::sandbox_json(const ApiRequest& request, const Record& record,
                                        bool full) const {
  const std::string_view state = state_name(record.state);
  const std::string host =
      request.host.empty() ? services_.config.server.listen : std::string(request.host);
  nlohmann::json out = {
      {"id", record.id},
      {"organizationId", record.owner},
      {"name", record.name},
      {"user", "sandbox"},
      {"labels", record.labels},
      {"public", false},
      {"networkBlockAll", record.network.mode == NetworkMode::kNone},
      {"kvm", false},
      {"target", "local"},
      {"cpu", std::max<int64_t>(1, std::llround(record.resources.cpus))},
      {"gpu", 0},
      {"memory", whole_gib(record.resources.memory_bytes)},
      {"disk", whole_gib(record.resources.disk_bytes)},
      {"state", state},
      {"desiredState", state},
      {"autoStopInterval", record.auto_stop},
      {"autoArchiveInterval", record.auto_archive},
      {"autoDeleteInterval", record.auto_delete},
      {"createdAt", conversation::format_time(record.created_at)},
      {"updatedAt", conversation::format_time(record.updated_at)},
      {"lastActivityAt", conversation::format_time(record.last_activity)},
      {"toolboxProxyUrl", fmt::format("http://{}{}", host, kToolbox)},
  };
  if (record.network.mode == NetworkMode::kAllowlist) {
    out["domainAllowList"] = fmt::format("{}", fmt::join(record.network.allow, ","));
  }
  if (full) {
    out["env"] = record.env;
    out["volumes"] = nlohmann::json::array();
  }
  return out;
}

ApiResult<ApiReply> DaytonaApi::create(const ApiRequest& request) {
  auto body = json_object(request);
  if (!body) return std::unexpected(body.error());
  static constexpr std::array kServed = {
      "name",
      "snapshot",
      "user",
      "env",
      "labels",
      "networkBlockAll",
      "domainAllowList",
      "cpu",
      "memory",
      "disk",
      "autoStopInterval",
      "autoArchiveInterval",
      "autoDeleteInterval",
      "buildInfo",
      "target",
      "networkAllowList",
  };
  // What quarry cannot give is refused, not ignored; Daytona's defaults of it are no request.
  for (const auto& [key, value] : body->items()) {
    if (std::find(kServed.begin(), kServed.end(), key) != kServed.end()) continue;
    if (asks_for_something(value)) {
      return refuse(400, fmt::format("{} is not supported by quarry's Daytona-compatible API "
                                     "(docs/daytona.md)",
                                     key));
    }
  }
  Record draft;
  draft.owner = request.identity.user;
  auto name = string_field(*body, "name");
  auto snapshot = string_field(*body, "snapshot");
  auto user = string_field(*body, "user");
  auto domains = string_field(*body, "domainAllowList");
  auto addresses = string_field(*body, "networkAllowList");
  for (const auto* field : {&name, &snapshot, &user, &domains, &addresses}) {
    if (!*field) return std::unexpected(field->error());
  }
  auto labels = string_map(*body, "labels", kMaxLabels);
  if (!labels) return std::unexpected(labels.error());
  auto env = string_map(*body, "env", kMaxEnv);
  if (!env) return std::unexpected(env.error());
  if (auto checked = check_env(*env, "env"); !checked) return std::unexpected(checked.error());
  draft.labels = std::move(*labels);
  draft.env = std::move(*env);
  draft.name = name->value_or("");
  if (draft.name.size() > 255) return refuse(400, "name may have at most 255 characters");

  // Daytona's own rules first, in its order and words.
  const bool build = body->contains("buildInfo") && !(*body)["buildInfo"].is_null();
  std::optional<int64_t> resources[3];
  const char* resource_names[3] = {"cpu", "memory", "disk"};
  for (int index = 0; index < 3; ++index) {
    auto value = int_field(*body, resource_names[index]);
    if (!value) return std::unexpected(value.error());
    resources[index] = *value;
  }
  if (build && snapshot->has_value() && !(*snapshot)->empty()) {
    return refuse(400, "Cannot specify a snapshot when using a build info entry");
  }
  const bool asks_resources = std::any_of(std::begin(resources), std::end(resources),
                                          [](const auto& value) { return value.value_or(0) != 0; });
  if (!build && asks_resources) {
    return refuse(400, "Cannot specify Sandbox resources when using a snapshot");
  }
  if (!build && snapshot->has_value() && !(*snapshot)->empty()) {
    // The local provider keeps no Daytona snapshots: every name is unknown.
    return refuse(400, fmt::format("Snapshot {} not found. Did you add it through the Daytona "
                                   "Dashboard?",
                                   **snapshot));
  }
  if (build) {
    const auto& info = (*body)["buildInfo"];
    auto content = info.is_object() ? string_field(info, "dockerfileContent")
                                    : ApiResult<std::optional<std::string>>(std::nullopt);
    if (!content) return refuse(400, "buildInfo.dockerfileContent must be a string");
    const std::string dockerfile = content->value_or("");
    std::istringstream lines(dockerfile);
    std::vector<std::string> instructions;
    for (std::string line; std::getline(lines, line);) {
      if (line.find_first_not_of(" \t\r") != std::string::npos) instructions.push_back(line);
    }
    std::string from;
    if (instructions.size() == 1) {
      std::istringstream words(instructions[0]);
      std::string keyword, image, rest;
      words >> keyword >> image >> rest;
      if (ascii_lower(keyword) == "from" && rest.empty()) from = image;
    }
    if (from != kImageName) {
      return refuse(400, fmt::format("quarry builds no images: buildInfo may only be the "
                                     "Dockerfile 'FROM {}' (Image.base(\"{}\") in the SDK), this "
                                     "server's sandbox image with its Python packages",
                                     kImageName, kImageName));
    }
  }
  if (user->has_value() && **user != "sandbox") {
    return refuse(400, fmt::format("commands run as the user 'sandbox' in quarry's sandboxes, not "
                                   "'{}'; leave user out",
                                   **user));
  }

  // Resources: the server's sandbox.resources are both the default and the most one may have.
  const ResourceLimits& most = services_.config.sandbox.resources;
  draft.resources = most;
  if (resources[0]) {
    if (*resources[0] < 1 || static_cast<double>(*resources[0]) > most.cpus) {
      return refuse(400, fmt::format("cpu must be from 1 to {:g}, the most a sandbox may have "
                                     "here (sandbox.resources.cpus)",
                                     most.cpus));
    }
    draft.resources.cpus = static_cast<double>(*resources[0]);
  }
  for (int index : {1, 2}) {
    if (!resources[index]) continue;
    const uint64_t limit = index == 1 ? most.memory_bytes : most.disk_bytes;
    // Compared in GiB first: a count of GiB times 2^30 can wrap.
    if (*resources[index] < 1 || static_cast<uint64_t>(*resources[index]) > limit / kGiB) {
      return refuse(400, fmt::format("{} must be from 1 to {} GiB, the most a sandbox may have "
                                     "here (sandbox.resources.{} is {})",
                                     resource_names[index], limit / kGiB, resource_names[index],
                                     format_size(limit)));
    }
    (index == 1 ? draft.resources.memory_bytes : draft.resources.disk_bytes) =
        static_cast<uint64_t>(*resources[index]) * kGiB;
  }

  // Network: the server's, or less of it.
  draft.network = services_.config.sandbox.network;
  if (addresses->has_value() && !(*addresses)->empty()) {
    return refuse(400,
                  "networkAllowList: quarry's sandboxes reach names, not addresses; list "
                  "domains in domainAllowList");
  }
  auto block_all = bool_field(*body, "networkBlockAll");
  if (!block_all) return std::unexpected(block_all.error());
  if (block_all->value_or(false)) {
    draft.network = NetworkPolicy{};
  } else if (domains->has_value() && !(*domains)->empty()) {
    std::vector<std::string> wanted;
    std::istringstream entries(**domains);
    for (std::string entry; std::getline(entries, entry, ',');) {
      const auto first = entry.find_first_not_of(' ');
      if (first != std::string::npos) wanted.push_back(entry.substr(first));
    }
    auto narrowed = narrow_allowlist(services_.config.sandbox.network, wanted);
    if (!narrowed) return refuse(400, "domainAllowList: " + narrowed.error().message);
    draft.network = std::move(*narrowed);
  }

  for (auto [field, out, least] :
       {std::tuple{"autoStopInterval", &draft.auto_stop, int64_t{0}},
        std::tuple{"autoArchiveInterval", &draft.auto_archive, int64_t{0}},
        std::tuple{"autoDeleteInterval", &draft.auto_delete,
                   std::numeric_limits<int64_t>::min()}}) {
    auto value = int_field(*body, field);
    if (!value) return std::unexpected(value.error());
    if (!*value) continue;
    if (**value < least) return refuse(400, fmt::format("{} must not be negative", field));
    *out = **value;
  }

  sandbox::SandboxSpec spec;
  spec.network = draft.network;
  auto created = services_.sandboxes.create(std::move(draft), spec);
  if (!created) return refuse(created.error());
  return json(sandbox_json(request, *created, true));
}

ApiResult<ApiReply> DaytonaApi::list(const ApiRequest& request) {
  size_t limit = kDefaultPage;
  std::optional<uint64_t> before;
  std::string id_prefix, name_prefix;
  std::map<std::string, std::string> labels;
  std::vector<std::string> states;
  bool ascending = false;
  for (const auto& [name, value] : request.query_list) {
    if (name == "limit") {
      auto number = whole_number(value);
      if (!number || *number < 1 || *number > static_cast<int64_t>(kMaxPage)) {
        return refuse(400, fmt::format("limit must be from 1 to {}", kMaxPage));
      }
      limit = static_cast<size_t>(*number);
    } else if (name == "cursor") {
      auto number = whole_number(value);
      if (!number || *number < 0) return refuse(400, "cursor is not one this server gave");
      before = static_cast<uint64_t>(*number);
    } else if (name == "id") {
      id_prefix = ascii_lower(value);
    } else if (name == "name") {
      name_prefix = ascii_lower(value);
    } else if (name == "labels") {
      auto parsed = parse_json_or_discarded(value);
      if (parsed.is_discarded() || !parsed.is_object()) {
        return refuse(400, "labels must be a JSON object of strings");
      }
      auto wanted = string_map(nlohmann::json{{"labels", parsed}}, "labels", kMaxLabels);
      if (!wanted) return std::unexpected(wanted.error());
      labels = std::move(*wanted);
    } else if (name == "states") {
      states.push_back(value);
    } else if (name == "sort") {
      if (value != "createdAt") {
        return refuse(400, fmt::format("quarry sorts sandboxes by createdAt only, not {}", value));
      }
    } else if (name == "order") {
      if (value != "asc" && value != "desc") return refuse(400, "order must be asc or desc");
      ascending = value == "asc";
    } else if (name != "includeErroredDeleted") {
      // A filter not applied would list what the caller did not ask for.
      return refuse(400, fmt::format("quarry does not filter sandboxes by {}", name));
    }
  }
  auto all = services_.sandboxes.list(request.identity.user);
  if (ascending) std::reverse(all.begin(), all.end());
  nlohmann::json items = nlohmann::json::array();
  nlohmann::json next = nullptr;
  for (const auto& record : all) {
    if (before && (ascending ? record.sequence <= *before : record.sequence >= *before)) continue;
    if (!ascii_lower(record.id).starts_with(id_prefix) ||
        !ascii_lower(record.name).starts_with(name_prefix)) {
      continue;
    }
    if (!states.empty() &&
        std::find(states.begin(), states.end(), state_name(record.state)) == states.end()) {
      continue;
    }
    const bool matches = std::all_of(labels.begin(), labels.end(), [&](const auto& wanted) {
      auto have = record.labels.find(wanted.first);
      return have != record.labels.end() && have->second == wanted.second;
    });
    if (!matches) continue;
    if (items.size() == limit) {
      next = std::to_string(record.sequence + (ascending ? -1 : 1));
      break;
    }
    items.push_back(sandbox_json(request, record, false));
  }
  return json({{"items", items}, {"nextCursor", next}});
}

ApiResult<ApiReply> DaytonaApi::read(const ApiRequest& request, std::string_view id) {
  auto record = services_.sandboxes.get(request.identity.user, id);
  if (!record) return refuse(record.error());
  return json(sandbox_json(request, *record, true));
}

ApiResult<ApiReply> DaytonaApi::remove(const ApiRequest& request, std::string_view id) {
  auto removed = services_.sandboxes.remove(request.identity.user, id);
  if (!removed) return refuse(removed.error());
  // Destroyed before the answer (Daytona's delete is asynchronous; this one is done).
  return json(sandbox_json(request, *removed, true));
}

ApiResult<ApiReply> DaytonaApi::start(const ApiRequest& request, std::string_view id) {
  auto started = services_.sandboxes.start(request.identity.user, id);
  if (!started) return refuse(started.error());
  return json(sandbox_json(request, *started, true));
}

ApiResult<ApiReply> DaytonaApi::stop(const ApiRequest& request, std::string_view id) {
  // force (SIGKILL rather than SIGTERM) changes nothing here: the commands are always killed.
  for (const auto& [name, value] : request.query_list) {
    if (name == "force" && value != "true" && value != "false") {
      return refuse(400, "force must be true or false");
    }
  }
  // Done before the answer (Daytona's stop is asynchronous; the SDK polls until stopped).
  auto stopped = services_.sandboxes.stop(request.identity.user, id);
  if (!stopped) return refuse(stopped.error());
  return json(sandbox_json(request, *stopped, true));
}

ApiResult<ApiReply> DaytonaApi::replace_labels(const ApiRequest& request, std::string_view id) {
  auto body = json_object(request);
  if (!body) return std::unexpected(body.error());
  if (!body->contains("labels")) return refuse(400, "labels must be an object");
  auto labels = string_map(*body, "labels", kMaxLabels);
  if (!labels) return std::unexpected(labels.error());
  auto updated = services_.sandboxes.update(request.identity.user, id,
                                            [&](Record& record) { record.labels = *labels; });
  if (!updated) return refuse(updated.error());
  return json({{"labels", updated->labels}});
}

ApiResult<ApiReply> DaytonaApi::set_interval(const ApiRequest& request, std::string_view id,
                                             std::string_view which, std::string_view minutes) {
  int64_t Record::*field = nullptr;
  if (which == "autostop") field = &Record::auto_stop;
  if (which == "autoarchive") field = &Record::auto_archive;
  if (which == "autodelete") field = &Record::auto_delete;
  if (!field) return refuse(404, fmt::format("Cannot {} {}", request.method, request.path));
  auto value = whole_number(minutes);
  if (!value || (which != "autodelete" && *value < 0)) {
    return refuse(400, fmt::format("the {} interval must be a whole number of minutes{}", which,
                                   which == "autodelete" ? "" : ", not negative"));
  }
  auto updated = services_.sandboxes.update(request.identity.user, id,
                                            [&](Record& record) { record.*field = *value; });
  if (!updated) return refuse(updated.error());
  return json(sandbox_json(request, *updated, true));
}

ApiResult<ApiReply> DaytonaApi::toolbox_proxy_url(const ApiRequest& request, std::string_view id) {
  auto record = services_.sandboxes.get(request.identity.user, id);
  if (!record) return refuse(record.error());
  return json({{"url", sandbox_json(request, *record, false)["toolboxProxyUrl"]}});
}

ApiResult<ApiReply> DaytonaApi::execute(const ApiRequest& request, const Record& sandbox) {
  auto body = json_object(request);
  if (!body) return std::unexpected(body.error());
  auto command = string_field(*body, "command");
  auto cwd = string_field(*body, "cwd");
  auto timeout = int_field(*body, "timeout");
  if (!command) return std::unexpected(command.error());
  if (!cwd) return std::unexpected(cwd.error());
  if (!timeout) return std::unexpected(timeout.error());
  if (!*command || (*command)->find_first_not_of(" \t\r\n") == std::string::npos) {
    return refuse(400, "command is required");
  }
  if ((*command)->size() > kMaxCommandBytes) {
    return refuse(400, fmt::format("command is longer than {} bytes", kMaxCommandBytes));
  }
  auto envs = string_map(*body, "envs", kMaxEnv);
  if (!envs) return std::unexpected(envs.error());
  if (auto checked = check_env(*envs, "envs"); !checked) return std::unexpected(checked.error());

  const auto most =
      std::chrono::duration_cast<std::chrono::seconds>(services_.config.sandbox.exec_timeout);
  sandbox::ExecRequest exec;
  // As the daemon does: the command is the shell's to read.
  exec.argv = {"bash", "-c", **command};
  exec.env = sandbox.env;
  for (const auto& [name, value] : *envs)
    exec.env[name] = value;
  exec.working_directory = cwd->value_or("");
  exec.timeout = most;
  if (timeout->value_or(0) > 0) {
    if (**timeout > most.count()) {
      return refuse(400, fmt::format("timeout may be at most {} s here (sandbox.exec_timeout)",
                                     most.count()));
    }
    exec.timeout = std::chrono::seconds(**timeout);
  }
  exec.output_limit = services_.config.sandbox.output_limit_bytes;
  // stdout and stderr together, in the order they came, as the daemon's one pipe has them.
  std::string combined;
  bool truncated = false;
  exec.on_output = [&](sandbox::OutputStream, std::string_view text) {
    const size_t room = exec.output_limit - std::min<size_t>(combined.size(), exec.output_limit);
    combined.append(text.substr(0, room));
    truncated = truncated || text.size() > room;
  };
  auto result = services_.provider.exec(sandbox.id, exec);
  if (!result) return refuse(result.error());
  if (result->timed_out) return refuse(408, "command execution timeout", "REQUEST_TIMEOUT");
  nlohmann::json metering = {
      {"run_ms", result->run_ms},
      {"cpu_ms", result->cpu_ms},
      {"peak_memory_bytes", result->peak_memory_bytes},
      {"memory_limit_bytes", result->memory_limit_bytes},
      {"overhead_ms", result->overhead_ms},
      {"oom", result->oom},
      {"truncated", truncated},
      {"message", result->message ? nlohmann::json(*result->message) : nlohmann::json(nullptr)}};
  return json({{"exitCode", result->exit_code}, {"result", combined}, {"quarry", metering}});
}

ApiResult<ApiReply> DaytonaApi::upload(const ApiRequest& request, const Record& sandbox) {
  auto boundary = multipart_boundary(request.content_type);
  if (!boundary) return refuse(400, boundary.error().message);
  auto parts = parse_multipart(request.body, *boundary);
  if (!parts) return refuse(400, parts.error().message);
  // files[i].path, then files[i].file: the path must come first.
  std::map<std::string, std::string> paths;
  nlohmann::json files = nlohmann::json::array();
  std::vector<std::string> errors;
  for (const auto& part : *parts) {
    const auto dot = part.name.rfind('.');
    if (!part.name.starts_with("files[") || dot == std::string::npos) {
      errors.push_back(
          fmt::format("unexpected part '{}' (want files[i].path, files[i].file)", part.name));
      continue;
    }
    const std::string index = part.name.substr(0, dot);
    const std::string kind = part.name.substr(dot + 1);
    if (kind == "path") {
      paths[index] = std::string(part.data);
      continue;
    }
    if (kind != "file") {
      errors.push_back(fmt::format("unexpected part '{}'", part.name));
      continue;
    }
    auto path = paths.find(index);
    if (path == paths.end()) {
      errors.push_back(fmt::format("{}.file comes before {}.path", index, index));
      continue;
    }
    std::ispanstream content(std::span<const char>(part.data.data(), part.data.size()));
    if (auto written = services_.provider.write_file(sandbox.id, path->second, content, -1);
        !written) {
      errors.push_back(fmt::format("{}: {}", path->second, written.error().message));
      continue;
    }
    files.push_back({{"path", path->second}, {"bytes", part.data.size()}});
  }
  if (!errors.empty()) return json({{"errors", errors}, {"files", files}}, 400);
  return json({{"files", files}});
}

ApiResult<ApiReply> DaytonaApi::bulk_download(const ApiRequest& request, const Record& sandbox) {
  auto body = json_object(request);
  if (!body) return std::unexpected(body.error());
  const auto paths = body->find("paths");
  if (paths == body->end() || !paths->is_array() || paths->empty()) {
    return refuse(400, "paths must be a list of at least one path");
  }
  uint64_t room = services_.config.server.max_file_transfer;
  std::vector<OutPart> parts;
  for (const auto& entry : *paths) {
    if (!entry.is_string()) return refuse(400, "paths must be strings");
    const std::string path = entry.get<std::string>();
    std::ostringstream content;
    auto read = services_.provider.read_file(sandbox.id, path, content, room, -1);
    if (read) {
      room -= *read;
      parts.push_back({"file", path, "application/octet-stream", std::move(content).str()});
      continue;
    }
    const int status = read.error().code == ErrorCode::kNotFound ? 404 : 400;
    const std::string code = status == 404 ? "FILE_NOT_FOUND" : "INVALID_FILE_PATH";
    const nlohmann::json error = {{"message", read.error().message},
                                  {"statusCode", status},
                                  {"code", code},
                                  {"source", kDaemonSource}};
    parts.push_back({"error", path, "application/json", error.dump()});
  }
  auto written = write_multipart(parts);
  return BytesReply{200, std::move(written.content_type), std::move(written.body), {}};
}

ApiResult<ApiReply> DaytonaApi::download(const ApiRequest& request, const Record& sandbox) {
  auto path = request.query.find("path");
  if (path == request.query.end() || path->second.empty()) {
    return refuse(400, "path is required", "INVALID_FILE_PATH");
  }
  std::ostringstream content;
  auto read = services_.provider.read_file(sandbox.id, path->second, content,
                                           services_.config.server.max_file_transfer, -1);
  if (!read) {
    return refuse(read.error(), read.error().code == ErrorCode::kNotFound ? "FILE_NOT_FOUND"
                                                                          : "INVALID_FILE_PATH");
  }
  return BytesReply{200, "application/octet-stream", std::move(content).str(), {}};
}

ApiResult<sandbox::ExecResult> DaytonaApi::run(const Record& sandbox,
                                               std::vector<std::string> argv) {
  sandbox::ExecRequest exec;
  exec.argv = std::move(argv);
  exec.timeout = std::chrono::seconds(30);
  exec.output_limit = 16 * kMiB;
  auto result = services_.provider.exec(sandbox.id, exec);
  if (!result) return refuse(result.error());
  if (result->truncated) return refuse(400, "the listing is longer than 16 MiB");
  return std::move(*result);
}

// The file operations run in the sandbox as its user, so they see its files as its programs do
// (never following a link out of it). Exit 3: no such file; 4: the wrong kind.
ApiResult<ApiReply> DaytonaApi::list_files(const ApiRequest& request, const Record& sandbox) {
  auto path = request.query.find("path");
  std::string depth = "1";
  if (auto asked = request.query.find("depth"); asked != request.query.end()) {
    auto number = whole_number(asked->second);
    if (!number || *number < 1 || *number > 64) return refuse(400, "depth must be from 1 to 64");
    depth = asked->second;
  }
  constexpr std::string_view kScript =
      "p=$1; case $p in -*) p=./$p;; esac; [ -e \"$p\" ] || exit 3; [ -d \"$p\" ] || exit 4; "
      "exec find \"$p\" -mindepth 1 -maxdepth \"$2\" "
      "-printf '%y\\t%#m\\t%M\\t%u\\t%g\\t%s\\t%T@\\t%p\\t%P\\0'";
  const std::string where =
      path == request.query.end() || path->second.empty() ? "." : path->second;
  auto ran = run(sandbox, {"sh", "-c", std::string(kScript), "sh", where, depth});
  if (!ran) return std::unexpected(ran.error());
  if (ran->exit_code == 3)
    return refuse(404, fmt::format("{} does not exist", where), "FILE_NOT_FOUND");
  if (ran->exit_code == 4) {
    return refuse(400, fmt::format("{} is not a directory", where), "INVALID_FILE_PATH");
  }
  if (ran->exit_code != 0) return refuse(400, ran->stderr_text, "FILE_READ_FAILED");
  nlohmann::json files = nlohmann::json::array();
  std::string_view rest = ran->stdout_text;
  while (!rest.empty()) {
    const auto end = rest.find('\0');
    std::string_view entry = rest.substr(0, end);
    rest = end == std::string_view::npos ? std::string_view() : rest.substr(end + 1);
    std::vector<std::string> fields;
    for (size_t index = 0; index < 8; ++index) {
      const auto tab = entry.find('\t');
      fields.emplace_back(entry.substr(0, tab));
      entry = tab == std::string_view::npos ? std::string_view() : entry.substr(tab + 1);
    }
    fields.emplace_back(entry);  // the name, which may itself hold tabs
    const double seconds = std::strtod(fields[6].c_str(), nullptr);
    const auto modified = std::chrono::system_clock::time_point(
        std::chrono::duration_cast<std::chrono::system_clock::duration>(
            std::chrono::duration<double>(seconds)));
    files.push_back({{"name", fields[8]},
                     {"path", fields[7]},
                     {"isDir", fields[0] == "d"},
                     {"permissions", fields[1]},
                     {"mode", fields[2]},
                     {"owner", fields[3]},
                     {"group", fields[4]},
                     {"size", whole_number(fields[5]).value_or(0)},
                     {"modTime", go_time(modified)},
                     {"modifiedAt", conversation::format_time(modified)}});
  }
  return json(std::move(files));
}

ApiResult<ApiReply> DaytonaApi::delete_file(const ApiRequest& request, const Record& sandbox) {
  auto path = request.query.find("path");
  if (path == request.query.end() || path->second.empty()) {
    return refuse(400, "path is required", "INVALID_FILE_PATH");
  }
  auto recursive = request.query.find("recursive");
  const bool deep = recursive != request.query.end() && recursive->second == "true";
  constexpr std::string_view kScript =
      "p=$1; [ -e \"$p\" ] || [ -L \"$p\" ] || exit 3; "
      "if [ -d \"$p\" ] && [ ! -L \"$p\" ] && [ \"$2\" != true ]; then exit 4; fi; "
      "exec rm -rf -- \"$p\"";
  auto ran =
      run(sandbox, {"sh", "-c", std::string(kScript), "sh", path->second, deep ? "true" : "false"});
  if (!ran) return std::unexpected(ran.error());
  if (ran->exit_code == 3) {
    return refuse(404, fmt::format("{} does not exist", path->second), "FILE_NOT_FOUND");
  }
  if (ran->exit_code == 4) {
    return refuse(400,
                  fmt::format("{} is a directory: delete it with recursive=true", path->second),
                  "INVALID_FILE_PATH");
  }
  if (ran->exit_code != 0) return refuse(403, ran->stderr_text, "FILE_ACCESS_DENIED");
  return JsonReply{204, nullptr, {}};
}

ApiResult<ApiReply> DaytonaApi::create_folder(const ApiRequest& request, const Record& sandbox) {
  auto path = request.query.find("path");
  if (path == request.query.end() || path->second.empty()) {
    return refuse(400, "path is required", "INVALID_FILE_PATH");
  }
  std::string mode = "755";
  if (auto asked = request.query.find("mode"); asked != request.query.end()) mode = asked->second;
  if (mode.size() < 3 || mode.size() > 4 ||
      mode.find_first_not_of("01234567") != std::string::npos) {
    return refuse(400, fmt::format("mode must be octal permissions such as 755, not '{}'", mode));
  }
  auto ran = run(sandbox, {"mkdir", "-p", "-m", mode, "--", path->second});
  if (!ran) return std::unexpected(ran.error());
  if (ran->exit_code != 0) return refuse(400, ran->stderr_text, "INVALID_FILE_PATH");
  return JsonReply{201, nullptr, {}};
}

}  // namespace quarry::server::daytona

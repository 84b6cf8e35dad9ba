#include "server/router.h"

#include <algorithm>
#include <array>
#include <vector>

namespace quarry::server {
namespace {

constexpr std::array kRoutes = {
    Route{"GET", "/", RouteId::kIndex, true, {}, true},
    Route{"GET", "/assets/{file}", RouteId::kAsset, true, {}, true},
    Route{"GET", "/healthz", RouteId::kHealth, true},
    Route{"GET", "/readyz", RouteId::kReady, true},
    Route{"GET", "/api/openapi.json", RouteId::kOpenApi, true},
    Route{"GET", "/api/v1/info", RouteId::kInfo},
    Route{"GET", "/api/v1/session", RouteId::kSessionRead},
    Route{"POST", "/api/v1/session", RouteId::kSessionCreate, true},
    Route{"DELETE", "/api/v1/session", RouteId::kSessionDelete},
    Route{"GET", "/api/v1/conversations", RouteId::kConversationList, false, {"limit", "cursor"}},
    Route{"POST", "/api/v1/conversations", RouteId::kConversationCreate},
    Route{"GET", "/api/v1/conversations/{id}", RouteId::kConversationRead},
    Route{"DELETE", "/api/v1/conversations/{id}", RouteId::kConversationDelete},
    Route{"POST", "/api/v1/conversations/{id}/messages", RouteId::kMessageCreate},
    Route{"POST", "/api/v1/conversations/{id}/cells", RouteId::kCellCreate},
    Route{"GET", "/api/v1/conversations/{id}/events", RouteId::kEvents, false, {"after"}},
    Route{"POST", "/api/v1/conversations/{id}/cancel", RouteId::kCancel},
    Route{"GET", "/api/v1/conversations/{id}/artifacts", RouteId::kArtifactList},
    Route{"GET", "/api/v1/artifacts/{artifact_id}", RouteId::kArtifactRead, false, {"download"}},
    Route{"GET",
          "/api/v1/artifacts/{artifact_id}/table",
          RouteId::kArtifactTable,
          false,
          {"offset", "limit", "sort", "order"}},
    Route{"GET", "/api/v1/execs", RouteId::kExecList, false, {"conversation", "limit", "cursor"}},
    Route{"GET", "/api/v1/sandboxes", RouteId::kSandboxList},
};

std::vector<std::string_view> segments(std::string_view path) {
  std::vector<std::string_view> parts;
  size_t start = 1;  // after the leading '/'
  while (start <= path.size()) {
    auto end = path.find('/', start);
    if (end == std::string_view::npos) end = path.size();
    parts.push_back(path.substr(start, end - start));
    start = end + 1;
  }
  return parts;
}

}  // namespace

std::optional<std::map<std::string, std::string, std::less<>>> match_path(std::string_view pattern,
                                                                          std::string_view path) {
  if (pattern == "/" || path == "/") {
    if (pattern == path) return std::map<std::string, std::string, std::less<>>{};
    return std::nullopt;
  }
  auto want = segments(pattern);
  auto have = segments(path);
  if (want.size() != have.size()) return std::nullopt;
  std::map<std::string, std::string, std::less<>> params;
  for (size_t i = 0; i < want.size(); ++i) {
    if (want[i].starts_with("{")) {
      if (have[i].empty()) return std::nullopt;
      params.emplace(want[i].substr(1, want[i].size() - 2), have[i]);
    } else if (want[i] != have[i]) {
      return std::nullopt;
    }
  }
  return params;
}

std::span<const Route> routes() {
  return kRoutes;
}

std::span<const std::string_view> query_parameters() {
  static const std::vector<std::string_view> parameters = [] {
    std::vector<std::string_view> names;
    for (const auto& route : kRoutes) {
      for (auto name : route.query) {
        if (!name.empty() && std::find(names.begin(), names.end(), name) == names.end()) {
          names.push_back(name);
        }
      }
    }
    return names;
  }();
  return parameters;
}

ApiResult<RouteMatch> match_route(std::string_view method, std::string_view path,
                                  std::string* allow) {
  std::vector<std::string_view> methods;
  for (const auto& route : kRoutes) {
    auto params = match_path(route.pattern, path);
    if (!params) continue;
    if (route.method == method) return RouteMatch{&route, std::move(*params)};
    methods.push_back(route.method);
  }
  if (methods.empty()) {
    return api_error(404, "no_route",
                     "there is no {} {}; the API is under /api/v1 and described at "
                     "/api/openapi.json",
                     method, path);
  }
  const std::string allowed = fmt::format("{}", fmt::join(methods, ", "));
  if (allow) *allow = allowed;
  return api_error(405, "method_not_allowed", "{} does not take {}; it takes {}", path, method,
                   allowed);
}

}  // namespace quarry::server

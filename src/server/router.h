// The API's routes: method and path pattern ("/api/v1/conversations/{id}") to what handles
// them. An unknown path is a 404 and a known path with another method a 405, each saying what
// exists.
#pragma once

#include <array>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "server/api_error.h"

namespace quarry::server {

enum class RouteId {
  kIndex,
  kAsset,
  kHealth,
  kReady,
  kOpenApi,
  kInfo,
  kSessionRead,
  kSessionCreate,
  kSessionDelete,
  kConversationList,
  kConversationCreate,
  kConversationRead,
  kConversationDelete,
  kMessageCreate,
  kCellCreate,
  kEvents,
  kCancel,
  kArtifactList,
  kArtifactRead,
  kArtifactTable,
  kExecList,
  kSandboxList,
};

struct Route {
  std::string_view method;
  std::string_view pattern;  // segments in braces are parameters
  RouteId id;
  bool public_route = false;  // answered without signing in
  // The query parameters it takes: any other is refused with 400. The UI's pages take any (a
  // link to them may carry some).
  std::array<std::string_view, 4> query{};
  bool page = false;
};

struct RouteMatch {
  const Route* route = nullptr;
  std::map<std::string, std::string, std::less<>> params;
};

std::span<const Route> routes();

// The parameters of `path` ({"id": "c1"}) if it has the shape of `pattern`
// ("/api/v1/conversations/{id}"); a parameter is one non-empty segment.
std::optional<std::map<std::string, std::string, std::less<>>> match_path(std::string_view pattern,
                                                                          std::string_view path);

// Every query parameter some route takes; none of them carries a secret.
std::span<const std::string_view> query_parameters();

// 404 (no such path) or 405 (the path exists for other methods; `allow` receives them).
ApiResult<RouteMatch> match_route(std::string_view method, std::string_view path,
                                  std::string* allow = nullptr);

}  // namespace quarry::server

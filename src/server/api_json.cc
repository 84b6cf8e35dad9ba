#include "server/api_json.h"

#include <fmt/format.h>

#include "conversation/history_json.h"

namespace quarry::server {

std::string artifact_url(int64_t id) {
  return fmt::format("/api/v1/artifacts/{}", id);
}

nlohmann::json artifact_json(const conversation::Artifact& artifact) {
  auto json = conversation::to_json(artifact);
  json["url"] = artifact_url(artifact.id);
  return json;
}

}  // namespace quarry::server

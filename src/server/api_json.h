// JSON of the API's own making, beside the history's (conversation/history_json.h): where an
// artifact is downloaded, and the figures of the sandbox scheduler.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "capacity/scheduler.h"
#include "conversation/history_store.h"

namespace quarry::server {

// "/api/v1/artifacts/42"
std::string artifact_url(int64_t id);

// The history's artifact JSON with its "url".
nlohmann::json artifact_json(const conversation::Artifact& artifact);

// The scheduler's limits and figures (the Capacity schema of openapi.yaml).
nlohmann::json capacity_json(const capacity::Stats& stats);

}  // namespace quarry::server

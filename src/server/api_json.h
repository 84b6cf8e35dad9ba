// JSON of the API's own making, beside the history's (conversation/history_json.h): where an
// artifact is downloaded, and the error code of a failure.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "conversation/history_store.h"

namespace quarry::server {

// "/api/v1/artifacts/42"
std::string artifact_url(int64_t id);

// The history's artifact JSON with its "url".
nlohmann::json artifact_json(const conversation::Artifact& artifact);

}  // namespace quarry::server

// The API's OpenAPI 3.1 document (openapi.yaml beside this file, built into quarry), served at
// /api/openapi.json.
#pragma once

#include <nlohmann/json.hpp>
#include <string_view>

#include "common/error.h"

namespace quarry::server {

// The document as written (YAML).
std::string_view openapi_yaml();

// The document as JSON.
Result<nlohmann::json> openapi_document();

}  // namespace quarry::server

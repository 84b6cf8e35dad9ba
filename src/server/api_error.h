// The API's errors: an HTTP status and {"error": {"code", "message"}}, where the code is a
// short word a client can branch on and the message says what was wrong and what to do.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "common/error.h"

namespace quarry::server {

struct ApiError {
  int status = 500;
  std::string code;  // e.g. "invalid_json", "not_found", "turn_running"
  std::string message;

  nlohmann::json body() const;
};

template <typename T = void>
using ApiResult = std::expected<T, ApiError>;

template <typename... Args>
std::unexpected<ApiError> api_error(int status, std::string code,
                                    fmt::format_string<Args...> format, Args&&... args) {
  return std::unexpected(
      ApiError{status, std::move(code), fmt::format(format, std::forward<Args>(args)...)});
}

// The status and code for an error from the rooms below: kNotFound -> 404 not_found,
// kAborted -> 409 conflict, kInvalidArgument -> 400 invalid_request, kUnavailable -> 503, ...
ApiError from_error(const Error& error);

}  // namespace quarry::server

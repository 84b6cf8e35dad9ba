#include "server/api_error.h"

namespace quarry::server {

nlohmann::json ApiError::body() const {
  return {{"error", {{"code", code}, {"message", message}}}};
}

ApiError from_error(const Error& error) {
  switch (error.code) {
    case ErrorCode::kInvalidArgument:
      return {400, "invalid_request", error.message};
    case ErrorCode::kNotFound:
      return {404, "not_found", error.message};
    case ErrorCode::kAlreadyExists:
    case ErrorCode::kAborted:
      return {409, "conflict", error.message};
    case ErrorCode::kFailedPrecondition:
      return {409, "failed_precondition", error.message};
    case ErrorCode::kPermissionDenied:
      return {403, "forbidden", error.message};
    case ErrorCode::kResourceExhausted:
      return {429, "resource_exhausted", error.message};
    case ErrorCode::kUnavailable:
      return {503, "unavailable", error.message};
    case ErrorCode::kDeadlineExceeded:
      return {504, "deadline_exceeded", error.message};
    case ErrorCode::kCancelled:
      return {409, "cancelled", error.message};
    case ErrorCode::kInternal:
      break;
  }
  return {500, "internal", error.message};
}

}  // namespace quarry::server

#include "common/error.h"

namespace quarry {

std::string_view to_string(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidArgument:
      return "invalid_argument";
    case ErrorCode::kNotFound:
      return "not_found";
    case ErrorCode::kAlreadyExists:
      return "already_exists";
    case ErrorCode::kFailedPrecondition:
      return "failed_precondition";
    case ErrorCode::kPermissionDenied:
      return "permission_denied";
    case ErrorCode::kResourceExhausted:
      return "resource_exhausted";
    case ErrorCode::kUnavailable:
      return "unavailable";
    case ErrorCode::kDeadlineExceeded:
      return "deadline_exceeded";
    case ErrorCode::kAborted:
      return "aborted";
    case ErrorCode::kCancelled:
      return "cancelled";
    case ErrorCode::kInternal:
      return "internal";
  }
  return "unknown";
}

Error Error::with_context(std::string_view context) const& {
  return Error{code, fmt::format("{}: {}", context, message)};
}

Error Error::with_context(std::string_view context) && {
  message = fmt::format("{}: {}", context, message);
  return std::move(*this);
}

ErrorCode code_from_errno(int error_number) {
  switch (error_number) {
    case ENOENT:
    case ESRCH:
      return ErrorCode::kNotFound;
    case EEXIST:
      return ErrorCode::kAlreadyExists;
    case EACCES:
    case EPERM:
    case EROFS:
      return ErrorCode::kPermissionDenied;
    case ENOSPC:
    case EDQUOT:
    case ENOMEM:
    case EMFILE:
    case ENFILE:
    case EAGAIN:
      return ErrorCode::kResourceExhausted;
    case EINVAL:
    case ENAMETOOLONG:
    case ELOOP:
    case ENOTDIR:
    case EISDIR:
    case EXDEV:
      return ErrorCode::kInvalidArgument;
    case ETIMEDOUT:
      return ErrorCode::kDeadlineExceeded;
    case ECONNREFUSED:
    case ECONNRESET:
    case EPIPE:
      return ErrorCode::kUnavailable;
    default:
      return ErrorCode::kInternal;
  }
}

}  // namespace quarry

// Error values and Result<T>: how quarry reports expected failures.
#pragma once

#include <fmt/format.h>

#include <cerrno>
#include <expected>
#include <string>
#include <string_view>
#include <utility>

namespace quarry {

// A small set of codes, in the spirit of absl::StatusCode, that callers can branch on and
// that map onto HTTP statuses later. The message is for humans and says what to do.
enum class ErrorCode {
  kInvalidArgument,     // the caller's input is wrong; retrying the same input will not help
  kNotFound,            // the named thing does not exist
  kAlreadyExists,       // the thing to create is already there
  kFailedPrecondition,  // the system is not in a state that allows this (e.g. no image built)
  kPermissionDenied,    // refused by policy or by the kernel
  kResourceExhausted,   // a limit was reached (memory, disk, pids, quota)
  kUnavailable,         // transient: the peer is gone or busy; retrying may help
  kDeadlineExceeded,    // a timeout expired
  kAborted,             // conflicted with a concurrent operation; retry when it is done
  kCancelled,           // the caller gave up (e.g. Ctrl-C)
  kInternal,            // a bug or an unexpected system failure
};

std::string_view to_string(ErrorCode code);

struct Error {
  ErrorCode code = ErrorCode::kInternal;
  std::string message;

  // Returns the same error with "context: " in front of the message.
  Error with_context(std::string_view context) const&;
  Error with_context(std::string_view context) &&;
};

template <typename T = void>
using Result = std::expected<T, Error>;

template <typename... Args>
std::unexpected<Error> make_error(ErrorCode code, fmt::format_string<Args...> format,
                                  Args&&... args) {
  return std::unexpected(Error{code, fmt::format(format, std::forward<Args>(args)...)});
}

// Maps an errno value to the closest ErrorCode.
ErrorCode code_from_errno(int error_number);

// An error for a failed system call: "<what> failed: <strerror(errno)>". Reads errno, so call
// it right after the failing call.
template <typename... Args>
std::unexpected<Error> errno_error(fmt::format_string<Args...> format, Args&&... args) {
  const int saved = errno;
  return std::unexpected(
      Error{code_from_errno(saved),
            fmt::format("{} failed: {}", fmt::format(format, std::forward<Args>(args)...),
                        std::string_view(strerrordesc_np(saved)))});
}

// Puts "context: " in front of the error's message, if there is an error.
template <typename T>
Result<T> with_context(Result<T> result, std::string_view context) {
  if (!result) return std::unexpected(std::move(result).error().with_context(context));
  return result;
}

}  // namespace quarry

#define QUARRY_CONCAT_INNER(a, b) a##b
#define QUARRY_CONCAT(a, b) QUARRY_CONCAT_INNER(a, b)

// Returns the error of `expr` (a Result) from the current function, if there is one.
#define RETURN_IF_ERROR(expr)                                    \
  do {                                                           \
    auto&& quarry_result_ = (expr);                              \
    if (!quarry_result_) {                                       \
      return std::unexpected(std::move(quarry_result_).error()); \
    }                                                            \
  } while (false)

// Evaluates `expr` (a Result<T>); on error returns it, otherwise assigns the value to `lhs`.
#define ASSIGN_OR_RETURN(lhs, expr) \
  QUARRY_ASSIGN_OR_RETURN_IMPL(QUARRY_CONCAT(quarry_result_, __LINE__), lhs, expr)
#define QUARRY_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr)        \
  auto tmp = (expr);                                        \
  if (!tmp) return std::unexpected(std::move(tmp).error()); \
  lhs = std::move(*tmp)

// What went wrong with a command, in the terms the model should act on (seed 003): a code
// error is sent back to fix; an environment error (out of memory, timeout, disk full, missing
// module, network) is not to be retried as it is.
#pragma once

#include <string>

#include "sandbox/provider.h"

namespace quarry::agent {

enum class FailureKind { kNone, kCode, kEnvironment };

struct Failure {
  FailureKind kind = FailureKind::kNone;
  std::string cause;   // "out of memory", "timeout", ...; empty for code errors
  std::string advice;  // one or two sentences for the model
};

// `packages`: what the sandbox's Python has (sandbox.packages), named when a module is missing.
Failure classify(const sandbox::ExecResult& result, const std::vector<std::string>& packages);

// "code", "environment" or "" (none), as the API shows a failure's kind.
std::string_view to_string(FailureKind kind);

// "Code error: ..." or "Environment error (out of memory): ..." or "".
std::string describe(const Failure& failure);

}  // namespace quarry::agent

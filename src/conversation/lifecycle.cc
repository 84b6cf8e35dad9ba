#include "conversation/lifecycle.h"

#include <array>
#include <utility>

namespace quarry::conversation {
namespace {

using enum SandboxLifecycle;

constexpr std::array<std::pair<SandboxLifecycle, std::string_view>, 7> kNames = {{
    {kNew, "new"},
    {kStarting, "starting"},
    {kAssigned, "assigned"},
    {kBusy, "busy"},
    {kIdle, "idle"},
    {kDeleted, "deleted"},
    {kDead, "dead"},
}};

// Every allowed transition; anything else is a bug in the caller.
constexpr std::array<std::pair<SandboxLifecycle, SandboxLifecycle>, 15> kAllowed = {{
    {kNew, kStarting},
    {kStarting, kAssigned},
    {kStarting, kDead},  // creation failed or the sandbox died while being prepared
    {kAssigned, kBusy},
    {kAssigned, kDeleted},
    {kAssigned, kDead},
    {kBusy, kIdle},
    {kBusy, kDeleted},  // shutdown or eviction during a turn
    {kBusy, kDead},
    {kIdle, kBusy},
    {kIdle, kDeleted},
    {kIdle, kDead},
    {kDeleted, kStarting},
    {kDead, kStarting},
    {kDead, kDeleted},  // the remains of a dead sandbox removed without a replacement
}};

}  // namespace

std::string_view to_string(SandboxLifecycle state) {
  for (const auto& [value, name] : kNames) {
    if (value == state) return name;
  }
  return "unknown";
}

std::optional<SandboxLifecycle> lifecycle_from_string(std::string_view text) {
  for (const auto& [value, name] : kNames) {
    if (name == text) return value;
  }
  return std::nullopt;
}

bool can_transition(SandboxLifecycle from, SandboxLifecycle to) {
  for (const auto& [allowed_from, allowed_to] : kAllowed) {
    if (allowed_from == from && allowed_to == to) return true;
  }
  return false;
}

Result<void> check_transition(SandboxLifecycle from, SandboxLifecycle to) {
  if (can_transition(from, to)) return {};
  return make_error(ErrorCode::kFailedPrecondition, "illegal sandbox transition {} -> {}",
                    to_string(from), to_string(to));
}

bool holds_sandbox(SandboxLifecycle state) {
  return state == kAssigned || state == kBusy || state == kIdle;
}

}  // namespace quarry::conversation

// The lifecycle of a conversation's sandbox as an explicit state machine (DESIGN.md "Sandbox
// lifecycle"):
//
//   new -> starting -> assigned -> busy <-> idle -> deleted -> starting ...
//   starting, assigned, busy, idle -> dead -> starting (a replacement, on next need)
//
// starting: the provider creates and prepares it; assigned: ready, not yet used by a turn;
// busy: a turn is using it; idle: kept for the next turn; deleted: removed on purpose (idle,
// shutdown, evicted, orphan); dead: found gone (killed, crashed, deleted behind our back).
#pragma once

#include <optional>
#include <string_view>

#include "common/error.h"

namespace quarry::conversation {

enum class SandboxLifecycle { kNew, kStarting, kAssigned, kBusy, kIdle, kDeleted, kDead };

std::string_view to_string(SandboxLifecycle state);
std::optional<SandboxLifecycle> lifecycle_from_string(std::string_view text);

bool can_transition(SandboxLifecycle from, SandboxLifecycle to);
// kFailedPrecondition naming both states when the transition is not allowed.
Result<void> check_transition(SandboxLifecycle from, SandboxLifecycle to);

// Whether a sandbox exists in this state (one to reuse, check or delete).
bool holds_sandbox(SandboxLifecycle state);

}  // namespace quarry::conversation

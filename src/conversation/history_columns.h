// How the history stores write a value in a column and read it back, the same in SQLite and in
// PostgreSQL: the words of roles, turn kinds and statuses, JSON as text, a conversation's
// network; and the records as rows: their columns in order, and each read from a row of either
// store (`Row` has text, integer, real, boolean and is_null by column).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "common/clock.h"
#include "conversation/history_store.h"
#include "sandbox/metering.h"

namespace quarry::conversation {

// The inverses of to_string; a word no store writes reads as user, ask and failed.
Role role_from(std::string_view text);
TurnKind turn_kind_from(std::string_view text);
TurnStatus turn_status_from(std::string_view text);

// JSON as a column holds it (invalid UTF-8 replaced, so the text is always valid JSON).
std::string json_text(const nlohmann::json& value);
// Null for text that does not parse.
nlohmann::json json_from_text(std::string_view text);

// A conversation's network as its column holds it: 'none', or the domains separated by spaces
// (an entry never has one).
std::string network_text(const NetworkPolicy& network);
NetworkPolicy network_from(std::string_view text);

// A list of names (a sandbox reference's files, a conversation's packages) from its JSON text;
// empty when it is not a list, non-strings left out.
std::vector<std::string> names_from_text(std::string_view text);

// Conversation ids name files (the SQLite store's turn locks), so both stores refuse the same
// ones.
bool valid_conversation_id(std::string_view id);

// A conversation is these columns, in this order, of conversations.
inline constexpr std::string_view kConversationColumns =
    "id, title, turns, created_at, updated_at, owner, network, packages";

template <typename Row>
Conversation conversation_from(const Row& row) {
  Conversation conversation{row.text(0),
                            row.text(1),
                            static_cast<int>(row.integer(2)),
                            from_unix_ms(row.integer(3)),
                            from_unix_ms(row.integer(4)),
                            row.text(5),
                            std::nullopt,
                            {}};
  if (!row.is_null(6)) conversation.network = network_from(row.text(6));
  conversation.packages = names_from_text(row.text(7));
  return conversation;
}

inline constexpr std::string_view kTurnColumns =
    "number, kind, status, error, started_at, finished_at";

template <typename Row>
TurnRecord turn_from(const Row& row, int first) {
  TurnRecord turn;
  turn.number = static_cast<int>(row.integer(first));
  turn.kind = turn_kind_from(row.text(first + 1));
  turn.status = turn_status_from(row.text(first + 2));
  turn.error = row.text(first + 3);
  turn.started_at = from_unix_ms(row.integer(first + 4));
  if (!row.is_null(first + 5)) turn.finished_at = from_unix_ms(row.integer(first + 5));
  return turn;
}

// An exec record is these columns of execs, in this order, each after `prefix` (a table
// alias); `with_output` false reads empty stdout and stderr (lists of many executions leave out
// up to 2 MiB of output each).
std::string exec_columns(bool with_output, std::string_view prefix = "");

template <typename Row>
ExecRecord exec_from(const Row& row, int first) {
  ExecRecord exec;
  exec.id = row.integer(first);
  exec.turn = static_cast<int>(row.integer(first + 1));
  exec.tool_call_id = row.text(first + 2);
  exec.tool = row.text(first + 3);
  exec.sandbox_id = row.text(first + 4);
  exec.command = row.text(first + 5);
  auto& r = exec.result;
  r.exit_code = static_cast<int>(row.integer(first + 6));
  if (!row.is_null(first + 7)) r.signal = static_cast<int>(row.integer(first + 7));
  r.stdout_text = row.text(first + 8);
  r.stderr_text = row.text(first + 9);
  r.truncated = row.boolean(first + 10);
  r.run_ms = row.real(first + 11);
  r.cpu_ms = row.real(first + 12);
  r.peak_memory_bytes = static_cast<uint64_t>(row.integer(first + 13));
  r.memory_limit_bytes = static_cast<uint64_t>(row.integer(first + 14));
  r.overhead_ms = row.real(first + 15);
  r.oom = row.boolean(first + 16);
  r.timed_out = row.boolean(first + 17);
  if (!row.is_null(first + 18)) r.message = row.text(first + 18);
  exec.started_at = from_unix_ms(row.integer(first + 19));
  r.denied_connections = static_cast<uint64_t>(row.integer(first + 20));
  r.denials = sandbox::denials_from_json(json_from_text(row.text(first + 21)));
  return exec;
}

inline constexpr std::string_view kArtifactColumns =
    "id, turn, tool_call_id, name, type, size_bytes, location, created_at";

template <typename Row>
Artifact artifact_from(const Row& row, int first) {
  Artifact artifact;
  artifact.id = row.integer(first);
  artifact.turn = static_cast<int>(row.integer(first + 1));
  artifact.tool_call_id = row.text(first + 2);
  artifact.name = row.text(first + 3);
  artifact.type = row.text(first + 4);
  artifact.size_bytes = static_cast<uint64_t>(row.integer(first + 5));
  artifact.location = row.text(first + 6);
  artifact.created_at = from_unix_ms(row.integer(first + 7));
  return artifact;
}

// A sandbox reference is these columns, in this order, of sandbox_references.
inline constexpr std::string_view kReferenceColumns =
    "state, sandbox_id, last_used_at, files, kernel_names, kernel";

// The reference whose kReferenceColumns start at column `first` of `row`.
template <typename Row>
SandboxReference reference_from(const Row& row, int first) {
  SandboxReference reference;
  reference.state = row.text(first);
  reference.sandbox_id = row.text(first + 1);
  if (!row.is_null(first + 2)) reference.last_used_at = from_unix_ms(row.integer(first + 2));
  reference.files = names_from_text(row.text(first + 3));
  reference.kernel_names = names_from_text(row.text(first + 4));
  reference.kernel = row.text(first + 5);
  return reference;
}

inline constexpr std::string_view kMessageColumns =
    "id, turn, role, content, tool_calls, tool_call_id, details, created_at";

template <typename Row>
Message message_from(const Row& row) {
  Message message;
  message.id = row.integer(0);
  message.turn = static_cast<int>(row.integer(1));
  message.role = role_from(row.text(2));
  message.content = row.text(3);
  if (!row.is_null(4)) message.tool_calls = json_from_text(row.text(4));
  message.tool_call_id = row.text(5);
  if (!row.is_null(6)) message.details = json_from_text(row.text(6));
  message.created_at = from_unix_ms(row.integer(7));
  return message;
}

inline constexpr std::string_view kEventColumns =
    "id, turn, kind, sandbox_id, reason, details, created_at";

template <typename Row>
Event event_from(const Row& row) {
  return Event{row.integer(0),
               static_cast<int>(row.integer(1)),
               row.text(2),
               row.text(3),
               row.text(4),
               json_from_text(row.text(5)),
               from_unix_ms(row.integer(6))};
}

}  // namespace quarry::conversation

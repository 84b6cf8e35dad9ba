#include "conversation/history_columns.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/json.h"

namespace quarry::conversation {

std::string_view to_string(TurnKind kind) {
  return kind == TurnKind::kCell ? "cell" : "ask";
}

std::string_view to_string(TurnStatus status) {
  switch (status) {
    case TurnStatus::kRunning:
      return "running";
    case TurnStatus::kCompleted:
      return "completed";
    case TurnStatus::kFailed:
      return "failed";
    case TurnStatus::kCancelled:
      return "cancelled";
    case TurnStatus::kInterrupted:
      return "interrupted";
  }
  return "failed";
}

std::string_view to_string(Role role) {
  switch (role) {
    case Role::kUser:
      return "user";
    case Role::kAssistant:
      return "assistant";
    case Role::kTool:
      return "tool";
  }
  return "user";
}

Role role_from(std::string_view text) {
  if (text == "assistant") return Role::kAssistant;
  if (text == "tool") return Role::kTool;
  return Role::kUser;
}

TurnKind turn_kind_from(std::string_view text) {
  return text == "cell" ? TurnKind::kCell : TurnKind::kAsk;
}

TurnStatus turn_status_from(std::string_view text) {
  for (auto status : {TurnStatus::kRunning, TurnStatus::kCompleted, TurnStatus::kFailed,
                      TurnStatus::kCancelled, TurnStatus::kInterrupted}) {
    if (to_string(status) == text) return status;
  }
  return TurnStatus::kFailed;
}

std::string json_text(const nlohmann::json& value) {
  return value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

nlohmann::json json_from_text(std::string_view text) {
  auto value = parse_json_or_discarded(text);
  return value.is_discarded() ? nlohmann::json(nullptr) : value;
}

std::string network_text(const NetworkPolicy& network) {
  if (network.mode == NetworkMode::kNone) return "none";
  return fmt::format("{}", fmt::join(network.allow, " "));
}

NetworkPolicy network_from(std::string_view text) {
  if (text == "none") return {};
  NetworkPolicy network{NetworkMode::kAllowlist, {}};
  while (!text.empty()) {
    const size_t space = text.find(' ');
    if (space != 0) network.allow.emplace_back(text.substr(0, space));
    if (space == std::string_view::npos) break;
    text.remove_prefix(space + 1);
  }
  return network;
}

std::vector<std::string> names_from_text(std::string_view text) {
  std::vector<std::string> names;
  const auto list = json_from_text(text);
  if (!list.is_array()) return names;
  for (const auto& name : list) {
    if (name.is_string()) names.push_back(name.get<std::string>());
  }
  return names;
}

bool valid_conversation_id(std::string_view id) {
  return !id.empty() && id.find_first_of("/.") == std::string_view::npos;
}

std::string exec_columns(bool with_output, std::string_view prefix) {
  std::vector<std::string> columns;
  for (std::string_view column : {"id",
                                  "turn",
                                  "tool_call_id",
                                  "tool",
                                  "sandbox_id",
                                  "command",
                                  "exit_code",
                                  "signal",
                                  "stdout",
                                  "stderr",
                                  "truncated",
                                  "run_ms",
                                  "cpu_ms",
                                  "peak_memory_bytes",
                                  "memory_limit_bytes",
                                  "overhead_ms",
                                  "oom",
                                  "timed_out",
                                  "message",
                                  "started_at",
                                  "denied_connections",
                                  "denials"}) {
    const bool output = column == "stdout" || column == "stderr";
    columns.push_back(output && !with_output ? std::string("''")
                                             : fmt::format("{}{}", prefix, column));
  }
  return fmt::format("{}", fmt::join(columns, ", "));
}

}  // namespace quarry::conversation

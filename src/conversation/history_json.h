// The history as JSON, one shape for everyone who shows it: `quarry conversations show --json`
// and the HTTP API (whose OpenAPI document, src/server/openapi.yaml, describes these objects).
// Times are RFC 3339 in UTC with milliseconds; host paths are never included.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "conversation/history_store.h"

namespace quarry::conversation {

// "2026-11-30T20:01:02.345Z"
std::string format_time(Clock::time_point time);

nlohmann::json to_json(const Conversation& conversation);
nlohmann::json to_json(const TurnRecord& turn);
nlohmann::json to_json(const Message& message);
nlohmann::json to_json(const Event& event);
// `with_output` false leaves out stdout and stderr (lists of many executions).
nlohmann::json to_json(const ExecRecord& exec, bool with_output = true);
nlohmann::json to_json(const Artifact& artifact);
nlohmann::json to_json(const ExecTotals& totals);
nlohmann::json to_json(const SandboxReference& reference);

// Everything of one conversation: its fields, "sandbox", "turns", "messages", "events", "execs"
// and "artifacts", each in the order it happened.
Result<nlohmann::json> conversation_document(HistoryStore& history, std::string_view id);

}  // namespace quarry::conversation

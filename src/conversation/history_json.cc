#include "conversation/history_json.h"

#include <fmt/chrono.h>

#include "sandbox/metering.h"

namespace quarry::conversation {
namespace {

nlohmann::json text_or_null(const std::string& text) {
  return text.empty() ? nlohmann::json(nullptr) : nlohmann::json(text);
}

}  // namespace

std::string format_time(Clock::time_point time) {
  const auto ms = std::chrono::time_point_cast<std::chrono::milliseconds>(time);
  const auto seconds = std::chrono::time_point_cast<std::chrono::seconds>(ms);
  return fmt::format("{:%Y-%m-%dT%H:%M:%S}.{:03}Z",
                     fmt::gmtime(std::chrono::system_clock::to_time_t(seconds)),
                     (ms - seconds).count());
}

nlohmann::json to_json(const Conversation& conversation) {
  nlohmann::json network = nullptr;
  if (conversation.network) {
    network = conversation.network->mode == NetworkMode::kNone
                  ? nlohmann::json{{"mode", "none"}}
                  : nlohmann::json{{"mode", "allowlist"}, {"allow", conversation.network->allow}};
  }
  return {{"id", conversation.id},
          {"title", conversation.title},
          {"turns", conversation.turns},
          {"created_at", format_time(conversation.created_at)},
          {"updated_at", format_time(conversation.updated_at)},
          {"network", std::move(network)},
          {"packages", conversation.packages}};
}

nlohmann::json to_json(const TurnRecord& turn) {
  return {
      {"number", turn.number},
      {"kind", to_string(turn.kind)},
      {"status", to_string(turn.status)},
      {"error", text_or_null(turn.error)},
      {"started_at", format_time(turn.started_at)},
      {"finished_at", turn.finished_at ? nlohmann::json(format_time(*turn.finished_at)) : nullptr}};
}

nlohmann::json to_json(const Message& message) {
  nlohmann::json calls = nullptr;
  if (message.tool_calls.is_array()) {
    calls = nlohmann::json::array();
    for (const auto& call : message.tool_calls) {
      calls.push_back({{"id", call.value("id", "")},
                       {"name", call.value("name", "")},
                       {"arguments", call.value("arguments", "")}});
    }
  }
  return {{"id", message.id},
          {"turn", message.turn},
          {"role", to_string(message.role)},
          {"content", message.content},
          {"tool_calls", calls},
          {"tool_call_id", text_or_null(message.tool_call_id)},
          {"details", message.details.is_object() ? message.details : nlohmann::json(nullptr)},
          {"created_at", format_time(message.created_at)}};
}

nlohmann::json to_json(const Event& event) {
  return {{"id", event.id},
          {"turn", event.turn},
          {"kind", event.kind},
          {"sandbox_id", event.sandbox_id},
          {"reason", event.reason},
          {"details", event.details.is_object() ? event.details : nlohmann::json::object()},
          {"created_at", format_time(event.created_at)}};
}

nlohmann::json to_json(const ExecRecord& exec, bool with_output) {
  nlohmann::json json = sandbox::to_json(exec.result);
  if (!with_output) {
    json.erase("stdout");
    json.erase("stderr");
  }
  json["id"] = exec.id;
  json["turn"] = exec.turn;
  json["tool_call_id"] = text_or_null(exec.tool_call_id);
  json["tool"] = text_or_null(exec.tool);
  json["sandbox_id"] = exec.sandbox_id;
  json["command"] = exec.command;
  json["started_at"] = format_time(exec.started_at);
  return json;
}

nlohmann::json to_json(const Artifact& artifact) {
  return {{"id", artifact.id},
          {"turn", artifact.turn},
          {"tool_call_id", text_or_null(artifact.tool_call_id)},
          {"name", artifact.name},
          {"type", artifact.type},
          {"size_bytes", artifact.size_bytes},
          {"created_at", format_time(artifact.created_at)}};
}

nlohmann::json to_json(const ExecTotals& totals) {
  return {{"steps", totals.steps},
          {"run_ms", totals.run_ms},
          {"cpu_ms", totals.cpu_ms},
          {"overhead_ms", totals.overhead_ms},
          {"max_peak_memory_bytes", totals.max_peak_memory_bytes},
          {"ooms", totals.ooms},
          {"timeouts", totals.timeouts},
          {"failures", totals.failures}};
}

nlohmann::json to_json(const SandboxReference& reference) {
  return {{"state", reference.state},
          {"sandbox_id", text_or_null(reference.sandbox_id)},
          {"last_used_at",
           reference.last_used_at ? nlohmann::json(format_time(*reference.last_used_at)) : nullptr},
          {"files", reference.files}};
}

Result<nlohmann::json> conversation_document(HistoryStore& history, std::string_view id) {
  ASSIGN_OR_RETURN(auto conversation, history.conversation(id));
  ASSIGN_OR_RETURN(auto reference, history.sandbox_reference(conversation.id));
  ASSIGN_OR_RETURN(auto turns, history.turns(conversation.id));
  ASSIGN_OR_RETURN(auto messages, history.messages(conversation.id));
  ASSIGN_OR_RETURN(auto events, history.events(conversation.id));
  ASSIGN_OR_RETURN(auto execs, history.execs(conversation.id));
  ASSIGN_OR_RETURN(auto artifacts, history.artifacts(conversation.id));
  nlohmann::json document = to_json(conversation);
  document["sandbox"] = to_json(reference);
  auto list = [](const auto& items) {
    nlohmann::json json = nlohmann::json::array();
    for (const auto& item : items)
      json.push_back(to_json(item));
    return json;
  };
  document["turns"] = list(turns);
  document["messages"] = list(messages);
  document["events"] = list(events);
  document["execs"] = list(execs);
  document["artifacts"] = list(artifacts);
  return document;
}

}  // namespace quarry::conversation

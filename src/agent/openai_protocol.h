// OpenAI's chat-completions wire format in JSON: messages, tools, requests, complete
// (non-streamed) responses and error bodies. Streamed chunks: stream_assembler.h.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "agent/chat.h"
#include "common/error.h"

namespace quarry::agent {

nlohmann::json to_json(const ChatMessage& message);
nlohmann::json to_json(const ToolSchema& tool);  // {"type": "function", "function": {...}}

// A message as a server or a client sends it. Content may be a string, null, or a list of
// parts ({"type": "text", "text": ...}), whose texts are joined.
Result<ChatMessage> message_from_json(const nlohmann::json& json);

struct RequestOptions {
  std::string model{};
  std::optional<double> temperature{};
  bool stream = true;  // with "stream_options": {"include_usage": true}
};

// The body of POST /chat/completions. "tools" is left out when there are none (some servers
// refuse an empty list).
nlohmann::json chat_request_json(const ChatRequest& request, const RequestOptions& options);

Usage usage_from_json(const nlohmann::json& usage);

// A complete "chat.completion" object (a request with "stream": false, or a server that
// ignored "stream": true). Tool calls without an id are named (name_unnamed_tool_calls).
Result<ChatResponse> chat_response_from_json(const nlohmann::json& json);

// Gives a tool call the server sent without an id (some local servers do) an id of its own,
// "call_<random>_<i>", so its result can refer to it.
void name_unnamed_tool_calls(ChatMessage& message);

// The human part of an error body: {"error": {"message": ...}} (OpenAI, vLLM, llama.cpp),
// {"error": "..."} (Ollama), {"detail": ...} or {"message": ...}; else the body's text,
// shortened. "" for an empty body.
std::string error_message_from_body(std::string_view body);

// The "code" or "type" of an OpenAI error body ("insufficient_quota"), or "".
std::string error_code_from_body(std::string_view body);

}  // namespace quarry::agent

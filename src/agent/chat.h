// The chat-completions vocabulary the agent and its model clients share: messages, tool calls,
// tool schemas, a request and a response.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace quarry::agent {

// Every member has a default, so designated initializers may name only what they set:
// ChatMessage{.role = "user", .content = "..."}.

struct ToolCall {
  std::string id{};
  std::string name{};
  // JSON text as the model sent it. It may be invalid JSON: the caller tells the model so.
  std::string arguments{};
};

struct ChatMessage {
  std::string role{};  // system | user | assistant | tool
  std::string content{};
  std::vector<ToolCall> tool_calls{};  // assistant
  std::string tool_call_id{};          // tool
};

struct ToolSchema {
  std::string name{};
  std::string description{};
  nlohmann::json parameters{};  // JSON Schema of the arguments object
};

struct ChatRequest {
  std::vector<ChatMessage> messages{};
  std::vector<ToolSchema> tools{};
};

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
};

struct ChatResponse {
  ChatMessage message{};        // role "assistant"
  std::string finish_reason{};  // stop | tool_calls | length | content_filter | ...
  Usage usage{};                // zeros when the server does not report it
};

}  // namespace quarry::agent

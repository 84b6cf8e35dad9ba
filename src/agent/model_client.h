// The model: OpenAI-compatible chat completions with tool calling, streamed.
// (Interface only here; the client itself arrives with the model-client branch.)
#pragma once

#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/error.h"

namespace quarry::agent {

struct ToolCall {
  std::string id;
  std::string name;
  std::string arguments;  // JSON text as the model sent it
};

struct ChatMessage {
  std::string role;  // system | user | assistant | tool
  std::string content;
  std::vector<ToolCall> tool_calls;  // assistant
  std::string tool_call_id;          // tool
};

struct ToolSchema {
  std::string name;
  std::string description;
  nlohmann::json parameters;
};

struct ChatRequest {
  std::vector<ChatMessage> messages;
  std::vector<ToolSchema> tools;
};

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
};

struct ChatResponse {
  ChatMessage message;
  std::string finish_reason;
  Usage usage;
};

class ModelClient {
 public:
  virtual ~ModelClient() = default;
  virtual Result<ChatResponse> complete(const ChatRequest& request,
                                        const std::function<void(std::string_view)>& on_text,
                                        int cancel_fd = -1) = 0;
};

}  // namespace quarry::agent

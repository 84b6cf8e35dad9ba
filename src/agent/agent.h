// The agent loop: one turn of a conversation, from the user's words to an answer, in bounded
// steps of model calls and tool calls. Everything that happens is recorded in the history and
// streamed as events (assistant text, tool call, tool result, artifact, done, error) that the
// CLI, and later the HTTP API, show.
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "agent/model_client.h"
#include "agent/tools.h"
#include "conversation/context_filter.h"
#include "conversation/conversation_manager.h"

namespace quarry::agent {

struct AgentEvent {
  enum class Kind { kText, kToolCall, kToolResult, kArtifact, kDone, kError };
  Kind kind = Kind::kText;
  int step = 0;
  std::string text;  // kText: a piece of the answer as it streams; kDone: the answer; kError
  std::string tool;  // kToolCall, kToolResult
  std::string tool_call_id;
  std::string arguments;                             // kToolCall: as the model sent them
  const ToolResult* result = nullptr;                // kToolResult
  const conversation::Artifact* artifact = nullptr;  // kArtifact
};

struct AgentOptions {
  int max_steps = 12;  // model calls per turn
  conversation::ContextOptions context;
  std::string output_dir = "/home/sandbox/outputs";  // where answers may name files
};

// The options `config` gives: model.max_steps, the context budget, the output directory.
AgentOptions agent_options(const Config& config);

class Agent {
 public:
  Agent(ModelClient& model, conversation::ConversationManager& manager,
        conversation::HistoryStore& history, Toolbox& toolbox, std::string system_prompt,
        AgentOptions options);

  // Runs one turn of `conversation_id` and returns the answer. Refused (kAborted) while another
  // turn of the conversation runs. `cancel_fd` readable stops it (kCancelled).
  Result<std::string> run_turn(std::string_view conversation_id, std::string_view user_message,
                               const std::function<void(const AgentEvent&)>& on_event,
                               int cancel_fd = -1);

 private:
  std::vector<ChatMessage> context(const std::string& conversation_id) const;
  // What the system finds wrong with a final answer (files it names that were never written).
  std::vector<std::string> check_answer(conversation::Turn& turn, std::string_view answer) const;

  ModelClient& model_;
  conversation::ConversationManager& manager_;
  conversation::HistoryStore& history_;
  Toolbox& toolbox_;
  std::string system_prompt_;
  AgentOptions options_;
};

}  // namespace quarry::agent

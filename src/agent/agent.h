// The agent loop: one turn of a conversation, from the user's words to an answer, in bounded
// steps of model calls and tool calls; and cells, single steps the user runs without the model.
// Everything that happens is recorded in the history and streamed as events (assistant text,
// tool call, output, tool result, artifact, sandbox event, done, error) that the CLI and the
// HTTP API show.
#pragma once

#include <functional>
#include <optional>
#include <set>
#include <string>

#include "agent/model_client.h"
#include "agent/tools.h"
#include "conversation/context_filter.h"
#include "conversation/conversation_manager.h"

namespace quarry::agent {

struct AgentEvent {
  enum class Kind { kText, kToolCall, kOutput, kToolResult, kArtifact, kSandbox, kDone, kError };
  Kind kind = Kind::kText;
  int step = 0;
  // kText: a piece of the answer as it streams; kOutput: a piece of a command's output;
  // kDone: the answer; kError: what went wrong
  std::string text;
  std::string tool;  // kToolCall, kOutput, kToolResult
  std::string tool_call_id;
  std::string arguments;  // kToolCall: as the model sent them
  sandbox::OutputStream stream = sandbox::OutputStream::kStdout;  // kOutput
  const ToolResult* result = nullptr;                             // kToolResult
  const conversation::Artifact* artifact = nullptr;               // kArtifact
  const conversation::Event* sandbox_event = nullptr;             // kSandbox
  ErrorCode error_code = ErrorCode::kInternal;                    // kError
};

using AgentEventSink = std::function<void(const AgentEvent&)>;

struct AgentOptions {
  int max_steps = 12;  // model calls per turn
  conversation::ContextOptions context;
  std::string output_dir = "/home/sandbox/outputs";  // where answers may name files
};

// The options `config` gives: model.max_steps, the context budget, the output directory.
AgentOptions agent_options(const Config& config);

// The files under `output_dir` that a text names, as paths below it: "outputs/chart.png" or
// "/home/sandbox/outputs/plots/a.svg" -> "chart.png", "plots/a.svg" (the answer check).
std::set<std::string> named_outputs(std::string_view text, const std::string& output_dir);

// A step the user runs without the model, recorded like one of its tool steps.
struct Cell {
  enum class Kind { kPython, kSqlQuery, kSqlExport };
  Kind kind = Kind::kPython;
  std::string code;
  std::string filename;  // kSqlExport: the Parquet file to write in the data directory
};

// "python", "sql_query", "sql_export"; parsing refuses anything else, naming the kinds.
std::string_view to_string(Cell::Kind kind);
Result<Cell::Kind> cell_kind_from(std::string_view text);
// What is wrong with a cell before it runs (no code, a filename where none belongs, ...).
Result<void> check_cell(const Cell& cell);

// Every tool call of the history answered: a call whose result was never recorded (its process
// died while it ran) gets a result saying so, in its own turn. The model's history is then
// valid for any OpenAI-compatible server. Returns how many results were added.
Result<int> close_unanswered_calls(conversation::HistoryStore& history,
                                   std::string_view conversation_id);

class Agent {
 public:
  Agent(ModelClient* model, conversation::ConversationManager& manager,
        conversation::HistoryStore& history, Toolbox& toolbox, std::string system_prompt,
        AgentOptions options);

  // Runs one turn, begun by the caller (ConversationManager::begin_turn), and records how it
  // ended. `cancel_fd` readable stops it: the model call is closed, a running command killed
  // (kCancelled). Needs a model (kFailedPrecondition without one).
  Result<std::string> run_turn(conversation::Turn& turn, std::string_view user_message,
                               const AgentEventSink& on_event, int cancel_fd = -1);
  // The same, beginning the conversation's next turn first: refused (kAborted) while another
  // turn of the conversation runs.
  Result<std::string> run_turn(std::string_view conversation_id, std::string_view user_message,
                               const AgentEventSink& on_event, int cancel_fd = -1);

  // Runs a cell in the turn (of kind kCell) as a tool step, recorded and streamed as one, and
  // records how the turn ended. The model is not asked. Returns the step's result.
  Result<ToolResult> run_cell(conversation::Turn& turn, const Cell& cell,
                              const AgentEventSink& on_event, int cancel_fd = -1);

 private:
  std::vector<ChatMessage> context(const std::string& conversation_id) const;
  // What the system finds wrong with a final answer (files it names that were never written).
  std::vector<std::string> check_answer(conversation::Turn& turn, std::string_view answer) const;
  Result<std::string> loop(conversation::Turn& turn, std::string_view user_message,
                           const AgentEventSink& emit, int cancel_fd);
  // Runs one tool call as a step of the turn: streamed, recorded with its outcome.
  Result<ToolResult> step(conversation::Turn& turn, int step, const ToolCall& call,
                          const AgentEventSink& emit, int cancel_fd);

  ModelClient* model_;
  conversation::ConversationManager& manager_;
  conversation::HistoryStore& history_;
  Toolbox& toolbox_;
  std::string system_prompt_;
  AgentOptions options_;
};

}  // namespace quarry::agent

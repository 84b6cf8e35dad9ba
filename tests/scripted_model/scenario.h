// Scenario files of the scripted model server: the assistant replies of a conversation in
// order, with branches on what the last tool result said, expectations about the request, and
// faults to inject. The format is described in README.md.
#pragma once

#include <chrono>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "agent/chat.h"
#include "common/error.h"
#include "common/units.h"

namespace quarry::scripted_model {

// What the server looks at in a request.
struct Conversation {
  std::vector<agent::ChatMessage> messages;
  std::vector<std::string> tools;  // names of the tools the request offers
};

// Checks on a request; every listed text must be contained (all of them, when a list).
struct Condition {
  std::vector<std::string> system_contains;            // any system message
  std::vector<std::string> last_user_contains;         // the last user message
  std::vector<std::string> last_tool_result_contains;  // the last tool message
  std::vector<std::string> last_tool_result_lacks;     // ... must not contain
  std::vector<std::string> any_tool_result_contains;   // some tool message
  std::vector<std::string> tools;                      // the request offers these tools

  bool empty() const;
  // "" when the request satisfies every check, else what was expected and what was there.
  std::string failure(const Conversation& conversation) const;
};

struct ScriptedToolCall {
  std::string id;  // "" = "call_<step>_<n>"
  std::string name;
  std::string arguments;  // JSON text, sent as is (it may be invalid on purpose)
};

struct Reply {
  std::string content;
  std::vector<ScriptedToolCall> tool_calls;
  std::string finish_reason;  // "" = "tool_calls" when there are calls, else "stop"
};

struct Alternative {
  Condition when;
  Reply reply;
  int line = 0;
};

// A failure the server answers with instead of the reply, for the first `times` requests that
// reach the step (counted per server process).
struct Fault {
  int status = 0;           // HTTP status, e.g. 429 or 503
  std::string retry_after;  // the Retry-After header, as written ("" = none)
  std::string message;      // the error body's message
  bool disconnect = false;  // close the connection without answering instead
  int times = 1;
};

struct Step {
  int line = 0;
  Condition expect;                 // else HTTP 400 naming the difference
  std::vector<Alternative> choose;  // first match wins ...
  std::optional<Reply> otherwise;   // ... else this; without `choose`, the reply itself
  std::optional<Fault> fail;
  Duration delay{0};        // before the answer's headers
  Duration chunk_delay{0};  // between streamed chunks
  bool stall = false;       // stream the first chunk, then nothing more
  size_t chunk_size = 0;    // bytes of content per chunk; 0 = the server's default
};

struct Scenario {
  std::string name;  // the file's stem
  std::string source;
  std::string description;
  std::vector<Step> steps;
};

Result<Scenario> parse_scenario(std::string_view yaml, std::string_view source,
                                std::string_view name);
Result<Scenario> load_scenario(const std::filesystem::path& path);

// The step for a request: the number of assistant messages it already holds.
Result<size_t> step_index(const Scenario& scenario, const Conversation& conversation);

// The reply of `step` for this request (its `choose` evaluated), or an error saying which
// alternatives did not match and why.
Result<const Reply*> choose_reply(const Scenario& scenario, size_t index,
                                  const Conversation& conversation);

}  // namespace quarry::scripted_model

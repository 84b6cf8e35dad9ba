// Builds one assistant message from the "chat.completion.chunk" objects of a streamed chat
// completion: text deltas in order, tool-call deltas joined by their index, finish reason and
// usage.
#pragma once

#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string_view>

#include "agent/chat.h"
#include "common/error.h"

namespace quarry::agent {

class StreamAssembler {
 public:
  using TextHandler = std::function<void(std::string_view)>;

  // Takes one chunk; text deltas go to `on_text` (if set) right away. A chunk carrying
  // {"error": ...} is a kUnavailable error with the server's message; a chunk of the wrong
  // shape is kInternal.
  Result<void> add(const nlohmann::json& chunk, const TextHandler& on_text);

  // True once a choice reported its finish_reason.
  bool finished() const { return !response_.finish_reason.empty(); }

  // The message so far. Tool calls the server sent without an id get "call_<index>", so every
  // tool result can name its call.
  ChatResponse take();

 private:
  Result<void> add_tool_call_delta(const nlohmann::json& delta);

  ChatResponse response_;
  std::map<int64_t, size_t> call_by_index_;  // the delta's "index" -> position in tool_calls
};

}  // namespace quarry::agent

// The scripted model's answers in OpenAI's format: one "chat.completion" object, or the data
// payloads of a stream of "chat.completion.chunk" objects with text and tool-call arguments
// cut into several pieces, so clients have to assemble them.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "agent/chat.h"
#include "scenario.h"

namespace quarry::scripted_model {

struct ReplyContext {
  std::string id;     // "chatcmpl-..."
  std::string model;  // as the request named it
  int64_t created = 0;
  size_t step = 0;        // names tool calls without an id: call_<step>_<n>
  size_t chunk_size = 8;  // bytes of content per chunk
  bool include_usage = false;
  agent::Usage usage;
};

// Cuts `text` into pieces of at most `size` bytes, never inside a UTF-8 character.
std::vector<std::string> split_utf8(std::string_view text, size_t size);

nlohmann::json completion_json(const Reply& reply, const ReplyContext& context);

// The "data:" payloads of the stream, ending with "[DONE]".
std::vector<std::string> stream_events(const Reply& reply, const ReplyContext& context);

// A rough token count (4 bytes a token), for the usage the server reports.
int64_t estimate_tokens(std::string_view text);

}  // namespace quarry::scripted_model

// ContextFilter: what the model sees of a conversation's history. The store keeps every
// message whole; the model gets them in order, with long tool outputs cut around a marker,
// bulky results of older turns reduced to a line that says what was there, and, when the
// whole is still over budget, the oldest turns left out entirely (never the current one).
#pragma once

#include <string>
#include <vector>

#include "conversation/history_store.h"

namespace quarry::conversation {

struct ContextOptions {
  // Sizes are in characters; a token is about four.
  size_t budget_chars = 96'000;
  size_t tool_output_chars = 8'000;   // a tool result longer than this keeps its head and tail
  size_t old_result_chars = 1'000;    // older turns' results longer than this become a summary
  size_t old_argument_chars = 2'000;  // and their long tool-call arguments are cut
  int recent_turns = 2;               // the latest turns, kept as they are (but for cutting)
};

std::vector<Message> filter_context(const std::vector<Message>& history,
                                    const ContextOptions& options);

// "[... 12345 characters cut ...]" joins the head and tail of `text` when it is longer than
// `limit`; otherwise `text` unchanged.
std::string cut_middle(std::string_view text, size_t limit);

}  // namespace quarry::conversation

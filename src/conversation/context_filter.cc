#include "conversation/context_filter.h"

#include <algorithm>
#include <map>

#include "common/json.h"
#include "common/text.h"

namespace quarry::conversation {
namespace {

size_t size_of(const Message& message) {
  return message.content.size() +
         (message.tool_calls.is_null() ? 0 : message.tool_calls.dump().size());
}

// Cuts long string values inside a tool call's JSON arguments, keeping the JSON valid.
void cut_arguments(nlohmann::json& tool_calls, size_t limit) {
  if (!tool_calls.is_array()) return;
  for (auto& call : tool_calls) {
    if (!call.contains("arguments") || !call["arguments"].is_string()) continue;
    const std::string text = call["arguments"].get<std::string>();
    if (text.size() <= limit) continue;
    auto arguments = parse_json_or_discarded(text);
    if (!arguments.is_object()) {
      call["arguments"] = nlohmann::json({{"omitted", cut_middle(text, limit)}}).dump();
      continue;
    }
    for (auto& [key, value] : arguments.items()) {
      if (value.is_string() && value.get<std::string>().size() > limit / 4) {
        value = cut_middle(value.get<std::string>(), limit / 4);
      }
    }
    call["arguments"] = arguments.dump();
  }
}

}  // namespace

std::string cut_middle(std::string_view text, size_t limit) {
  if (text.size() <= limit) return std::string(text);
  const std::string_view head = utf8_head(text, limit * 3 / 5);
  const std::string_view tail = utf8_tail(text, limit - limit * 3 / 5);
  return fmt::format("{}\n[... {} characters cut; the full text is kept in the history ...]\n{}",
                     head, text.size() - head.size() - tail.size(), tail);
}

std::vector<Message> filter_context(const std::vector<Message>& history,
                                    const ContextOptions& options) {
  if (history.empty()) return {};
  const int latest =
      std::max_element(history.begin(), history.end(), [](const auto& a, const auto& b) {
        return a.turn < b.turn;
      })->turn;
  std::vector<Message> visible;
  visible.reserve(history.size());
  for (const auto& original : history) {
    Message message = original;
    const bool old = message.turn <= latest - options.recent_turns;
    if (message.role == Role::kTool) {
      if (old && message.content.size() > options.old_result_chars) {
        message.content = fmt::format(
            "[the result of this step (turn {}, {} characters) is left out to save space; it is "
            "kept in the history; run the step again if it is needed]",
            message.turn, original.content.size());
      } else {
        message.content = cut_middle(message.content, options.tool_output_chars);
      }
    } else if (old && message.role == Role::kAssistant) {
      cut_arguments(message.tool_calls, options.old_argument_chars);
    }
    visible.push_back(std::move(message));
  }

  // Still over budget: leave out the oldest turns whole, so no tool call loses its result.
  size_t total = 0;
  std::map<int, size_t> per_turn;
  for (const auto& message : visible) {
    total += size_of(message);
    per_turn[message.turn] += size_of(message);
  }
  int first_kept = per_turn.begin()->first;
  for (const auto& [turn, size] : per_turn) {
    if (total <= options.budget_chars || turn == latest) break;
    total -= size;
    first_kept = turn + 1;
  }
  std::erase_if(visible, [&](const Message& message) { return message.turn < first_kept; });
  return visible;
}

}  // namespace quarry::conversation

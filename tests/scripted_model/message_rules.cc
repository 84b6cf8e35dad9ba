#include "message_rules.h"

#include <algorithm>
#include <array>
#include <set>
#include <string_view>
#include <vector>

namespace quarry::scripted_model {
namespace {

using nlohmann::json;

constexpr std::array<std::string_view, 6> kRoles = {"system", "assistant", "user",
                                                    "tool",   "function",  "developer"};

// A text as Python's repr writes it: OpenAI's schema messages quote values that way.
std::string python_string(std::string_view text) {
  const char quote =
      text.find('\'') != std::string_view::npos && text.find('"') == std::string_view::npos ? '"'
                                                                                            : '\'';
  std::string out(1, quote);
  for (const char c : text) {
    if (c == '\\' || c == quote) {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else {
      out += c;
    }
  }
  out += quote;
  return out;
}

// A JSON value as Python's repr writes it ('robot', None, [], {'role': 'user'}).
std::string python_repr(const json& value) {
  switch (value.type()) {
    case json::value_t::null:
      return "None";
    case json::value_t::boolean:
      return value.get<bool>() ? "True" : "False";
    case json::value_t::string:
      return python_string(value.get_ref<const std::string&>());
    case json::value_t::array: {
      std::vector<std::string> items;
      for (const auto& item : value)
        items.push_back(python_repr(item));
      return fmt::format("[{}]", fmt::join(items, ", "));
    }
    case json::value_t::object: {
      std::vector<std::string> items;
      for (const auto& [key, item] : value.items())
        items.push_back(fmt::format("{}: {}", python_string(key), python_repr(item)));
      return fmt::format("{{{}}}", fmt::join(items, ", "));
    }
    default:
      return value.dump();
  }
}

RuleViolation missing_parameter(std::string name) {
  return {fmt::format("Missing required parameter: '{}'.", name), name,
          "missing_required_parameter"};
}

// "messages" is a non-empty list.
std::optional<RuleViolation> check_list(const json& body) {
  const auto messages = body.find("messages");
  if (messages == body.end()) return missing_parameter("messages");
  if (!messages->is_array()) {
    return RuleViolation{
        fmt::format("{} is not of type 'array' - 'messages'", python_repr(*messages)), "", ""};
  }
  if (messages->empty()) return RuleViolation{"[] is too short - 'messages'", "", ""};
  return std::nullopt;
}

// Each message is an object with one of OpenAI's roles; a tool message's id is text.
std::optional<RuleViolation> check_shape(const json& message, size_t index) {
  if (!message.is_object()) {
    return RuleViolation{
        fmt::format("{} is not of type 'object' - 'messages.{}'", python_repr(message), index), "",
        ""};
  }
  const auto role = message.find("role");
  if (role == message.end()) return missing_parameter(fmt::format("messages[{}].role", index));
  if (!role->is_string() ||
      std::find(kRoles.begin(), kRoles.end(), role->get<std::string>()) == kRoles.end()) {
    return RuleViolation{
        fmt::format("{} is not one of ['system', 'assistant', 'user', 'tool', 'function', "
                    "'developer'] - 'messages.{}.role'",
                    python_repr(*role), index),
        "", ""};
  }
  const auto id = message.find("tool_call_id");
  if (*role == "tool" && id != message.end() && !id->is_null() && !id->is_string()) {
    return RuleViolation{fmt::format("{} is not of type 'string' - 'messages.{}.tool_call_id'",
                                     python_repr(*id), index),
                         "", ""};
  }
  return std::nullopt;
}

// The assistant message with tool calls that the tool messages after it are answering.
struct OpenCalls {
  size_t index = 0;              // of the assistant message
  std::vector<std::string> ids;  // of its calls, in order
  std::set<std::string> answered;
};

std::vector<std::string> call_ids(const json& message) {
  std::vector<std::string> ids;
  const auto calls = message.find("tool_calls");
  if (calls == message.end() || !calls->is_array()) return ids;
  for (const auto& call : *calls) {
    const auto id = call.is_object() ? call.find("id") : call.end();
    ids.push_back(id != call.end() && id->is_string() ? id->get<std::string>() : "");
  }
  return ids;
}

// A tool message answers one of the calls of the assistant message just before it (or before
// the other answers to that message).
std::optional<RuleViolation> check_answer(std::optional<OpenCalls>& open, const json& message,
                                          size_t index) {
  if (!open) {
    return RuleViolation{
        "Invalid parameter: messages with role 'tool' must be a response to a preceeding message "
        "with 'tool_calls'.",
        fmt::format("messages.[{}].role", index), ""};
  }
  const auto id = message.find("tool_call_id");
  if (id == message.end() || id->is_null()) {
    return RuleViolation{
        "Missing parameter 'tool_call_id': messages with role 'tool' must have a 'tool_call_id'.",
        fmt::format("messages.[{}].tool_call_id", index), ""};
  }
  const std::string& text = id->get_ref<const std::string&>();
  if (std::find(open->ids.begin(), open->ids.end(), text) == open->ids.end()) {
    return RuleViolation{
        fmt::format("Invalid parameter: 'tool_call_id' of '{}' not found in 'tool_calls' of "
                    "previous message.",
                    text),
        fmt::format("messages.[{}].tool_call_id", index), ""};
  }
  open->answered.insert(text);
  return std::nullopt;
}

// Every call of an assistant message is answered before a message of another role (or the end).
std::optional<RuleViolation> check_all_answered(const OpenCalls& open) {
  std::vector<std::string> missing;
  for (const auto& id : open.ids) {
    if (!open.answered.contains(id)) missing.push_back(id);
  }
  if (missing.empty()) return std::nullopt;
  return RuleViolation{
      fmt::format("An assistant message with 'tool_calls' must be followed by tool messages "
                  "responding to each 'tool_call_id'. The following tool_call_ids did not have "
                  "response messages: {}",
                  fmt::join(missing, ", ")),
      fmt::format("messages.[{}].role", open.index), ""};
}

std::optional<RuleViolation> check_tool_answers(const json& messages) {
  std::optional<OpenCalls> open;
  for (size_t index = 0; index < messages.size(); ++index) {
    const json& message = messages[index];
    const std::string& role = message["role"].get_ref<const std::string&>();
    if (role == "tool") {
      if (auto broken = check_answer(open, message, index)) return broken;
      continue;
    }
    if (open) {
      if (auto broken = check_all_answered(*open)) return broken;
      open.reset();
    }
    if (role == "assistant") {
      if (auto ids = call_ids(message); !ids.empty()) open = OpenCalls{index, std::move(ids), {}};
    }
  }
  if (open) return check_all_answered(*open);
  return std::nullopt;
}

std::string names_or_none(const std::vector<std::string>& names) {
  return names.empty() ? std::string("none") : fmt::format("{}", fmt::join(names, ", "));
}

}  // namespace

std::optional<RuleViolation> check_messages(const json& body) {
  if (auto broken = check_list(body)) return broken;
  const json& messages = body["messages"];
  for (size_t index = 0; index < messages.size(); ++index) {
    if (auto broken = check_shape(messages[index], index)) return broken;
  }
  return check_tool_answers(messages);
}

std::string unoffered_tool_failure(const Scenario& scenario, size_t index, const Reply& reply,
                                   const Conversation& conversation, const json& tool_choice) {
  // What the request lets the model call, and how to say so.
  std::vector<std::string> callable = conversation.tools;
  std::string offered = fmt::format("the request offers: {}", names_or_none(conversation.tools));
  if (tool_choice == "none") {
    callable.clear();
    offered = fmt::format("the request's tool_choice is \"none\" (its tools: {})",
                          names_or_none(conversation.tools));
  } else if (tool_choice.is_object() && tool_choice.contains("function") &&
             tool_choice["function"].is_object()) {
    const json name = tool_choice["function"].value("name", json());
    const std::string named = name.is_string() ? name.get<std::string>() : name.dump();
    std::erase_if(callable, [&](const std::string& name) { return name != named; });
    offered = fmt::format("the request's tool_choice names '{}' (its tools: {})", named,
                          names_or_none(conversation.tools));
  }
  const Step& step = scenario.steps.at(index);
  for (const auto& call : reply.tool_calls) {
    if (std::find(callable.begin(), callable.end(), call.name) != callable.end()) continue;
    int line = step.line;
    for (const auto& alternative : step.choose) {
      if (&alternative.reply == &reply) line = alternative.line;
    }
    return fmt::format(
        "scenario '{}' step {} ({}:{}): the reply calls the tool '{}', but {}; a real model "
        "never calls a tool it was not offered",
        scenario.name, index, scenario.source, line, call.name, offered);
  }
  return {};
}

}  // namespace quarry::scripted_model

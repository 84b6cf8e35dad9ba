#include "scenario.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <charconv>
#include <nlohmann/json.hpp>

#include "common/file_util.h"
#include "config/yaml_reader.h"

namespace quarry::scripted_model {
namespace {

using nlohmann::json;

// Scenario files' own kind of value on top of the shared YAML reader.
class Reader : public YamlReader {
 public:
  using YamlReader::YamlReader;

  // One text or a list of texts.
  Result<std::vector<std::string>> texts(const YAML::Node& node, std::string_view path) const {
    if (node.IsScalar()) return std::vector<std::string>{node.Scalar()};
    return scalar_list(node, path);
  }
};

// YAML as JSON: quoted scalars stay strings; plain ones become numbers, booleans or null when
// they read as such.
json to_json(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Sequence: {
      json array = json::array();
      for (const auto& item : node)
        array.push_back(to_json(item));
      return array;
    }
    case YAML::NodeType::Map: {
      json object = json::object();
      for (const auto& entry : node)
        object[entry.first.Scalar()] = to_json(entry.second);
      return object;
    }
    case YAML::NodeType::Scalar: {
      const std::string& text = node.Scalar();
      if (node.Tag() == "!") return text;
      if (text == "true" || text == "false") return text == "true";
      if (text == "null" || text == "~") return nullptr;
      int64_t integer = 0;
      if (auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), integer);
          ec == std::errc() && end == text.data() + text.size()) {
        return integer;
      }
      double number = 0;
      if (auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), number);
          ec == std::errc() && end == text.data() + text.size() && std::isfinite(number)) {
        return number;
      }
      return text;
    }
    default:
      return nullptr;
  }
}

Result<Condition> parse_condition(const Reader& read, const YAML::Node& node,
                                  const std::string& path) {
  RETURN_IF_ERROR(
      read.check_map(node, path,
                     {"system_contains", "last_user_contains", "last_tool_result_contains",
                      "last_tool_result_lacks", "any_tool_result_contains", "tools"}));
  Condition condition;
  auto list = [&](std::string_view key, std::vector<std::string>& out) -> Result<void> {
    if (auto value = node[std::string(key)]) {
      ASSIGN_OR_RETURN(out, read.texts(value, fmt::format("{}.{}", path, key)));
    }
    return {};
  };
  RETURN_IF_ERROR(list("system_contains", condition.system_contains));
  RETURN_IF_ERROR(list("last_user_contains", condition.last_user_contains));
  RETURN_IF_ERROR(list("last_tool_result_contains", condition.last_tool_result_contains));
  RETURN_IF_ERROR(list("last_tool_result_lacks", condition.last_tool_result_lacks));
  RETURN_IF_ERROR(list("any_tool_result_contains", condition.any_tool_result_contains));
  RETURN_IF_ERROR(list("tools", condition.tools));
  return condition;
}

// The reply keys of a step or an alternative: content, tool_calls, finish_reason.
Result<Reply> parse_reply(const Reader& read, const YAML::Node& node, const std::string& path) {
  Reply reply;
  if (auto value = node["content"]) {
    ASSIGN_OR_RETURN(reply.content, read.scalar(value, path + ".content"));
  }
  if (auto value = node["finish_reason"]) {
    ASSIGN_OR_RETURN(reply.finish_reason, read.scalar(value, path + ".finish_reason"));
  }
  if (auto calls = node["tool_calls"]) {
    if (!calls.IsSequence()) return read.fail(calls, path + ".tool_calls", "must be a list");
    for (size_t i = 0; i < calls.size(); ++i) {
      const std::string call_path = fmt::format("{}.tool_calls[{}]", path, i);
      const YAML::Node call = calls[i];
      RETURN_IF_ERROR(
          read.check_map(call, call_path, {"id", "name", "arguments", "arguments_text"}));
      ScriptedToolCall tool_call;
      if (auto id = call["id"]) {
        ASSIGN_OR_RETURN(tool_call.id, read.scalar(id, call_path + ".id"));
      }
      auto name = call["name"];
      if (!name) return read.fail(call, call_path, "needs a name");
      ASSIGN_OR_RETURN(tool_call.name, read.scalar(name, call_path + ".name"));
      auto arguments = call["arguments"];
      auto arguments_text = call["arguments_text"];
      if (arguments && arguments_text) {
        return read.fail(call, call_path, "give arguments (an object) or arguments_text, not both");
      }
      if (arguments_text) {
        ASSIGN_OR_RETURN(tool_call.arguments,
                         read.scalar(arguments_text, call_path + ".arguments_text"));
      } else if (arguments) {
        try {
          tool_call.arguments = to_json(arguments).dump();
        } catch (const json::type_error& error) {
          // YAML takes any bytes, JSON text is UTF-8.
          return read.fail(arguments, call_path + ".arguments", "cannot be sent as JSON: {}",
                           error.what());
        }
      } else {
        tool_call.arguments = "{}";
      }
      reply.tool_calls.push_back(std::move(tool_call));
    }
  }
  return reply;
}

Result<Fault> parse_fault(const Reader& read, const YAML::Node& node, const std::string& path) {
  RETURN_IF_ERROR(
      read.check_map(node, path, {"status", "retry_after", "message", "disconnect", "times"}));
  Fault fault;
  if (auto value = node["status"]) {
    ASSIGN_OR_RETURN(auto status, read.whole_number(value, path + ".status", 400, 599));
    fault.status = static_cast<int>(status);
  }
  if (auto value = node["retry_after"]) {
    ASSIGN_OR_RETURN(fault.retry_after, read.scalar(value, path + ".retry_after"));
  }
  if (auto value = node["message"]) {
    ASSIGN_OR_RETURN(fault.message, read.scalar(value, path + ".message"));
  }
  if (auto value = node["disconnect"]) {
    ASSIGN_OR_RETURN(fault.disconnect, read.boolean(value, path + ".disconnect"));
  }
  if (auto value = node["times"]) {
    ASSIGN_OR_RETURN(auto times, read.whole_number(value, path + ".times", 1, 1'000'000));
    fault.times = static_cast<int>(times);
  }
  if ((fault.status == 0) == !fault.disconnect) {
    return read.fail(node, path, "needs either a status (400 to 599) or disconnect: true");
  }
  if (fault.message.empty())
    fault.message = fmt::format("scripted failure (HTTP {})", fault.status);
  return fault;
}

Result<Step> parse_step(const Reader& read, const YAML::Node& node, const std::string& path) {
  if (node.IsNull()) {
    return read.fail(node, path, "is empty: give content, tool_calls, choose or fail");
  }
  RETURN_IF_ERROR(
      read.check_map(node, path,
                     {"content", "tool_calls", "finish_reason", "expect", "choose", "otherwise",
                      "fail", "delay", "chunk_delay", "stall", "chunk_size"}));
  Step step;
  step.line = node.Mark().line + 1;
  if (auto value = node["expect"]) {
    ASSIGN_OR_RETURN(step.expect, parse_condition(read, value, path + ".expect"));
  }
  if (auto choose = node["choose"]) {
    if (node["content"] || node["tool_calls"] || node["finish_reason"]) {
      return read.fail(node, path,
                       "a step with choose gives its replies in the alternatives; put the reply "
                       "for when none matches under otherwise");
    }
    if (!choose.IsSequence() || choose.size() == 0) {
      return read.fail(choose, path + ".choose", "must be a list of alternatives");
    }
    for (size_t i = 0; i < choose.size(); ++i) {
      const std::string alternative_path = fmt::format("{}.choose[{}]", path, i);
      const YAML::Node alternative = choose[i];
      RETURN_IF_ERROR(read.check_map(alternative, alternative_path,
                                     {"when", "content", "tool_calls", "finish_reason"}));
      auto when = alternative["when"];
      if (!when) return read.fail(alternative, alternative_path, "needs a when");
      Alternative parsed;
      parsed.line = alternative.Mark().line + 1;
      ASSIGN_OR_RETURN(parsed.when, parse_condition(read, when, alternative_path + ".when"));
      ASSIGN_OR_RETURN(parsed.reply, parse_reply(read, alternative, alternative_path));
      step.choose.push_back(std::move(parsed));
    }
    if (auto otherwise = node["otherwise"]) {
      RETURN_IF_ERROR(read.check_map(otherwise, path + ".otherwise",
                                     {"content", "tool_calls", "finish_reason"}));
      ASSIGN_OR_RETURN(step.otherwise, parse_reply(read, otherwise, path + ".otherwise"));
    }
  } else {
    if (node["otherwise"]) return read.fail(node, path, "otherwise belongs to a step with choose");
    ASSIGN_OR_RETURN(step.otherwise, parse_reply(read, node, path));
  }
  if (auto value = node["fail"]) {
    ASSIGN_OR_RETURN(step.fail, parse_fault(read, value, path + ".fail"));
  }
  if (auto value = node["delay"]) {
    ASSIGN_OR_RETURN(step.delay, read.duration(value, path + ".delay"));
  }
  if (auto value = node["chunk_delay"]) {
    ASSIGN_OR_RETURN(step.chunk_delay, read.duration(value, path + ".chunk_delay"));
  }
  if (auto value = node["stall"]) {
    ASSIGN_OR_RETURN(step.stall, read.boolean(value, path + ".stall"));
  }
  if (auto value = node["chunk_size"]) {
    ASSIGN_OR_RETURN(auto size, read.whole_number(value, path + ".chunk_size", 1, 1'000'000));
    step.chunk_size = static_cast<size_t>(size);
  }
  return step;
}

std::string quote(std::string_view text) {
  constexpr size_t kLimit = 300;
  if (text.size() > kLimit) return fmt::format("'{}...'", text.substr(0, kLimit));
  return fmt::format("'{}'", text);
}

const agent::ChatMessage* last_with_role(const Conversation& conversation, std::string_view role) {
  for (auto it = conversation.messages.rbegin(); it != conversation.messages.rend(); ++it) {
    if (it->role == role) return &*it;
  }
  return nullptr;
}

bool contains(std::string_view text, std::string_view part) {
  return text.find(part) != std::string_view::npos;
}

}  // namespace

bool Condition::empty() const {
  return system_contains.empty() && last_user_contains.empty() &&
         last_tool_result_contains.empty() && last_tool_result_lacks.empty() &&
         any_tool_result_contains.empty() && tools.empty();
}

std::string Condition::failure(const Conversation& conversation) const {
  for (const auto& part : system_contains) {
    const bool found = std::any_of(
        conversation.messages.begin(), conversation.messages.end(), [&](const auto& message) {
          return message.role == "system" && contains(message.content, part);
        });
    if (!found) {
      const auto* system = last_with_role(conversation, "system");
      return fmt::format("expected the system prompt to contain {}, but {}", quote(part),
                         system ? fmt::format("it is {}", quote(system->content))
                                : std::string("there is no system message"));
    }
  }
  auto check_last = [&](std::string_view role, std::string_view what,
                        const std::vector<std::string>& parts, bool wanted) -> std::string {
    const auto* message = last_with_role(conversation, role);
    for (const auto& part : parts) {
      if (!message) return fmt::format("expected {}, but there is none", what);
      if (contains(message->content, part) != wanted) {
        return fmt::format("expected {} {} {}, but it is {}", what,
                           wanted ? "to contain" : "not to contain", quote(part),
                           quote(message->content));
      }
    }
    return {};
  };
  if (auto failed = check_last("user", "the last user message", last_user_contains, true);
      !failed.empty()) {
    return failed;
  }
  if (auto failed = check_last("tool", "the last tool result", last_tool_result_contains, true);
      !failed.empty()) {
    return failed;
  }
  if (auto failed = check_last("tool", "the last tool result", last_tool_result_lacks, false);
      !failed.empty()) {
    return failed;
  }
  for (const auto& part : any_tool_result_contains) {
    const bool found = std::any_of(
        conversation.messages.begin(), conversation.messages.end(), [&](const auto& message) {
          return message.role == "tool" && contains(message.content, part);
        });
    if (!found) return fmt::format("expected some tool result to contain {}", quote(part));
  }
  for (const auto& tool : tools) {
    if (std::find(conversation.tools.begin(), conversation.tools.end(), tool) ==
        conversation.tools.end()) {
      return fmt::format("expected the request to offer the tool '{}', but it offers: {}", tool,
                         conversation.tools.empty()
                             ? std::string("none")
                             : fmt::format("{}", fmt::join(conversation.tools, ", ")));
    }
  }
  return {};
}

Result<Scenario> parse_scenario(std::string_view yaml, std::string_view source,
                                std::string_view name) {
  Reader read(source);
  ASSIGN_OR_RETURN(auto root, read.load(yaml));
  Scenario scenario;
  scenario.name = std::string(name);
  scenario.source = std::string(source);
  try {
    RETURN_IF_ERROR(read.check_map(root, "scenario", {"description", "steps"}));
    if (auto description = root["description"]) {
      ASSIGN_OR_RETURN(scenario.description, read.scalar(description, "description"));
    }
    auto steps = root["steps"];
    if (!steps || !steps.IsSequence() || steps.size() == 0) {
      return read.fail(steps ? steps : root, "steps", "must be a list of at least one step");
    }
    for (size_t i = 0; i < steps.size(); ++i) {
      ASSIGN_OR_RETURN(auto step, parse_step(read, steps[i], fmt::format("steps[{}]", i)));
      scenario.steps.push_back(std::move(step));
    }
  } catch (const YAML::Exception& error) {
    return make_error(ErrorCode::kInvalidArgument, "{}:{}: {}", source, error.mark.line + 1,
                      error.msg);
  }
  return scenario;
}

Result<Scenario> load_scenario(const std::filesystem::path& path) {
  ASSIGN_OR_RETURN(auto text, read_file(path));
  return parse_scenario(text, path.string(), path.stem().string());
}

Result<size_t> step_index(const Scenario& scenario, const Conversation& conversation) {
  const size_t index = static_cast<size_t>(
      std::count_if(conversation.messages.begin(), conversation.messages.end(),
                    [](const auto& message) { return message.role == "assistant"; }));
  if (index >= scenario.steps.size()) {
    return make_error(ErrorCode::kInvalidArgument,
                      "scenario '{}' has {} steps, but the request already holds {} assistant "
                      "messages: the conversation went past the end of the scenario",
                      scenario.name, scenario.steps.size(), index);
  }
  return index;
}

Result<const Reply*> choose_reply(const Scenario& scenario, size_t index,
                                  const Conversation& conversation) {
  const Step& step = scenario.steps.at(index);
  std::vector<std::string> misses;
  for (const auto& alternative : step.choose) {
    auto failure = alternative.when.failure(conversation);
    if (failure.empty()) return &alternative.reply;
    misses.push_back(fmt::format("line {}: {}", alternative.line, failure));
  }
  if (step.otherwise) return &*step.otherwise;
  return make_error(ErrorCode::kInvalidArgument,
                    "scenario '{}' step {} ({}:{}): no alternative matched and there is no "
                    "otherwise ({})",
                    scenario.name, index, scenario.source, step.line, fmt::join(misses, "; "));
}

}  // namespace quarry::scripted_model

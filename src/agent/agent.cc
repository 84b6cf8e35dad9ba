#include "agent/agent.h"

#include <regex>
#include <set>

namespace quarry::agent {
namespace {

using conversation::Message;
using conversation::Role;

nlohmann::json to_json(const std::vector<ToolCall>& calls) {
  nlohmann::json json = nlohmann::json::array();
  for (const auto& call : calls) {
    json.push_back({{"id", call.id}, {"name", call.name}, {"arguments", call.arguments}});
  }
  return json;
}

ChatMessage to_chat(const Message& message) {
  ChatMessage chat;
  chat.role = std::string(conversation::to_string(message.role));
  chat.content = message.content;
  chat.tool_call_id = message.tool_call_id;
  if (message.tool_calls.is_array()) {
    for (const auto& call : message.tool_calls) {
      chat.tool_calls.push_back(
          {call.value("id", ""), call.value("name", ""), call.value("arguments", "")});
    }
  }
  return chat;
}

// Paths under the output directory that a text names, e.g. "outputs/chart.html" or
// "/home/sandbox/outputs/chart.html" -> "chart.html".
std::set<std::string> named_outputs(std::string_view text, const std::string& output_dir) {
  const std::string base = std::filesystem::path(output_dir).filename().string();
  const std::regex pattern(
      "(?:" + std::regex_replace(output_dir, std::regex(R"([.^$|()\[\]{}*+?\\])"), R"(\$&)") +
      "/|(?:^|[^/A-Za-z0-9_.-])" + base + "/)([A-Za-z0-9_.\\-/]+\\.[A-Za-z0-9]+)");
  std::set<std::string> names;
  std::string subject(text);
  for (std::sregex_iterator it(subject.begin(), subject.end(), pattern), end; it != end; ++it) {
    std::string name = (*it)[1];
    while (!name.empty() && name.back() == '.')
      name.pop_back();  // end of a sentence
    if (!name.empty()) names.insert(name);
  }
  return names;
}

AgentEvent event(AgentEvent::Kind kind, int step, std::string text = {}) {
  AgentEvent made;
  made.kind = kind;
  made.step = step;
  made.text = std::move(text);
  return made;
}

}  // namespace

AgentOptions agent_options(const Config& config) {
  AgentOptions options;
  options.max_steps = config.model.max_steps;
  const auto& context = config.conversations.context;
  options.context.budget_chars = context.budget_chars;
  options.context.tool_output_chars = context.tool_output_chars;
  options.context.recent_turns = static_cast<int>(context.recent_turns);
  options.output_dir = config.sandbox.output_dir;
  return options;
}

Agent::Agent(ModelClient& model, conversation::ConversationManager& manager,
             conversation::HistoryStore& history, Toolbox& toolbox, std::string system_prompt,
             AgentOptions options)
    : model_(model),
      manager_(manager),
      history_(history),
      toolbox_(toolbox),
      system_prompt_(std::move(system_prompt)),
      options_(std::move(options)) {}

std::vector<ChatMessage> Agent::context(const std::string& conversation_id) const {
  std::vector<ChatMessage> messages = {{"system", system_prompt_, {}, ""}};
  auto history = history_.messages(conversation_id);
  if (!history) return messages;
  for (const auto& message : conversation::filter_context(*history, options_.context)) {
    messages.push_back(to_chat(message));
  }
  return messages;
}

std::vector<std::string> Agent::check_answer(conversation::Turn& turn,
                                             std::string_view answer) const {
  std::vector<std::string> problems;
  auto names = named_outputs(answer, options_.output_dir);
  if (names.empty()) return problems;
  std::set<std::string> collected;
  if (auto artifacts = history_.artifacts(turn.conversation_id())) {
    for (const auto& artifact : *artifacts)
      collected.insert(artifact.name);
  }
  std::map<std::string, uint64_t> present;
  if (auto files = turn.sandbox().list_files(options_.output_dir)) {
    for (const auto& file : *files) {
      if (!file.is_directory) {
        present[file.path.substr(options_.output_dir.size() + 1)] = file.size;
      }
    }
  }
  for (const auto& name : names) {
    auto found = present.find(name);
    if (found != present.end() && found->second > 0) continue;
    if (found == present.end() && collected.contains(name)) continue;  // saved earlier
    problems.push_back(
        fmt::format("the answer names {}/{}, but {}", options_.output_dir, name,
                    found == present.end() ? "no such file was written" : "that file is empty"));
  }
  return problems;
}

Result<std::string> Agent::run_turn(std::string_view conversation_id, std::string_view user_message,
                                    const std::function<void(const AgentEvent&)>& on_event,
                                    int cancel_fd) {
  auto emit = [&](AgentEvent event) {
    if (on_event) on_event(event);
  };
  auto fail = [&](Error error, int step) -> Result<std::string> {
    emit(event(AgentEvent::Kind::kError, step, error.message));
    return std::unexpected(std::move(error));
  };
  ASSIGN_OR_RETURN(auto turn, manager_.begin_turn(conversation_id));
  const std::string id = turn->conversation_id();
  Message question;
  question.turn = turn->number();
  question.content = std::string(user_message);
  RETURN_IF_ERROR(history_.append_message(id, std::move(question)));

  std::vector<ToolSchema> tools = toolbox_.definitions();
  bool checked = false;  // the answer check speaks up once per turn
  for (int step = 1; step <= options_.max_steps; ++step) {
    ChatRequest request{context(id), tools};
    auto response = model_.complete(
        request,
        [&](std::string_view text) {
          emit(event(AgentEvent::Kind::kText, step, std::string(text)));
        },
        cancel_fd);
    if (!response) return fail(response.error().with_context("the model"), step);

    const ChatMessage& reply = response->message;
    Message assistant;
    assistant.turn = turn->number();
    assistant.role = Role::kAssistant;
    assistant.content = reply.content;
    if (!reply.tool_calls.empty()) assistant.tool_calls = to_json(reply.tool_calls);
    RETURN_IF_ERROR(history_.append_message(id, std::move(assistant)));

    if (reply.tool_calls.empty()) {
      auto problems = check_answer(*turn, reply.content);
      if (!problems.empty() && !checked && step < options_.max_steps) {
        // The system, not the model's word, decides; the model is told and may correct itself.
        checked = true;
        Message note;
        note.turn = turn->number();
        note.content = fmt::format(
            "(quarry checked the answer) {}. Write the file, or say that it could not be made; "
            "do not claim results that were not produced.",
            fmt::join(problems, "; "));
        RETURN_IF_ERROR(history_.append_message(id, std::move(note)));
        continue;
      }
      emit(event(AgentEvent::Kind::kDone, step, reply.content));
      return reply.content;
    }

    // Every call gets a result in the history, even when the turn is cancelled half way:
    // a tool call without its result would make the history unusable for the next turn.
    bool cancelled = false;
    for (const auto& call : reply.tool_calls) {
      Message tool;
      tool.turn = turn->number();
      tool.role = Role::kTool;
      tool.tool_call_id = call.id;
      if (cancelled) {
        tool.content = "(not run: the turn was cancelled)";
        RETURN_IF_ERROR(history_.append_message(id, std::move(tool)));
        continue;
      }
      AgentEvent started = event(AgentEvent::Kind::kToolCall, step);
      started.tool = call.name;
      started.tool_call_id = call.id;
      started.arguments = call.arguments;
      emit(started);
      ToolResult result = toolbox_.call(call.name, call.arguments, *turn, cancel_fd);
      cancelled = result.cancelled;
      tool.content = cancelled ? "(stopped: the turn was cancelled)" : result.content;
      RETURN_IF_ERROR(history_.append_message(id, std::move(tool)));
      if (cancelled) continue;
      AgentEvent finished = event(AgentEvent::Kind::kToolResult, step);
      finished.tool = call.name;
      finished.tool_call_id = call.id;
      finished.result = &result;
      emit(finished);
      for (const auto& artifact : result.artifacts) {
        AgentEvent saved = event(AgentEvent::Kind::kArtifact, step);
        saved.artifact = &artifact;
        emit(saved);
      }
    }
    if (cancelled) return fail(Error{ErrorCode::kCancelled, "the turn was cancelled"}, step);
  }
  return fail(Error{ErrorCode::kResourceExhausted,
                    fmt::format("the turn stopped after {} model steps without an answer "
                                "(model.max_steps); ask again, or more narrowly",
                                options_.max_steps)},
              options_.max_steps);
}

}  // namespace quarry::agent

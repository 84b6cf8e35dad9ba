#include "agent/agent.h"

#include <set>

#include "agent/guidance.h"
#include "common/text.h"
#include "data/sandbox_export.h"

namespace quarry::agent {
namespace {

using conversation::Message;
using conversation::Role;
using conversation::TurnKind;
using conversation::TurnStatus;

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

AgentEvent event(AgentEvent::Kind kind, int step, std::string text = {}) {
  AgentEvent made;
  made.kind = kind;
  made.step = step;
  made.text = std::move(text);
  return made;
}

// What the model is told of a call whose result was never recorded.
constexpr std::string_view kUnansweredResult =
    "(interrupted: quarry stopped while this step ran, so its result is unknown; files it was "
    "writing may be missing or incomplete, so check them before relying on them)";

// The messages with every tool call answered directly after its assistant message, as
// OpenAI-compatible servers require: a call without a result gets kUnansweredResult, and a
// result that answers no pending call is left out. `added` receives the results it made.
std::vector<Message> answer_every_call(const std::vector<Message>& messages,
                                       std::vector<Message>* added = nullptr) {
  std::vector<Message> answered;
  answered.reserve(messages.size());
  std::vector<std::pair<std::string, std::string>> pending;  // (call id, tool) awaiting results
  int pending_turn = 0;
  auto flush = [&] {
    for (const auto& [id, tool] : pending) {
      Message result;
      result.turn = pending_turn;
      result.role = Role::kTool;
      result.tool_call_id = id;
      result.content = std::string(kUnansweredResult);
      result.details = {{"tool", tool}, {"ok", false}, {"interrupted", true}};
      answered.push_back(result);
      if (added) added->push_back(std::move(result));
    }
    pending.clear();
  };
  for (const auto& message : messages) {
    if (message.role == Role::kTool) {
      auto found = std::find_if(pending.begin(), pending.end(), [&](const auto& call) {
        return call.first == message.tool_call_id;
      });
      if (found == pending.end()) continue;
      pending.erase(found);
      answered.push_back(message);
      continue;
    }
    flush();
    answered.push_back(message);
    if (message.role == Role::kAssistant && message.tool_calls.is_array()) {
      pending_turn = message.turn;
      for (const auto& call : message.tool_calls) {
        pending.emplace_back(call.value("id", ""), call.value("name", ""));
      }
    }
  }
  flush();
  return answered;
}

// A conversation's title from the first words of its first question.
std::string title_from(std::string_view text) {
  const std::string_view line = text.substr(0, text.find('\n'));
  if (line.size() <= 80) return std::string(line);
  return fmt::format("{}...", utf8_head(line, 76));
}

nlohmann::json tool_details(const ToolCall& call, const ToolResult& result) {
  nlohmann::json details = {{"tool", call.name},
                            {"ok", result.ok && !result.cancelled},
                            {"elapsed_ms", result.elapsed_ms}};
  if (result.failure.kind != FailureKind::kNone) {
    details["failure"] = {{"kind", to_string(result.failure.kind)},
                          {"cause", result.failure.cause}};
  }
  if (result.cancelled) details["cancelled"] = true;
  return details;
}

// Records how the turn ended; a failure is also an error event.
void finish(conversation::Turn& turn, const Error* error, int step, const AgentEventSink& emit) {
  if (!error) {
    turn.finish(TurnStatus::kCompleted);
    return;
  }
  const bool cancelled = error->code == ErrorCode::kCancelled;
  turn.finish(cancelled ? TurnStatus::kCancelled : TurnStatus::kFailed, error->message);
  AgentEvent failed = event(AgentEvent::Kind::kError, step, error->message);
  failed.error_code = error->code;
  emit(failed);
}

}  // namespace

namespace {

bool ascii_alnum(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

bool path_character(char c) {
  return ascii_alnum(c) || c == '_' || c == '.' || c == '-' || c == '/';
}

}  // namespace

std::set<std::string> named_outputs(std::string_view text, const std::string& output_dir) {
  // Scanned by hand: a std::regex matches by recursion, a level a character, and an answer
  // naming a path of 50,000 characters overflowed the stack of the whole server.
  const std::string full = output_dir + "/";
  const std::string base = std::filesystem::path(output_dir).filename().string() + "/";
  std::set<std::string> names;
  size_t pos = 0;
  while (pos < text.size()) {
    const std::string_view rest = text.substr(pos);
    size_t start = std::string_view::npos;
    if (rest.starts_with(full)) {
      start = pos + full.size();
    } else if (rest.starts_with(base) && (pos == 0 || !path_character(text[pos - 1]))) {
      start = pos + base.size();
    }
    if (start == std::string_view::npos) {
      ++pos;
      continue;
    }
    size_t end = start;
    while (end < text.size() && path_character(text[end]))
      ++end;
    // The longest part of the path that ends in ".extension": through the letters and digits
    // after its last '.' that has any ("chart.png." at the end of a sentence: "chart.png").
    size_t name_end = 0;
    for (size_t dot = end; dot-- > start + 1;) {
      if (text[dot] == '.' && dot + 1 < end && ascii_alnum(text[dot + 1])) {
        name_end = dot + 1;
        while (name_end < end && ascii_alnum(text[name_end]))
          ++name_end;
        break;
      }
    }
    if (name_end == 0) {
      pos = end;  // no later start in this run can end in an extension either
      continue;
    }
    names.insert(std::string(text.substr(start, name_end - start)));
    pos = name_end;
  }
  return names;
}

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

std::string_view to_string(Cell::Kind kind) {
  switch (kind) {
    case Cell::Kind::kPython:
      return "python";
    case Cell::Kind::kSqlQuery:
      return "sql_query";
    case Cell::Kind::kSqlExport:
      return "sql_export";
  }
  return "python";
}

Result<Cell::Kind> cell_kind_from(std::string_view text) {
  for (auto kind : {Cell::Kind::kPython, Cell::Kind::kSqlQuery, Cell::Kind::kSqlExport}) {
    if (to_string(kind) == text) return kind;
  }
  return make_error(ErrorCode::kInvalidArgument,
                    "'{}' is not a kind of cell; use python, sql_query or sql_export", text);
}

Result<void> check_cell(const Cell& cell) {
  if (cell.code.find_first_not_of(" \t\r\n") == std::string::npos) {
    return make_error(ErrorCode::kInvalidArgument, "the cell has no code; write some in 'code'");
  }
  if (cell.kind == Cell::Kind::kSqlExport) {
    if (cell.filename.empty()) {
      return make_error(ErrorCode::kInvalidArgument,
                        "an sql_export cell needs 'filename': the Parquet file to write, e.g. "
                        "views.parquet");
    }
    return data::validate_export_filename(cell.filename);
  }
  if (!cell.filename.empty()) {
    return make_error(ErrorCode::kInvalidArgument,
                      "'filename' is only for sql_export cells (the Parquet file to write); "
                      "leave it out of a {} cell",
                      to_string(cell.kind));
  }
  return {};
}

Result<int> close_unanswered_calls(conversation::HistoryStore& history,
                                   std::string_view conversation_id) {
  ASSIGN_OR_RETURN(auto messages, history.messages(conversation_id));
  std::vector<Message> added;
  answer_every_call(messages, &added);
  for (auto& result : added) {
    RETURN_IF_ERROR(history.append_message(conversation_id, std::move(result)));
  }
  return static_cast<int>(added.size());
}

Agent::Agent(ModelClient* model, conversation::ConversationManager& manager,
             conversation::HistoryStore& history, Toolbox& toolbox, std::string system_prompt,
             AgentOptions options)
    : model_(model),
      manager_(manager),
      history_(history),
      toolbox_(toolbox),
      system_prompt_(std::move(system_prompt)),
      options_(std::move(options)) {}

std::vector<ChatMessage> Agent::context(const std::string& conversation_id) const {
  std::string prompt = system_prompt_;
  if (auto conversation = history_.conversation(conversation_id)) {
    prompt += extra_packages_text(conversation->packages);
  }
  std::vector<ChatMessage> messages = {{"system", std::move(prompt), {}, ""}};
  auto history = history_.messages(conversation_id);
  if (!history) return messages;
  for (const auto& message :
       answer_every_call(conversation::filter_context(*history, options_.context))) {
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
  // Without a sandbox no file was written: none is started to find that out.
  if (auto files = turn.sandbox().has_sandbox()
                       ? turn.sandbox().list_files(options_.output_dir)
                       : Result<std::vector<sandbox::FileInfo>>(std::vector<sandbox::FileInfo>{})) {
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

Result<ToolResult> Agent::step(conversation::Turn& turn, int step, const ToolCall& call,
                               const AgentEventSink& emit, int cancel_fd) {
  AgentEvent started = event(AgentEvent::Kind::kToolCall, step);
  started.tool = call.name;
  started.tool_call_id = call.id;
  started.arguments = call.arguments;
  emit(started);
  ToolIo io;
  io.cancel_fd = cancel_fd;
  io.on_output = [&](sandbox::OutputStream stream, std::string_view text) {
    AgentEvent output = event(AgentEvent::Kind::kOutput, step, std::string(text));
    output.tool = call.name;
    output.tool_call_id = call.id;
    output.stream = stream;
    emit(output);
  };
  ToolResult result = toolbox_.call(call, turn, io);
  Message tool;
  tool.turn = turn.number();
  tool.role = Role::kTool;
  tool.tool_call_id = call.id;
  tool.content = result.cancelled ? "(stopped: the turn was cancelled)" : result.content;
  tool.details = tool_details(call, result);
  RETURN_IF_ERROR(history_.append_message(turn.conversation_id(), std::move(tool)));
  if (result.cancelled) return result;
  AgentEvent finished = event(AgentEvent::Kind::kToolResult, step);
  finished.tool = call.name;
  finished.tool_call_id = call.id;
  finished.result = &result;
  emit(finished);
  for (const auto& artifact : result.artifacts) {
    AgentEvent saved = event(AgentEvent::Kind::kArtifact, step);
    saved.tool = call.name;
    saved.tool_call_id = call.id;
    saved.artifact = &artifact;
    emit(saved);
  }
  return result;
}

Result<std::string> Agent::loop(conversation::Turn& turn, std::string_view user_message,
                                const AgentEventSink& emit, int cancel_fd) {
  const std::string id = turn.conversation_id();
  RETURN_IF_ERROR(close_unanswered_calls(history_, id));
  Message question;
  question.turn = turn.number();
  question.content = std::string(user_message);
  RETURN_IF_ERROR(history_.append_message(id, std::move(question)));
  RETURN_IF_ERROR(history_.name_conversation(id, title_from(user_message)));
  if (model_ == nullptr) {
    return make_error(ErrorCode::kFailedPrecondition,
                      "no language model is configured, so there is no one to ask; set "
                      "model.base_url and the key (see README, The model), or run cells");
  }

  std::vector<ToolSchema> tools = toolbox_.definitions();
  bool checked = false;  // the answer check speaks up once per turn
  for (int step = 1; step <= options_.max_steps; ++step) {
    ChatRequest request{context(id), tools};
    auto response = model_->complete(
        request,
        [&](std::string_view text) {
          emit(event(AgentEvent::Kind::kText, step, std::string(text)));
        },
        cancel_fd);
    if (!response) return std::unexpected(response.error().with_context("the model"));

    const ChatMessage& reply = response->message;
    Message assistant;
    assistant.turn = turn.number();
    assistant.role = Role::kAssistant;
    assistant.content = reply.content;
    if (!reply.tool_calls.empty()) assistant.tool_calls = to_json(reply.tool_calls);
    RETURN_IF_ERROR(history_.append_message(id, std::move(assistant)));

    if (reply.tool_calls.empty()) {
      auto problems = check_answer(turn, reply.content);
      if (!problems.empty() && !checked && step < options_.max_steps) {
        // The system, not the model's word, decides; the model is told and may correct itself.
        checked = true;
        Message note;
        note.turn = turn.number();
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
    // The turn also ends when it could not have a sandbox (the system is busy): the model could
    // do nothing about that.
    std::optional<Error> stop;
    for (const auto& call : reply.tool_calls) {
      if (stop) {
        Message tool;
        tool.turn = turn.number();
        tool.role = Role::kTool;
        tool.tool_call_id = call.id;
        const bool cancelled = stop->code == ErrorCode::kCancelled;
        tool.content = cancelled ? "(not run: the turn was cancelled)"
                                 : fmt::format("(not run: {})", stop->message);
        tool.details = {{"tool", call.name}, {"ok", false}};
        if (cancelled) tool.details["cancelled"] = true;
        RETURN_IF_ERROR(history_.append_message(id, std::move(tool)));
        continue;
      }
      ASSIGN_OR_RETURN(auto result, this->step(turn, step, call, emit, cancel_fd));
      if (result.cancelled) {
        stop = Error{ErrorCode::kCancelled, "the turn was cancelled"};
      } else if (turn.refusal()) {
        stop = *turn.refusal();
      }
    }
    if (stop) return std::unexpected(*stop);
  }
  return make_error(ErrorCode::kResourceExhausted,
                    "the turn stopped after {} model steps without an answer (model.max_steps); "
                    "ask again, or more narrowly",
                    options_.max_steps);
}

Result<std::string> Agent::run_turn(conversation::Turn& turn, std::string_view user_message,
                                    const AgentEventSink& on_event, int cancel_fd) {
  auto emit = [&](const AgentEvent& event) {
    if (on_event) on_event(event);
  };
  turn.set_cancel_fd(cancel_fd);
  auto answer = loop(turn, user_message, emit, cancel_fd);
  finish(turn, answer ? nullptr : &answer.error(), 0, emit);
  return answer;
}

Result<std::string> Agent::run_turn(std::string_view conversation_id, std::string_view user_message,
                                    const AgentEventSink& on_event, int cancel_fd) {
  auto on_sandbox_event = [&](const conversation::Event& recorded) {
    if (!on_event) return;
    AgentEvent sandbox = event(AgentEvent::Kind::kSandbox, 0);
    sandbox.sandbox_event = &recorded;
    on_event(sandbox);
  };
  ASSIGN_OR_RETURN(
      auto turn, manager_.begin_turn(conversation_id, TurnKind::kAsk, std::move(on_sandbox_event)));
  return run_turn(*turn, user_message, on_event, cancel_fd);
}

Result<ToolResult> Agent::run_cell(conversation::Turn& turn, const Cell& cell,
                                   const AgentEventSink& on_event, int cancel_fd) {
  auto emit = [&](const AgentEvent& event) {
    if (on_event) on_event(event);
  };
  turn.set_cancel_fd(cancel_fd);
  auto ran = [&]() -> Result<ToolResult> {
    RETURN_IF_ERROR(check_cell(cell));
    const std::string id = turn.conversation_id();
    RETURN_IF_ERROR(close_unanswered_calls(history_, id));
    ToolCall call;
    call.id = fmt::format("cell_{}", turn.number());
    nlohmann::json arguments;
    std::string what;
    switch (cell.kind) {
      case Cell::Kind::kPython:
        call.name = "run_python";
        arguments = {{"code", cell.code}};
        what = "Python";
        break;
      case Cell::Kind::kSqlQuery:
        call.name = "query_database";
        arguments = {{"sql", cell.code}};
        what = "SQL query";
        break;
      case Cell::Kind::kSqlExport:
        call.name = "export_query";
        arguments = {{"sql", cell.code}, {"filename", cell.filename}};
        what = "SQL export";
        break;
    }
    call.arguments = arguments.dump();
    // The model sees the cell as the user's own step: a note, the call and its result.
    Message note;
    note.turn = turn.number();
    note.content = fmt::format(
        "(I ran a {} cell myself in the notebook; the call and its result follow. No answer is "
        "needed.)",
        what);
    note.details = {{"cell", to_string(cell.kind)}};
    RETURN_IF_ERROR(history_.append_message(id, std::move(note)));
    RETURN_IF_ERROR(history_.name_conversation(id, title_from(cell.code)));
    Message assistant;
    assistant.turn = turn.number();
    assistant.role = Role::kAssistant;
    assistant.tool_calls = to_json({call});
    RETURN_IF_ERROR(history_.append_message(id, std::move(assistant)));
    ASSIGN_OR_RETURN(auto result, step(turn, 1, call, emit, cancel_fd));
    if (result.cancelled) return make_error(ErrorCode::kCancelled, "the cell was cancelled");
    if (turn.refusal()) return std::unexpected(*turn.refusal());
    return result;
  }();
  finish(turn, ran ? nullptr : &ran.error(), 1, emit);
  if (ran) emit(event(AgentEvent::Kind::kDone, 1));
  return ran;
}

}  // namespace quarry::agent

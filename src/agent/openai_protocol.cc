#include "agent/openai_protocol.h"

#include "common/json.h"
#include "common/random_id.h"
#include "common/text.h"

namespace quarry::agent {
namespace {

using nlohmann::json;

std::string string_or_empty(const json& object, std::string_view key) {
  auto found = object.find(key);
  if (found == object.end() || !found->is_string()) return {};
  return found->get<std::string>();
}

std::string shorten(std::string_view text, size_t limit) {
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) {
    text.remove_suffix(1);
  }
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front()))) {
    text.remove_prefix(1);
  }
  if (text.size() <= limit) return std::string(text);
  return fmt::format("{}...", utf8_head(text, limit));
}

Result<std::string> content_text(const json& content) {
  if (content.is_null()) return std::string();
  if (content.is_string()) return content.get<std::string>();
  if (content.is_array()) {
    std::string text;
    for (const auto& part : content) {
      if (part.is_object() && string_or_empty(part, "type") == "text")
        text += string_or_empty(part, "text");
    }
    return text;
  }
  return make_error(ErrorCode::kInvalidArgument, "a message's content must be text, not {}",
                    content.type_name());
}

// A call's arguments as they are sent back with the history: servers that read them (vLLM
// parses every replayed call's) refuse a request whose arguments are not a JSON object, so
// what the model sent that is not one goes back inside one, as the model was told it was
// ("not valid JSON"); no arguments are an empty object, as the tools read them.
std::string replayed_arguments(const std::string& arguments) {
  if (arguments.empty()) return "{}";
  if (parse_json_or_discarded(arguments).is_object()) return arguments;
  return json{{"invalid_arguments", arguments}}.dump(-1, ' ', false,
                                                     json::error_handler_t::replace);
}

}  // namespace

json to_json(const ChatMessage& message) {
  json out = {{"role", message.role}};
  if (message.role == "assistant" && !message.tool_calls.empty()) {
    out["content"] = message.content.empty() ? json(nullptr) : json(message.content);
    json calls = json::array();
    for (const auto& call : message.tool_calls) {
      calls.push_back(
          {{"id", call.id},
           {"type", "function"},
           {"function", {{"name", call.name}, {"arguments", replayed_arguments(call.arguments)}}}});
    }
    out["tool_calls"] = std::move(calls);
  } else {
    out["content"] = message.content;
  }
  if (message.role == "tool") out["tool_call_id"] = message.tool_call_id;
  return out;
}

json to_json(const ToolSchema& tool) {
  json parameters = tool.parameters.is_null()
                        ? json{{"type", "object"}, {"properties", json::object()}}
                        : tool.parameters;
  return {{"type", "function"},
          {"function",
           {{"name", tool.name}, {"description", tool.description}, {"parameters", parameters}}}};
}

Result<ChatMessage> message_from_json(const json& message) {
  if (!message.is_object()) {
    return make_error(ErrorCode::kInvalidArgument, "a message must be an object, not {}",
                      message.type_name());
  }
  ChatMessage out;
  out.role = string_or_empty(message, "role");
  if (out.role.empty()) return make_error(ErrorCode::kInvalidArgument, "a message has no role");
  if (auto content = message.find("content"); content != message.end()) {
    ASSIGN_OR_RETURN(out.content, content_text(*content));
  }
  out.tool_call_id = string_or_empty(message, "tool_call_id");
  if (auto calls = message.find("tool_calls"); calls != message.end() && !calls->is_null()) {
    if (!calls->is_array()) {
      return make_error(ErrorCode::kInvalidArgument, "tool_calls must be a list");
    }
    for (const auto& call : *calls) {
      if (!call.is_object()) {
        return make_error(ErrorCode::kInvalidArgument, "a tool call must be an object");
      }
      ToolCall tool_call;
      tool_call.id = string_or_empty(call, "id");
      if (auto function = call.find("function"); function != call.end() && function->is_object()) {
        tool_call.name = string_or_empty(*function, "name");
        auto arguments = function->find("arguments");
        if (arguments != function->end()) {
          // Arguments are JSON text; a server that sends an object gets it written out.
          tool_call.arguments =
              arguments->is_string() ? arguments->get<std::string>() : arguments->dump();
        }
      }
      out.tool_calls.push_back(std::move(tool_call));
    }
  }
  return out;
}

json chat_request_json(const ChatRequest& request, const RequestOptions& options) {
  json messages = json::array();
  for (const auto& message : request.messages)
    messages.push_back(to_json(message));
  json body = {{"model", options.model}, {"messages", std::move(messages)}};
  if (!request.tools.empty()) {
    json tools = json::array();
    for (const auto& tool : request.tools)
      tools.push_back(to_json(tool));
    body["tools"] = std::move(tools);
  }
  if (options.temperature) body["temperature"] = *options.temperature;
  body["stream"] = options.stream;
  if (options.stream) body["stream_options"] = {{"include_usage", true}};
  return body;
}

Usage usage_from_json(const json& usage) {
  Usage out;
  if (!usage.is_object()) return out;
  if (auto value = usage.find("prompt_tokens"); value != usage.end() && value->is_number_integer())
    out.prompt_tokens = value->get<int64_t>();
  if (auto value = usage.find("completion_tokens");
      value != usage.end() && value->is_number_integer())
    out.completion_tokens = value->get<int64_t>();
  return out;
}

Result<ChatResponse> chat_response_from_json(const json& body) {
  if (!body.is_object()) {
    return make_error(ErrorCode::kInternal, "the answer is not a JSON object");
  }
  if (body.contains("error")) {
    return make_error(ErrorCode::kUnavailable, "the server reported an error: {}",
                      error_message_from_body(body.dump()));
  }
  auto choices = body.find("choices");
  if (choices == body.end() || !choices->is_array() || choices->empty()) {
    return make_error(ErrorCode::kInternal, "the answer has no choices");
  }
  const json& choice = choices->front();
  auto message = choice.find("message");
  if (!choice.is_object() || message == choice.end()) {
    return make_error(ErrorCode::kInternal, "the answer's first choice has no message");
  }
  ChatResponse response;
  ASSIGN_OR_RETURN(response.message,
                   with_context(message_from_json(*message), "the answer's message"));
  response.message.role = "assistant";
  name_unnamed_tool_calls(response.message);
  response.finish_reason = string_or_empty(choice, "finish_reason");
  if (auto usage = body.find("usage"); usage != body.end())
    response.usage = usage_from_json(*usage);
  return response;
}

void name_unnamed_tool_calls(ChatMessage& message) {
  for (size_t i = 0; i < message.tool_calls.size(); ++i) {
    auto& call = message.tool_calls[i];
    // Unique in the conversation, not only in the message: a step's artifacts are kept by
    // its call's id, and every step's first call would otherwise be call_0.
    if (call.id.empty()) call.id = fmt::format("call_{}_{}", random_id(), i);
  }
}

std::string error_message_from_body(std::string_view body) {
  constexpr size_t kLimit = 500;
  json parsed = parse_json_or_discarded(body);
  if (parsed.is_object()) {
    for (std::string_view key : {"error", "detail", "message"}) {
      auto found = parsed.find(key);
      if (found == parsed.end()) continue;
      if (found->is_string()) return shorten(found->get<std::string>(), kLimit);
      if (found->is_object()) {
        if (auto text = string_or_empty(*found, "message"); !text.empty()) {
          return shorten(text, kLimit);
        }
      }
      if (!found->is_null()) return shorten(found->dump(), kLimit);
    }
  }
  return shorten(body, kLimit);
}

std::string error_code_from_body(std::string_view body) {
  json parsed = parse_json_or_discarded(body);
  if (!parsed.is_object()) return {};
  auto error = parsed.find("error");
  if (error == parsed.end() || !error->is_object()) return {};
  if (auto code = string_or_empty(*error, "code"); !code.empty()) return code;
  return string_or_empty(*error, "type");
}

}  // namespace quarry::agent

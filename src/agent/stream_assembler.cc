#include "agent/stream_assembler.h"

#include "agent/openai_protocol.h"

namespace quarry::agent {
namespace {

using nlohmann::json;

template <typename... Args>
std::unexpected<Error> malformed(fmt::format_string<Args...> format, Args&&... args) {
  return make_error(ErrorCode::kInternal, "the model server sent a malformed stream chunk: {}",
                    fmt::format(format, std::forward<Args>(args)...));
}

// A string field that may be absent or null; anything else is malformed.
Result<std::string> optional_string(const json& object, std::string_view key) {
  auto found = object.find(key);
  if (found == object.end() || found->is_null()) return std::string();
  if (!found->is_string()) return malformed("\"{}\" is {}, not a string", key, found->type_name());
  return found->get<std::string>();
}

}  // namespace

Result<void> StreamAssembler::add(const json& chunk, const TextHandler& on_text) {
  if (!chunk.is_object()) return malformed("{} instead of an object", chunk.type_name());
  if (auto error = chunk.find("error"); error != chunk.end() && !error->is_null()) {
    return make_error(ErrorCode::kUnavailable, "the model server reported an error mid-stream: {}",
                      error_message_from_body(chunk.dump()));
  }
  if (auto usage = chunk.find("usage"); usage != chunk.end() && usage->is_object()) {
    response_.usage = usage_from_json(*usage);
  }
  auto choices = chunk.find("choices");
  if (choices == chunk.end() || choices->is_null()) return {};
  if (!choices->is_array()) return malformed("\"choices\" is not a list");
  for (const auto& choice : *choices) {
    if (!choice.is_object()) return malformed("a choice is not an object");
    // quarry asks for one choice; a server that sends more gets the first one heard. An absent
    // or null index is that choice too.
    if (auto index = choice.find("index"); index != choice.end() && !index->is_null()) {
      if (!index->is_number())
        return malformed("\"index\" is {}, not a number", index->type_name());
      if (index->get<double>() != 0) continue;
    }
    if (auto delta = choice.find("delta"); delta != choice.end() && !delta->is_null()) {
      if (!delta->is_object()) return malformed("\"delta\" is not an object");
      ASSIGN_OR_RETURN(auto text, optional_string(*delta, "content"));
      if (!text.empty()) {
        response_.message.content += text;
        if (on_text) on_text(text);
      }
      if (auto calls = delta->find("tool_calls"); calls != delta->end() && !calls->is_null()) {
        if (!calls->is_array()) return malformed("\"tool_calls\" is not a list");
        for (const auto& call : *calls)
          RETURN_IF_ERROR(add_tool_call_delta(call));
      }
    }
    ASSIGN_OR_RETURN(auto finish_reason, optional_string(choice, "finish_reason"));
    if (!finish_reason.empty()) response_.finish_reason = std::move(finish_reason);
  }
  return {};
}

Result<void> StreamAssembler::add_tool_call_delta(const json& delta) {
  if (!delta.is_object()) return malformed("a tool call delta is not an object");
  ASSIGN_OR_RETURN(auto id, optional_string(delta, "id"));
  auto& calls = response_.message.tool_calls;
  size_t position = calls.size();
  if (auto index = delta.find("index"); index != delta.end() && index->is_number_integer()) {
    auto [found, inserted] = call_by_index_.try_emplace(index->get<int64_t>(), calls.size());
    position = found->second;
    if (inserted) calls.emplace_back();
  } else if (!calls.empty() && (id.empty() || id == calls.back().id)) {
    position = calls.size() - 1;  // servers without "index": more of the last call
  } else {
    calls.emplace_back();
  }
  ToolCall& call = calls[position];
  if (!id.empty()) call.id = id;
  if (auto function = delta.find("function"); function != delta.end() && !function->is_null()) {
    if (!function->is_object()) return malformed("\"function\" is not an object");
    // The name comes whole (OpenAI, vLLM, llama.cpp); arguments come in pieces.
    ASSIGN_OR_RETURN(auto name, optional_string(*function, "name"));
    if (!name.empty()) call.name = std::move(name);
    ASSIGN_OR_RETURN(auto arguments, optional_string(*function, "arguments"));
    call.arguments += arguments;
  }
  return {};
}

ChatResponse StreamAssembler::take() {
  ChatResponse response = response_;
  response.message.role = "assistant";
  name_unnamed_tool_calls(response.message);
  return response;
}

}  // namespace quarry::agent

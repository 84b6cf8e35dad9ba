#include "responder.h"

#include <algorithm>

namespace quarry::scripted_model {
namespace {

using nlohmann::json;

std::string finish_reason(const Reply& reply) {
  if (!reply.finish_reason.empty()) return reply.finish_reason;
  return reply.tool_calls.empty() ? "stop" : "tool_calls";
}

std::string call_id(const ScriptedToolCall& call, const ReplyContext& context, size_t n) {
  return call.id.empty() ? fmt::format("call_{}_{}", context.step, n) : call.id;
}

json chunk(const ReplyContext& context, json delta, json reason = nullptr) {
  return {{"id", context.id},
          {"object", "chat.completion.chunk"},
          {"created", context.created},
          {"model", context.model},
          {"choices", {{{"index", 0}, {"delta", std::move(delta)}, {"finish_reason", reason}}}}};
}

json usage_json(const agent::Usage& usage) {
  return {{"prompt_tokens", usage.prompt_tokens},
          {"completion_tokens", usage.completion_tokens},
          {"total_tokens", usage.prompt_tokens + usage.completion_tokens}};
}

std::string dump(const json& value) {
  return value.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace

std::vector<std::string> split_utf8(std::string_view text, size_t size) {
  std::vector<std::string> pieces;
  size = std::max<size_t>(size, 1);
  while (!text.empty()) {
    size_t cut = std::min(size, text.size());
    // Move the cut back to the start of a character (never past the first one).
    while (cut < text.size() && cut > 1 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) {
      --cut;
    }
    while (cut < text.size() && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80)
      ++cut;
    pieces.emplace_back(text.substr(0, cut));
    text.remove_prefix(cut);
  }
  return pieces;
}

int64_t estimate_tokens(std::string_view text) {
  return static_cast<int64_t>(text.size() / 4 + 1);
}

json completion_json(const Reply& reply, const ReplyContext& context) {
  json message = {
      {"role", "assistant"},
      {"content",
       reply.content.empty() && !reply.tool_calls.empty() ? json(nullptr) : json(reply.content)}};
  if (!reply.tool_calls.empty()) {
    json calls = json::array();
    for (size_t n = 0; n < reply.tool_calls.size(); ++n) {
      const auto& call = reply.tool_calls[n];
      calls.push_back({{"id", call_id(call, context, n)},
                       {"type", "function"},
                       {"function", {{"name", call.name}, {"arguments", call.arguments}}}});
    }
    message["tool_calls"] = std::move(calls);
  }
  return {
      {"id", context.id},
      {"object", "chat.completion"},
      {"created", context.created},
      {"model", context.model},
      {"choices",
       {{{"index", 0}, {"message", std::move(message)}, {"finish_reason", finish_reason(reply)}}}},
      {"usage", usage_json(context.usage)}};
}

std::vector<std::string> stream_events(const Reply& reply, const ReplyContext& context) {
  std::vector<std::string> events;
  auto pieces = split_utf8(reply.content, context.chunk_size);
  // The first chunk carries the role, as OpenAI's do.
  json first = {{"role", "assistant"}, {"content", pieces.empty() ? "" : pieces.front()}};
  events.push_back(dump(chunk(context, std::move(first))));
  for (size_t i = 1; i < pieces.size(); ++i) {
    events.push_back(dump(chunk(context, {{"content", pieces[i]}})));
  }
  for (size_t n = 0; n < reply.tool_calls.size(); ++n) {
    const auto& call = reply.tool_calls[n];
    const int index = static_cast<int>(n);
    events.push_back(
        dump(chunk(context, {{"tool_calls",
                              {{{"index", index},
                                {"id", call_id(call, context, n)},
                                {"type", "function"},
                                {"function", {{"name", call.name}, {"arguments", ""}}}}}}})));
    // Arguments in (at least) three pieces, whatever their length.
    const size_t piece_size = std::max<size_t>(1, (call.arguments.size() + 2) / 3);
    for (const auto& piece : split_utf8(call.arguments, piece_size)) {
      events.push_back(dump(chunk(
          context, {{"tool_calls", {{{"index", index}, {"function", {{"arguments", piece}}}}}}})));
    }
  }
  events.push_back(dump(chunk(context, json::object(), finish_reason(reply))));
  if (context.include_usage) {
    events.push_back(dump({{"id", context.id},
                           {"object", "chat.completion.chunk"},
                           {"created", context.created},
                           {"model", context.model},
                           {"choices", json::array()},
                           {"usage", usage_json(context.usage)}}));
  }
  events.push_back("[DONE]");
  return events;
}

}  // namespace quarry::scripted_model

#include "agent/openai_protocol.h"

#include <gtest/gtest.h>

namespace quarry::agent {
namespace {

using nlohmann::json;

TEST(OpenAiProtocol, WritesAStreamedRequestWithTools) {
  ChatRequest request;
  request.messages = {
      {.role = "system", .content = "You analyse data."},
      {.role = "user", .content = "Median views?"},
      {.role = "assistant",
       .content = "",
       .tool_calls = {{.id = "call_1", .name = "query_database", .arguments = "{\"sql\":\"x\"}"}}},
      {.role = "tool", .content = "42", .tool_call_id = "call_1"},
  };
  request.tools = {{.name = "query_database",
                    .description = "Runs SQL",
                    .parameters = {{"type", "object"},
                                   {"properties", {{"sql", {{"type", "string"}}}}},
                                   {"required", {"sql"}}}}};
  json body = chat_request_json(request, {.model = "gpt-4o", .temperature = 0.5, .stream = true});
  EXPECT_EQ(body["model"], "gpt-4o");
  EXPECT_EQ(body["stream"], true);
  EXPECT_EQ(body["stream_options"], json({{"include_usage", true}}));
  EXPECT_EQ(body["temperature"], 0.5);
  ASSERT_EQ(body["messages"].size(), 4u);
  EXPECT_EQ(body["messages"][0], json({{"role", "system"}, {"content", "You analyse data."}}));
  EXPECT_EQ(body["messages"][2]["content"], nullptr);
  EXPECT_EQ(body["messages"][2]["tool_calls"][0],
            json({{"id", "call_1"},
                  {"type", "function"},
                  {"function", {{"name", "query_database"}, {"arguments", "{\"sql\":\"x\"}"}}}}));
  EXPECT_EQ(body["messages"][3],
            json({{"role", "tool"}, {"content", "42"}, {"tool_call_id", "call_1"}}));
  EXPECT_EQ(body["tools"][0]["type"], "function");
  EXPECT_EQ(body["tools"][0]["function"]["name"], "query_database");
  EXPECT_EQ(body["tools"][0]["function"]["parameters"]["required"][0], "sql");

  json plain = chat_request_json({.messages = {{.role = "user", .content = "hi"}}},
                                 {.model = "m", .temperature = std::nullopt, .stream = false});
  EXPECT_FALSE(plain.contains("tools"));
  EXPECT_FALSE(plain.contains("temperature"));
  EXPECT_FALSE(plain.contains("stream_options"));
}

TEST(OpenAiProtocol, MessagesRoundTrip) {
  ChatMessage message{.role = "assistant",
                      .content = "Let me look.",
                      .tool_calls = {{.id = "a", .name = "execute", .arguments = "{bad json"}}};
  auto back = message_from_json(to_json(message));
  ASSERT_TRUE(back) << back.error().message;
  EXPECT_EQ(back->content, "Let me look.");
  ASSERT_EQ(back->tool_calls.size(), 1u);
  // Arguments that are no JSON object go back inside one: vLLM refuses a request otherwise.
  EXPECT_EQ(back->tool_calls[0].arguments, R"({"invalid_arguments":"{bad json"})");
  for (const auto& [sent, replayed] : {std::pair<std::string, std::string>{"", "{}"},
                                       {R"({"code": "1 + 1"})", R"({"code": "1 + 1"})"},
                                       {"[1, 2]", R"({"invalid_arguments":"[1, 2]"})"},
                                       {"\"text\"", R"({"invalid_arguments":"\"text\""})"}}) {
    message.tool_calls[0].arguments = sent;
    EXPECT_EQ(to_json(message)["tool_calls"][0]["function"]["arguments"], replayed) << sent;
  }

  auto parts = message_from_json({{"role", "user"},
                                  {"content",
                                   {{{"type", "text"}, {"text", "a"}},
                                    {{"type", "image_url"}},
                                    {{"type", "text"}, {"text", "b"}}}}});
  ASSERT_TRUE(parts);
  EXPECT_EQ(parts->content, "ab");
  EXPECT_FALSE(message_from_json({{"content", "no role"}}));
  EXPECT_FALSE(message_from_json({{"role", "user"}, {"content", 5}}));
}

TEST(OpenAiProtocol, ReadsACompleteResponse) {
  auto response = chat_response_from_json(json::parse(R"({
    "id": "chatcmpl-1", "object": "chat.completion",
    "choices": [{"index": 0, "finish_reason": "tool_calls",
                 "message": {"role": "assistant", "content": null,
                             "tool_calls": [{"id": "c1", "type": "function",
                                             "function": {"name": "execute", "arguments": "{}"}}]}}],
    "usage": {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13}})"));
  ASSERT_TRUE(response) << response.error().message;
  EXPECT_EQ(response->finish_reason, "tool_calls");
  EXPECT_EQ(response->message.tool_calls[0].name, "execute");
  EXPECT_EQ(response->usage.prompt_tokens, 10);
  EXPECT_FALSE(chat_response_from_json(json::parse(R"({"choices": []})")));
  auto error = chat_response_from_json(json::parse(R"({"error": {"message": "overloaded"}})"));
  ASSERT_FALSE(error);
  EXPECT_NE(error.error().message.find("overloaded"), std::string::npos);
}

// Found while fixing what fuzz/stream_assembler_fuzzer found (its harness crashes on it too): a
// content part whose "type" is not a string threw nlohmann's type_error.
TEST(OpenAiProtocol, SkipsContentPartsOfAnyOtherShape) {
  auto response = chat_response_from_json(json::parse(R"({"choices": [{"message": {
    "role": "assistant", "content": [{"type": 5, "text": "no"}, {"type": null},
                                     {"type": "text", "text": "yes"}]}}]})"));
  ASSERT_TRUE(response) << response.error().message;
  EXPECT_EQ(response->message.content, "yes");
}

TEST(OpenAiProtocol, FindsTheMessageInErrorBodies) {
  struct Case {
    const char* body;
    const char* message;
  } cases[] = {
      {R"({"error": {"message": "Incorrect API key provided", "type": "invalid_request_error"}})",
       "Incorrect API key provided"},
      {R"({"error": "model 'llama3' not found, try pulling it first"})",
       "model 'llama3' not found, try pulling it first"},
      {R"({"detail": "Not Found"})", "Not Found"},
      {R"({"object": "error", "message": "maximum context length is 8192 tokens"})",
       "maximum context length is 8192 tokens"},
      {"<html>502 Bad Gateway</html>\n", "<html>502 Bad Gateway</html>"},
      {"", ""},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.body);
    EXPECT_EQ(error_message_from_body(c.body), c.message);
  }
  EXPECT_EQ(error_message_from_body(std::string(2000, 'x')).size(), 503u);
  EXPECT_EQ(error_code_from_body(R"({"error": {"message": "m", "code": "insufficient_quota"}})"),
            "insufficient_quota");
  EXPECT_EQ(error_code_from_body("nope"), "");
}

}  // namespace
}  // namespace quarry::agent

#include "agent/stream_assembler.h"

#include <gtest/gtest.h>

#include "agent/sse_parser.h"

namespace quarry::agent {
namespace {

using nlohmann::json;

json chunk(json delta, json finish_reason = nullptr) {
  return {{"id", "chatcmpl-1"},
          {"object", "chat.completion.chunk"},
          {"choices", {{{"index", 0}, {"delta", delta}, {"finish_reason", finish_reason}}}}};
}

TEST(StreamAssembler, JoinsTextInOrderAndPassesItOn) {
  StreamAssembler assembler;
  std::string seen;
  auto on_text = [&](std::string_view text) { seen += fmt::format("[{}]", text); };
  ASSERT_TRUE(assembler.add(chunk({{"role", "assistant"}, {"content", ""}}), on_text));
  ASSERT_TRUE(assembler.add(chunk({{"content", "The median "}}), on_text));
  ASSERT_TRUE(assembler.add(chunk({{"content", nullptr}}), on_text));
  ASSERT_TRUE(assembler.add(chunk({{"content", "is 42."}}), on_text));
  EXPECT_FALSE(assembler.finished());
  ASSERT_TRUE(assembler.add(chunk(json::object(), "stop"), on_text));
  ASSERT_TRUE(assembler.add(
      {{"choices", json::array()}, {"usage", {{"prompt_tokens", 120}, {"completion_tokens", 7}}}},
      on_text));
  EXPECT_TRUE(assembler.finished());
  auto response = assembler.take();
  EXPECT_EQ(seen, "[The median ][is 42.]");
  EXPECT_EQ(response.message.role, "assistant");
  EXPECT_EQ(response.message.content, "The median is 42.");
  EXPECT_EQ(response.finish_reason, "stop");
  EXPECT_EQ(response.usage.prompt_tokens, 120);
  EXPECT_EQ(response.usage.completion_tokens, 7);
}

TEST(StreamAssembler, AssemblesToolCallsByIndex) {
  StreamAssembler assembler;
  const std::vector<json> deltas = {
      {{"tool_calls",
        {{{"index", 0},
          {"id", "call_a"},
          {"type", "function"},
          {"function", {{"name", "export_query"}, {"arguments", ""}}}}}}},
      {{"tool_calls", {{{"index", 0}, {"function", {{"arguments", "{\"sql\": \"SEL"}}}}}}},
      // The second call starts before the first is complete (parallel tool calls).
      {{"tool_calls",
        {{{"index", 1},
          {"id", "call_b"},
          {"type", "function"},
          {"function", {{"name", "execute"}, {"arguments", "{\"code\""}}}}}}},
      {{"tool_calls", {{{"index", 0}, {"function", {{"arguments", "ECT 1\"}"}}}}}}},
      {{"tool_calls", {{{"index", 1}, {"function", {{"arguments", ": \"print(1)\"}"}}}}}}},
  };
  for (const auto& delta : deltas)
    ASSERT_TRUE(assembler.add(chunk(delta), nullptr));
  ASSERT_TRUE(assembler.add(chunk(json::object(), "tool_calls"), nullptr));
  auto response = assembler.take();
  EXPECT_EQ(response.finish_reason, "tool_calls");
  EXPECT_EQ(response.message.content, "");
  ASSERT_EQ(response.message.tool_calls.size(), 2u);
  EXPECT_EQ(response.message.tool_calls[0].id, "call_a");
  EXPECT_EQ(response.message.tool_calls[0].name, "export_query");
  EXPECT_EQ(response.message.tool_calls[0].arguments, "{\"sql\": \"SELECT 1\"}");
  EXPECT_EQ(response.message.tool_calls[1].id, "call_b");
  EXPECT_EQ(response.message.tool_calls[1].name, "execute");
  EXPECT_EQ(response.message.tool_calls[1].arguments, "{\"code\": \"print(1)\"}");
}

TEST(StreamAssembler, GivesIdsToCallsThatHaveNoneAndCopesWithoutIndex) {
  StreamAssembler assembler;
  // Some local servers leave out "index" and "id".
  ASSERT_TRUE(assembler.add(
      chunk({{"tool_calls", {{{"function", {{"name", "execute"}, {"arguments", "{\"co"}}}}}}}),
      nullptr));
  ASSERT_TRUE(assembler.add(
      chunk({{"tool_calls", {{{"function", {{"arguments", "de\": \"x\"}"}}}}}}}), nullptr));
  auto response = assembler.take();
  ASSERT_EQ(response.message.tool_calls.size(), 1u);
  const std::string id = response.message.tool_calls[0].id;
  EXPECT_TRUE(id.starts_with("call_") && id.ends_with("_0")) << id;
  EXPECT_EQ(response.message.tool_calls[0].arguments, "{\"code\": \"x\"}");

  // The next step's first call has an id of its own: a step's artifacts are kept by it.
  StreamAssembler next;
  ASSERT_TRUE(next.add(chunk({{"tool_calls", {{{"function", {{"name", "execute"}}}}}}}), nullptr));
  const std::string next_id = next.take().message.tool_calls.at(0).id;
  EXPECT_TRUE(next_id.ends_with("_0")) << next_id;
  EXPECT_NE(next_id, id);
}

TEST(StreamAssembler, KeepsArgumentsThatAreNotJson) {
  StreamAssembler assembler;
  ASSERT_TRUE(
      assembler.add(chunk({{"tool_calls",
                            {{{"index", 0},
                              {"id", "c"},
                              {"function", {{"name", "execute"}, {"arguments", "{oops"}}}}}}}),
                    nullptr));
  EXPECT_EQ(assembler.take().message.tool_calls[0].arguments, "{oops");
}

TEST(StreamAssembler, ReportsErrorsAndMalformedChunks) {
  StreamAssembler assembler;
  auto error = assembler.add({{"error", {{"message", "model overloaded"}}}}, nullptr);
  ASSERT_FALSE(error);
  EXPECT_EQ(error.error().code, ErrorCode::kUnavailable);
  EXPECT_NE(error.error().message.find("model overloaded"), std::string::npos);

  for (const json& bad : {json::array(), json{{"choices", 3}}, json{{"choices", {{{"delta", 1}}}}},
                          chunk({{"content", 5}}), chunk({{"tool_calls", "x"}})}) {
    SCOPED_TRACE(bad.dump());
    auto result = StreamAssembler().add(bad, nullptr);
    ASSERT_FALSE(result);
    EXPECT_EQ(result.error().code, ErrorCode::kInternal);
    EXPECT_NE(result.error().message.find("malformed"), std::string::npos);
  }
}

// Found by fuzz/stream_assembler_fuzzer: {"index": null} threw nlohmann's type_error out of
// add(), which `quarry ask` does not catch.
TEST(StreamAssembler, ReadsAChoiceIndexOfAnyTypeWithoutThrowing) {
  auto with_index = [](json index) {
    return json{{"choices", {{{"index", index}, {"delta", {{"content", "x"}}}}}}};
  };
  StreamAssembler assembler;
  ASSERT_TRUE(assembler.add(with_index(nullptr), nullptr));  // null: the first choice
  ASSERT_TRUE(assembler.add(with_index(1), nullptr));        // another choice: skipped
  EXPECT_EQ(assembler.take().message.content, "x");
  for (const json& index : {json("0"), json::array(), json::object()}) {
    SCOPED_TRACE(index.dump());
    auto result = StreamAssembler().add(with_index(index), nullptr);
    ASSERT_FALSE(result);
    EXPECT_NE(result.error().message.find("\"index\" is"), std::string::npos);
  }
}

// The events of a real stream, split mid-line, through both parts.
TEST(StreamAssembler, AssemblesAStreamSplitAnywhere) {
  std::string stream;
  auto add = [&](const json& value) { stream += "data: " + value.dump() + "\n\n"; };
  add(chunk({{"role", "assistant"}, {"content", "Rewriting "}}));
  add(chunk({{"content", "with DuckDB."}}));
  add(chunk({{"tool_calls",
              {{{"index", 0},
                {"id", "call_1"},
                {"function", {{"name", "execute"}, {"arguments", "{\"code\": \"import"}}}}}}}));
  add(chunk({{"tool_calls", {{{"index", 0}, {"function", {{"arguments", " duckdb\"}"}}}}}}}));
  add(chunk(json::object(), "tool_calls"));
  stream += "data: [DONE]\n\n";
  for (size_t piece_size : {1, 2, 3, 7, 64, 4096}) {
    SCOPED_TRACE(piece_size);
    SseParser parser;
    StreamAssembler assembler;
    std::string text;
    bool done = false;
    for (size_t offset = 0; offset < stream.size(); offset += piece_size) {
      auto events = parser.feed(std::string_view(stream).substr(offset, piece_size));
      ASSERT_TRUE(events);
      for (const auto& event : *events) {
        if (event.data == "[DONE]") {
          done = true;
          continue;
        }
        ASSERT_TRUE(
            assembler.add(json::parse(event.data), [&](std::string_view piece) { text += piece; }));
      }
    }
    EXPECT_TRUE(done);
    auto response = assembler.take();
    EXPECT_EQ(text, "Rewriting with DuckDB.");
    ASSERT_EQ(response.message.tool_calls.size(), 1u);
    EXPECT_EQ(response.message.tool_calls[0].arguments, "{\"code\": \"import duckdb\"}");
  }
}

}  // namespace
}  // namespace quarry::agent

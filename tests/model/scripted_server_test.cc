// The scripted model server itself, over plain HTTP: how it streams, its JSON answers, the
// model list, and how it reports scenarios it cannot follow.
#include "agent/sse_parser.h"
#include "common/http_client.h"
#include "model_environment.h"

namespace quarry::testing {
namespace {

using nlohmann::json;

class ScriptedServerTest : public ModelTest {
 protected:
  HttpResponse post(const json& body) {
    HttpRequest request;
    request.method = "POST";
    request.url = *parse_url(server_->base_url());
    request.target = request.url.target("/chat/completions");
    request.headers = {{"Content-Type", "application/json"}};
    request.body = body.dump();
    auto client = HttpClient::create({});
    EXPECT_TRUE(client);
    auto response = client->send(request);
    EXPECT_TRUE(response) << response.error().message;
    return response ? *response : HttpResponse{};
  }

  static json chat(const std::string& model, bool stream) {
    return {{"model", model},
            {"stream", stream},
            {"messages", {{{"role", "user"}, {"content", "go"}}}}};
  }
};

TEST_F(ScriptedServerTest, StreamsTextAndArgumentsInSeveralChunks) {
  write_scenario("chunks", R"yaml(
steps:
  - content: "Twenty-four bytes, or so."
    tool_calls:
      - name: execute
        arguments: {code: "print('hello, sandbox')"}
)yaml");
  start_server();
  auto body = chat("chunks", true);
  body["stream_options"] = {{"include_usage", true}};
  auto response = post(body);
  EXPECT_EQ(response.status, 200);
  EXPECT_EQ(response.header("Content-Type"), "text/event-stream");
  EXPECT_EQ(response.header("Transfer-Encoding"), "chunked");
  agent::SseParser parser;
  auto events = parser.feed(response.body);
  ASSERT_TRUE(events);
  ASSERT_FALSE(events->empty());
  EXPECT_EQ(events->back().data, "[DONE]");
  int content_chunks = 0, argument_chunks = 0;
  bool usage = false;
  std::string finish_reason;
  for (size_t i = 0; i + 1 < events->size(); ++i) {
    auto chunk = json::parse((*events)[i].data);
    EXPECT_EQ(chunk["object"], "chat.completion.chunk");
    if (chunk.contains("usage")) usage = chunk["usage"]["completion_tokens"].get<int>() > 0;
    if (chunk["choices"].empty()) continue;
    const auto& choice = chunk["choices"][0];
    if (choice["finish_reason"].is_string()) finish_reason = choice["finish_reason"];
    const auto& delta = choice["delta"];
    if (delta.contains("content") && !delta["content"].get<std::string>().empty()) ++content_chunks;
    if (delta.contains("tool_calls") && delta["tool_calls"][0]["function"].contains("arguments") &&
        !delta["tool_calls"][0]["function"]["arguments"].get<std::string>().empty()) {
      ++argument_chunks;
    }
  }
  EXPECT_GE(content_chunks, 3);
  EXPECT_GE(argument_chunks, 3);
  EXPECT_EQ(finish_reason, "tool_calls");
  EXPECT_TRUE(usage);
}

TEST_F(ScriptedServerTest, AnswersWithOneObjectWhenNotStreaming) {
  write_scenario("plain", "steps:\n  - content: \"Just JSON.\"\n");
  start_server();
  auto response = post(chat("plain", false));
  EXPECT_EQ(response.status, 200);
  EXPECT_EQ(response.header("Content-Type"), "application/json");
  auto body = json::parse(response.body);
  EXPECT_EQ(body["object"], "chat.completion");
  EXPECT_EQ(body["choices"][0]["message"]["content"], "Just JSON.");
  EXPECT_EQ(body["choices"][0]["finish_reason"], "stop");
}

TEST_F(ScriptedServerTest, ListsItsScenariosAsModels) {
  write_scenario("alpha", "steps:\n  - content: a\n");
  write_scenario("beta", "steps:\n  - content: b\n");
  start_server({.scenario = dir_ / "alpha.yml"});
  HttpRequest request;
  request.url = *parse_url(server_->base_url());
  request.target = request.url.target("/models");
  auto response = HttpClient::create({})->send(request);
  ASSERT_TRUE(response);
  auto body = json::parse(response->body);
  ASSERT_EQ(body["data"].size(), 2u);
  EXPECT_EQ(body["data"][0]["id"], "alpha");
  EXPECT_EQ(body["data"][1]["id"], "beta");
  // --scenario answers for any model name the directory does not have.
  EXPECT_EQ(json::parse(post(chat("gpt-4o", false)).body)["choices"][0]["message"]["content"], "a");
  EXPECT_EQ(json::parse(post(chat("beta", false)).body)["choices"][0]["message"]["content"], "b");
}

TEST_F(ScriptedServerTest, SaysWhatIsWrongWithAScenario) {
  struct Case {
    const char* name;
    const char* yaml;
    const char* expected;
  } cases[] = {
      {"typo", "steps:\n  - contnt: x\n",
       "typo.yml:2: steps[0].contnt: unknown key (known keys here: content, tool_calls"},
      {"no_steps", "description: nothing\n", "steps: must be a list of at least one step"},
      {"empty_step", "steps:\n  - content: a\n  -\n", "steps[1]: is empty: give content"},
      {"both", "steps:\n  - choose: [{when: {tools: x}, content: a}]\n    content: b\n",
       "put the reply for when none matches under otherwise"},
      {"bad_fault", "steps:\n  - fail: {times: 2}\n", "needs either a status (400 to 599)"},
      {"past_the_end", "steps:\n  - content: one\n",
       "scenario 'past_the_end' has 1 steps, but the request already holds 1 assistant messages"},
      {"no_match",
       "steps:\n  - choose:\n      - when: {last_tool_result_contains: Killed}\n        content: "
       "a\n",
       "no alternative matched and there is no otherwise (line 3: expected the last tool result, "
       "but there is none)"},
  };
  for (const auto& c : cases)
    write_scenario(c.name, c.yaml);
  start_server();
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    auto body = chat(c.name, false);
    if (std::string_view(c.name) == "past_the_end") {
      body["messages"].push_back({{"role", "assistant"}, {"content", "one"}});
      body["messages"].push_back({{"role", "user"}, {"content", "more"}});
    }
    auto response = post(body);
    EXPECT_EQ(response.status, 400);
    const std::string message = json::parse(response.body)["error"]["message"];
    EXPECT_NE(message.find(c.expected), std::string::npos) << message;
  }
}

}  // namespace
}  // namespace quarry::testing

// The scripted model server itself, over plain HTTP: how it streams, its JSON answers, the
// model list, how it reports scenarios it cannot follow, and the message rules it checks as
// OpenAI's API does.
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

  // A request to the scenario `model` with these messages, offering these tools.
  static json history(const std::string& model, json messages,
                      const std::vector<std::string>& tools = {"execute"}) {
    json body = {{"model", model}, {"stream", false}, {"messages", std::move(messages)}};
    for (const auto& name : tools) {
      body["tools"].push_back(
          {{"type", "function"},
           {"function", {{"name", name}, {"parameters", {{"type", "object"}}}}}});
    }
    return body;
  }

  // Expects HTTP 400 with OpenAI's error body: this message, param and code ("" for null).
  void expect_invalid(const json& body, const std::string& message, const std::string& param,
                      const std::string& code = "") {
    auto response = post(body);
    EXPECT_EQ(response.status, 400) << response.body;
    const json error = json::parse(response.body)["error"];
    EXPECT_EQ(error["message"], message);
    EXPECT_EQ(error["type"], "invalid_request_error");
    EXPECT_EQ(error["param"], param.empty() ? json(nullptr) : json(param));
    EXPECT_EQ(error["code"], code.empty() ? json(nullptr) : json(code));
  }
};

json user(const std::string& text) {
  return {{"role", "user"}, {"content", text}};
}

// An assistant message calling `execute` once per id.
json calls(const std::vector<std::string>& ids) {
  json message = {{"role", "assistant"}, {"content", nullptr}, {"tool_calls", json::array()}};
  for (const auto& id : ids) {
    message["tool_calls"].push_back(
        {{"id", id},
         {"type", "function"},
         {"function", {{"name", "execute"}, {"arguments", "{\"code\": \"print(1)\"}"}}}});
  }
  return message;
}

json result(const std::string& id) {
  return {{"role", "tool"}, {"tool_call_id", id}, {"content", "1"}};
}

// A scenario that answers anything, so that what refuses a request is the rules, not it.
constexpr const char* kAnything = "steps:\n  - content: fine\n  - content: fine\n";

TEST_F(ScriptedServerTest, StreamsTextAndArgumentsInSeveralChunks) {
  write_scenario("chunks", R"yaml(
steps:
  - content: "Twenty-four bytes, or so."
    tool_calls:
      - name: execute
        arguments: {code: "print('hello, sandbox')"}
)yaml");
  start_server();
  auto body = history("chunks", {user("go")});
  body["stream"] = true;
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

TEST_F(ScriptedServerTest, RefusesARoleTheApiDoesNotKnow) {
  write_scenario("anything", kAnything);
  start_server();
  expect_invalid(history("anything", {{{"role", "system"}, {"content", "Be brief."}},
                                      user("go"),
                                      {{"role", "robot"}, {"content", "beep"}}}),
                 "'robot' is not one of ['system', 'assistant', 'user', 'tool', 'function', "
                 "'developer'] - 'messages.2.role'",
                 "");
  expect_invalid(history("anything", json::array({json{{"content", "who am I?"}}})),
                 "Missing required parameter: 'messages[0].role'.", "messages[0].role",
                 "missing_required_parameter");
  // The newer and the older roles are both accepted.
  auto response =
      post(history("anything", {{{"role", "developer"}, {"content", "Be brief."}},
                                user("go"),
                                {{"role", "function"}, {"name", "legacy"}, {"content", "{}"}}}));
  EXPECT_EQ(response.status, 200) << response.body;
}

TEST_F(ScriptedServerTest, RefusesAnEmptyOrMissingMessageList) {
  write_scenario("anything", kAnything);
  start_server();
  expect_invalid(history("anything", json::array()), "[] is too short - 'messages'", "");
  json body = history("anything", json::array());
  body.erase("messages");
  expect_invalid(body, "Missing required parameter: 'messages'.", "messages",
                 "missing_required_parameter");
  expect_invalid(history("anything", "hi"), "'hi' is not of type 'array' - 'messages'", "");
  expect_invalid(history("anything", {user("go"), "hi"}),
                 "'hi' is not of type 'object' - 'messages.1'", "");
}

TEST_F(ScriptedServerTest, RefusesAToolMessageThatAnswersNoToolCalls) {
  write_scenario("anything", kAnything);
  start_server();
  const std::string message =
      "Invalid parameter: messages with role 'tool' must be a response to a preceeding message "
      "with 'tool_calls'.";
  struct Case {
    const char* name;
    json messages;
    const char* param;
  } cases[] = {
      {"after a user message", {user("go"), result("call_1")}, "messages.[1].role"},
      {"after an answer without calls",
       {user("go"), {{"role", "assistant"}, {"content", "Done."}}, result("call_1")},
       "messages.[2].role"},
      {"after another message came between",
       {user("go"), calls({"call_1"}), result("call_1"), user("and?"), result("call_1")},
       "messages.[4].role"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    expect_invalid(history("anything", c.messages), message, c.param);
  }
}

TEST_F(ScriptedServerTest, RefusesAToolMessageWithoutAnIdOfThePreviousCalls) {
  write_scenario("anything", kAnything);
  start_server();
  expect_invalid(
      history("anything", {user("go"), calls({"call_1"}), {{"role", "tool"}, {"content", "1"}}}),
      "Missing parameter 'tool_call_id': messages with role 'tool' must have a 'tool_call_id'.",
      "messages.[2].tool_call_id");
  // call_1 was a call, but not of the message just before.
  expect_invalid(history("anything", {user("go"), calls({"call_1"}), result("call_1"), user("more"),
                                      calls({"call_2"}), result("call_1")}),
                 "Invalid parameter: 'tool_call_id' of 'call_1' not found in 'tool_calls' of "
                 "previous message.",
                 "messages.[5].tool_call_id");
}

TEST_F(ScriptedServerTest, RefusesToolCallsLeftWithoutAnswers) {
  write_scenario("anything", kAnything);
  start_server();
  const std::string message =
      "An assistant message with 'tool_calls' must be followed by tool messages responding to "
      "each 'tool_call_id'. The following tool_call_ids did not have response messages: ";
  struct Case {
    const char* name;
    json messages;
    const char* missing;
    const char* param;
  } cases[] = {
      {"none answered",
       {user("go"), calls({"call_a", "call_b"})},
       "call_a, call_b",
       "messages.[1].role"},
      {"one answered, then the user",
       {user("go"), calls({"call_a", "call_b"}), result("call_b"), user("well?")},
       "call_a",
       "messages.[1].role"},
      {"an answer of the assistant instead",
       {user("go"),
        calls({"call_a"}),
        result("call_a"),
        calls({"call_b"}),
        {{"role", "assistant"}, {"content", "Done."}}},
       "call_b",
       "messages.[3].role"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    expect_invalid(history("anything", c.messages), message + c.missing, c.param);
  }
}

TEST_F(ScriptedServerTest, AcceptsAHistoryWhoseToolCallsAreAllAnswered) {
  write_scenario("long_history", R"yaml(
steps:
  - tool_calls: [{name: execute, arguments: {code: "print(1)"}}]
  - tool_calls: [{name: execute, arguments: {code: "print(2)"}}, {name: execute, arguments: {code: "print(3)"}}]
  - content: "Two and three."
  - tool_calls: [{name: execute, arguments: {code: "print(4)"}}]
  - expect: {last_user_contains: chart, last_tool_result_contains: "4"}
    content: "The chart is written."
)yaml");
  start_server();
  json messages = {{{"role", "system"}, {"content", "You analyse data."}},
                   user("Count."),
                   calls({"call_0_0"}),
                   result("call_0_0"),
                   calls({"call_1_0", "call_1_1"}),
                   result("call_1_0"),
                   result("call_1_1"),
                   {{"role", "assistant"}, {"content", "Two and three."}},
                   user("Now a chart."),
                   calls({"call_3_0"}),
                   {{"role", "tool"}, {"tool_call_id", "call_3_0"}, {"content", "4"}}};
  auto response = post(history("long_history", messages));
  ASSERT_EQ(response.status, 200) << response.body;
  EXPECT_EQ(json::parse(response.body)["choices"][0]["message"]["content"],
            "The chart is written.");
}

TEST_F(ScriptedServerTest, RefusesAReplyCallingAToolTheRequestDidNotOffer) {
  write_scenario("chart", R"yaml(
steps:
  - content: "Charting."
    tool_calls: [{name: make_chart, arguments: {kind: bar}}]
)yaml");
  write_scenario("branch", R"yaml(
steps:
  - choose:
      - when: {last_user_contains: chart}
        tool_calls: [{name: make_chart}]
    otherwise:
      content: "No chart."
)yaml");
  start_server();
  const std::string file = (dir_ / "chart.yml").string();
  struct Case {
    const char* name;
    json body;
    std::string expected;
  } cases[] = {
      {"other tools", history("chart", {user("go")}, {"execute"}),
       fmt::format("scenario 'chart' step 0 ({}:3): the reply calls the tool 'make_chart', but the "
                   "request offers: execute",
                   file)},
      {"no tools", history("chart", {user("go")}, {}),
       "the reply calls the tool 'make_chart', but the request offers: none"},
      {"tool_choice none", history("chart", {user("go")}, {"execute", "make_chart"}),
       "but the request's tool_choice is \"none\" (its tools: execute, make_chart)"},
      {"tool_choice names another", history("chart", {user("go")}, {"execute", "make_chart"}),
       "but the request's tool_choice names 'execute' (its tools: execute, make_chart)"},
      {"an alternative", history("branch", {user("a chart")}, {"execute"}),
       fmt::format("scenario 'branch' step 0 ({}:4): the reply calls the tool 'make_chart'",
                   (dir_ / "branch.yml").string())},
  };
  cases[2].body["tool_choice"] = "none";
  cases[3].body["tool_choice"] = {{"type", "function"}, {"function", {{"name", "execute"}}}};
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    auto response = post(c.body);
    EXPECT_EQ(response.status, 400);
    const json error = json::parse(response.body)["error"];
    EXPECT_EQ(error["type"], "scenario_error");
    const std::string message = error["message"];
    EXPECT_NE(message.find(c.expected), std::string::npos) << message;
  }
  // Offered, the same replies are sent.
  auto offered = post(history("chart", {user("go")}, {"execute", "make_chart"}));
  EXPECT_EQ(offered.status, 200) << offered.body;
  auto other = post(history("branch", {user("a table")}, {"execute"}));
  EXPECT_EQ(other.status, 200) << other.body;
}

}  // namespace
}  // namespace quarry::testing

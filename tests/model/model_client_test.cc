// The model client against the real scripted model server process: streaming, tool calls,
// branches on tool results, retries, keys, unreachable servers, timeouts and cancellation.
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <thread>

#include "common/unique_fd.h"
#include "model_environment.h"

namespace quarry::testing {
namespace {

using agent::ChatMessage;
using agent::ChatRequest;
using agent::ChatResponse;
using nlohmann::json;
using std::chrono::milliseconds;
using std::chrono::seconds;
using Clock = std::chrono::steady_clock;

class ModelClientTest : public ModelTest {};

bool has(const std::string& text, std::string_view part) {
  return text.find(part) != std::string::npos;
}

TEST_F(ModelClientTest, StreamsTextInOrder) {
  write_scenario("talk", R"yaml(
steps:
  - content: "The typical session lasts 12 minutes on mobile and 9 on desktop; tablets sit between."
    chunk_size: 5
)yaml");
  start_server();
  auto client = client_for(config_for("talk"));
  std::vector<std::string> pieces;
  auto response = client->complete(question("How long are sessions?"),
                                   [&](std::string_view text) { pieces.emplace_back(text); });
  ASSERT_TRUE(response) << response.error().message;
  const std::string expected =
      "The typical session lasts 12 minutes on mobile and 9 on desktop; tablets sit between.";
  EXPECT_GT(pieces.size(), 10u);  // chunks of 5 bytes, each passed on as it came
  EXPECT_EQ(fmt::format("{}", fmt::join(pieces, "")), expected);
  EXPECT_EQ(response->message.role, "assistant");
  EXPECT_EQ(response->message.content, expected);
  EXPECT_TRUE(response->message.tool_calls.empty());
  EXPECT_EQ(response->finish_reason, "stop");
  EXPECT_GT(response->usage.prompt_tokens, 0);
  EXPECT_GT(response->usage.completion_tokens, 0);

  // What went over the wire: the OpenAI request shape, the key, streaming with usage.
  auto sent = requests();
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0]["target"], "/v1/chat/completions");
  EXPECT_EQ(sent[0]["authorization"], fmt::format("Bearer {}", kKey));
  const json& body = sent[0]["body"];
  EXPECT_EQ(body["model"], "talk");
  EXPECT_EQ(body["stream"], true);
  EXPECT_EQ(body["stream_options"]["include_usage"], true);
  EXPECT_EQ(body["messages"][1]["content"], "How long are sessions?");
  EXPECT_EQ(body["tools"][1]["type"], "function");
  EXPECT_EQ(body["tools"][1]["function"]["name"], "execute");
  EXPECT_EQ(body["tools"][1]["function"]["parameters"]["required"][0], "code");
}

TEST_F(ModelClientTest, AssemblesToolCallsWithTheirArguments) {
  write_scenario("tools", R"yaml(
steps:
  - content: "Exporting, then computing."
    tool_calls:
      - name: export_query
        arguments: {sql: "SELECT category_name, views FROM trending_videos WHERE views > 1000", name: views.parquet}
      - name: execute
        arguments:
          code: |
            import duckdb
            print(duckdb.sql("SELECT median(views) FROM 'views.parquet'"))
          timeout: 30
      - name: execute
        arguments_text: '{"code": "print(1)"'
)yaml");
  start_server();
  auto client = client_for(config_for("tools"));
  std::string text;
  auto response = client->complete(question("Median views per category?"),
                                   [&](std::string_view piece) { text += piece; });
  ASSERT_TRUE(response) << response.error().message;
  EXPECT_EQ(text, "Exporting, then computing.");
  EXPECT_EQ(response->finish_reason, "tool_calls");
  const auto& calls = response->message.tool_calls;
  ASSERT_EQ(calls.size(), 3u);
  EXPECT_EQ(calls[0].name, "export_query");
  EXPECT_EQ(json::parse(calls[0].arguments),
            json({{"sql", "SELECT category_name, views FROM trending_videos WHERE views > 1000"},
                  {"name", "views.parquet"}}));
  EXPECT_EQ(calls[1].name, "execute");
  EXPECT_EQ(json::parse(calls[1].arguments),
            json({{"code",
                   "import duckdb\nprint(duckdb.sql(\"SELECT median(views) FROM "
                   "'views.parquet'\"))\n"},
                  {"timeout", 30}}));
  // Invalid JSON arrives as the model sent it; the agent loop tells the model.
  EXPECT_EQ(calls[2].arguments, "{\"code\": \"print(1)\"");
  EXPECT_NE(calls[0].id, calls[1].id);
  EXPECT_NE(calls[1].id, calls[2].id);
  for (const auto& call : calls)
    EXPECT_FALSE(call.id.empty());
}

// Plays the agent loop over tests/scripted_model/scenarios/oom_rewrite.yml: the model's next
// step depends on what the last tool result said.
class OomScenarioTest : public ModelClientTest {
 protected:
  void SetUp() override {
    ModelClientTest::SetUp();
    start_server({.scenario = std::filesystem::path(QUARRY_SOURCE_DIR) /
                              "tests/scripted_model/scenarios/oom_rewrite.yml"});
    client_ = client_for(config_for("any-name"));
    request_ = question("What is the typical session length per device?");
  }

  ChatResponse next() {
    auto response = client_->complete(request_, nullptr);
    EXPECT_TRUE(response) << response.error().message;
    if (!response) return {};
    request_.messages.push_back(response->message);
    return *response;
  }
  void tool_result(const ChatResponse& response, const std::string& output) {
    ASSERT_FALSE(response.message.tool_calls.empty());
    request_.messages.push_back(
        {.role = "tool", .content = output, .tool_call_id = response.message.tool_calls[0].id});
  }

  std::unique_ptr<agent::ModelClient> client_;
  ChatRequest request_;
};

TEST_F(OomScenarioTest, RewritesWithDuckDbAfterAnOom) {
  auto exported = next();
  ASSERT_EQ(exported.message.tool_calls.size(), 1u);
  EXPECT_EQ(exported.message.tool_calls[0].name, "export_query");
  tool_result(exported, "/home/sandbox/data/events.parquet: 20000000 rows, 81.2 MiB");

  auto polars = next();
  ASSERT_EQ(polars.message.tool_calls.size(), 1u);
  EXPECT_TRUE(has(polars.message.tool_calls[0].arguments, "import polars"));
  tool_result(polars,
              "Killed: command ran out of memory.\nPeak memory: 1023 MiB\nSandbox limit: 1024 MiB");

  auto rewrite = next();
  EXPECT_TRUE(has(rewrite.message.content, "ran out of memory"));
  ASSERT_EQ(rewrite.message.tool_calls.size(), 1u);
  EXPECT_TRUE(has(rewrite.message.tool_calls[0].arguments, "import duckdb"));
  tool_result(rewrite, "device  typical_seconds\ndesktop 540\nmobile 720\ntablet 610");

  auto answer = next();
  EXPECT_TRUE(answer.message.tool_calls.empty());
  EXPECT_TRUE(has(answer.message.content, "DuckDB finished"));

  // The next user turn continues the same scenario.
  request_.messages.push_back({.role = "user", .content = "Can you chart that?"});
  auto chart = next();
  ASSERT_EQ(chart.message.tool_calls.size(), 1u);
  EXPECT_TRUE(has(chart.message.tool_calls[0].arguments, "plotly"));
}

TEST_F(OomScenarioTest, AnswersAtOnceWhenPolarsSucceeds) {
  auto exported = next();
  tool_result(exported, "/home/sandbox/data/events.parquet: 100000 rows");
  auto polars = next();
  tool_result(polars, "device  median\nmobile 720");
  auto answer = next();
  EXPECT_TRUE(answer.message.tool_calls.empty());
  EXPECT_EQ(answer.message.content, "The typical session per device is in the table above.");
}

TEST_F(ModelClientTest, AFailedExpectationIsAClearError) {
  write_scenario("strict", R"yaml(
steps:
  - expect: {last_user_contains: median}
    content: never sent
)yaml");
  start_server();
  auto client = client_for(config_for("strict"));
  auto response = client->complete(question("What is the mean?"), nullptr);
  ASSERT_FALSE(response);
  EXPECT_EQ(response.error().code, ErrorCode::kInvalidArgument);
  EXPECT_TRUE(has(response.error().message,
                  "expected the last user message to contain 'median', but it is 'What is the "
                  "mean?'"))
      << response.error().message;
  EXPECT_EQ(requests().size(), 1u);  // not retried
}

TEST_F(ModelClientTest, RetriesARateLimitAfterTheTimeRetryAfterAsks) {
  write_scenario("limited", R"yaml(
steps:
  - fail: {status: 429, retry_after: 1, times: 2, message: "Rate limit reached for requests"}
    content: finally
)yaml");
  start_server();
  auto client = client_for(config_for("limited"));
  const auto start = Clock::now();
  auto response = client->complete(question("q"), nullptr);
  const auto elapsed = Clock::now() - start;
  ASSERT_TRUE(response) << response.error().message;
  EXPECT_EQ(response->message.content, "finally");
  EXPECT_EQ(requests().size(), 3u);
  EXPECT_GE(elapsed, seconds(2));  // Retry-After: 1, twice
  EXPECT_LT(elapsed, seconds(5));
}

TEST_F(ModelClientTest, RetriesServerErrorsWithBackoff) {
  write_scenario("flaky", R"yaml(
steps:
  - fail: {status: 500, times: 2}
    content: recovered
)yaml");
  start_server();
  auto client = client_for(config_for("flaky"));
  const auto start = Clock::now();
  auto response = client->complete(question("q"), nullptr);
  const auto elapsed = Clock::now() - start;
  ASSERT_TRUE(response) << response.error().message;
  EXPECT_EQ(response->message.content, "recovered");
  EXPECT_EQ(requests().size(), 3u);
  // Backoff before retry 1 is 250-500 ms, before retry 2 500-1000 ms.
  EXPECT_GE(elapsed, milliseconds(750));
  EXPECT_LT(elapsed, milliseconds(2500));
}

TEST_F(ModelClientTest, RetriesAConnectionClosedWithoutAnswer) {
  write_scenario("drop", R"yaml(
steps:
  - fail: {disconnect: true, times: 1}
    content: second time lucky
)yaml");
  start_server();
  auto client = client_for(config_for("drop"));
  auto response = client->complete(question("q"), nullptr);
  ASSERT_TRUE(response) << response.error().message;
  EXPECT_EQ(response->message.content, "second time lucky");
  EXPECT_EQ(requests().size(), 2u);
}

TEST_F(ModelClientTest, GivesUpAfterMaxRetriesWithTheServersMessage) {
  write_scenario("down", R"yaml(
steps:
  - fail: {status: 503, times: 100, message: "The engine is currently overloaded"}
    content: never
)yaml");
  start_server();
  auto config = config_for("down");
  config.max_retries = 1;
  auto client = client_for(config);
  auto response = client->complete(question("q"), nullptr);
  ASSERT_FALSE(response);
  EXPECT_EQ(response.error().code, ErrorCode::kUnavailable);
  EXPECT_TRUE(has(response.error().message,
                  fmt::format("{} failed to answer (HTTP 503: The engine is currently overloaded); "
                              "gave up after 2 attempts (model.max_retries: 1)",
                              server_->base_url())))
      << response.error().message;
  EXPECT_EQ(requests().size(), 2u);
}

TEST_F(ModelClientTest, DoesNotWaitLongerThanItShould) {
  write_scenario("slow_down", R"yaml(
steps:
  - fail: {status: 429, retry_after: 3600, times: 5}
    content: never
)yaml");
  start_server();
  auto client = client_for(config_for("slow_down"));
  const auto start = Clock::now();
  auto response = client->complete(question("q"), nullptr);
  ASSERT_FALSE(response);
  EXPECT_LT(Clock::now() - start, seconds(2));
  EXPECT_EQ(response.error().code, ErrorCode::kResourceExhausted);
  EXPECT_TRUE(has(response.error().message, "is limiting the rate of requests (HTTP 429"));
  EXPECT_TRUE(has(response.error().message, "the server asks to wait 1h before trying again"))
      << response.error().message;
}

TEST_F(ModelClientTest, AMissingKeySaysWhichVariableToSet) {
  ::unsetenv(kKeyVariable);
  ModelConfig config;
  config.api_key_env = kKeyVariable;
  config.base_url = "https://models.example.invalid/v1";
  auto client = agent::make_model_client(config);
  ASSERT_FALSE(client);
  EXPECT_EQ(client.error().code, ErrorCode::kFailedPrecondition);
  EXPECT_EQ(client.error().message,
            fmt::format("set {} (model.api_key_env) to the API key for "
                        "https://models.example.invalid/v1; a server that needs no key: "
                        "model.api_key_env: \"\"",
                        kKeyVariable));

  // Remote with api_key_env "" and a local server without a key are both fine.
  config.api_key_env = "";
  EXPECT_TRUE(agent::make_model_client(config));
  config.api_key_env = kKeyVariable;
  config.base_url = "http://localhost:8080/v1";
  EXPECT_TRUE(agent::make_model_client(config));
}

TEST_F(ModelClientTest, AKeylessLocalServerGetsNoAuthorizationHeader) {
  write_scenario("local", "steps:\n  - content: hi\n");
  start_server();
  ::unsetenv(kKeyVariable);
  auto client = client_for(config_for("local"));
  auto response = client->complete(question("q"), nullptr);
  ASSERT_TRUE(response) << response.error().message;
  EXPECT_EQ(requests().at(0)["authorization"], "");
}

TEST_F(ModelClientTest, AWrongKeyIsRejectedWithoutRetrying) {
  write_scenario("guarded", "steps:\n  - content: hi\n");
  start_server({.api_key = "sk-the-right-one"});
  auto client = client_for(config_for("guarded"));
  auto response = client->complete(question("q"), nullptr);
  ASSERT_FALSE(response);
  EXPECT_EQ(response.error().code, ErrorCode::kPermissionDenied);
  EXPECT_EQ(response.error().message,
            fmt::format("{} rejected the API key (HTTP 401: Incorrect API key provided.); check "
                        "{} (model.api_key_env)",
                        server_->base_url(), kKeyVariable));
  EXPECT_EQ(requests().size(), 1u);

  // Without any key, a local server that wants one says so.
  ::unsetenv(kKeyVariable);
  auto keyless = client_for(config_for("guarded"));
  auto refused = keyless->complete(question("q"), nullptr);
  ASSERT_FALSE(refused);
  EXPECT_TRUE(has(refused.error().message, fmt::format("wants an API key (HTTP 401: You didn't "
                                                       "provide an API key.); set {}",
                                                       kKeyVariable)))
      << refused.error().message;

  ::setenv(kKeyVariable, "sk-the-right-one", 1);
  auto right = client_for(config_for("guarded"))->complete(question("q"), nullptr);
  ASSERT_TRUE(right) << right.error().message;
}

TEST_F(ModelClientTest, AnUnknownModelIsNotFound) {
  start_server();
  auto client = client_for(config_for("no-such-model"));
  auto response = client->complete(question("q"), nullptr);
  ASSERT_FALSE(response);
  EXPECT_EQ(response.error().code, ErrorCode::kNotFound);
  EXPECT_TRUE(has(response.error().message,
                  fmt::format("{}/chat/completions or the model 'no-such-model' was not found "
                              "(HTTP 404: The model 'no-such-model' does not exist",
                              server_->base_url())))
      << response.error().message;
  EXPECT_TRUE(has(response.error().message, "check model.base_url"));
}

// A port nothing listens on: bound, never listened to, so connections are refused.
uint16_t refused_port(UniqueFd& holder) {
  holder.reset(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::bind(holder.get(), reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
  socklen_t size = sizeof address;
  EXPECT_EQ(::getsockname(holder.get(), reinterpret_cast<sockaddr*>(&address), &size), 0);
  return ntohs(address.sin_port);
}

TEST_F(ModelClientTest, AnUnreachableServerSaysConnectionRefused) {
  UniqueFd holder;
  auto config = config_for("any");
  config.base_url = fmt::format("http://127.0.0.1:{}/v1", refused_port(holder));
  config.max_retries = 1;
  auto client = client_for(config);
  auto response = client->complete(question("q"), nullptr);
  ASSERT_FALSE(response);
  EXPECT_EQ(response.error().code, ErrorCode::kUnavailable);
  EXPECT_TRUE(has(response.error().message,
                  fmt::format("cannot reach {}: connection refused; is the model server running? "
                              "(model.base_url); gave up after 2 attempts",
                              config.base_url)))
      << response.error().message;
}

TEST_F(ModelClientTest, ARequestTimesOutWhenTheServerStalls) {
  write_scenario("stuck", R"yaml(
steps:
  - delay: 30s
    content: too late
)yaml");
  start_server();
  auto config = config_for("stuck");
  config.timeout = seconds(1);
  auto client = client_for(config);
  const auto start = Clock::now();
  auto response = client->complete(question("q"), nullptr);
  const auto elapsed = Clock::now() - start;
  ASSERT_FALSE(response);
  EXPECT_EQ(response.error().code, ErrorCode::kDeadlineExceeded);
  EXPECT_EQ(response.error().message,
            fmt::format("{}: no complete answer within 1s (model.timeout)", config.base_url));
  EXPECT_GE(elapsed, milliseconds(950));
  EXPECT_LT(elapsed, seconds(3));
  EXPECT_EQ(requests().size(), 1u);  // a timeout is not retried
}

TEST_F(ModelClientTest, AStreamCutShortIsNotRetriedOnceTextWasShown) {
  write_scenario("stall", R"yaml(
steps:
  - stall: true
    content: "First words, then silence."
)yaml");
  start_server();
  auto config = config_for("stall");
  config.timeout = seconds(1);
  auto client = client_for(config);
  std::string seen;
  auto response = client->complete(question("q"), [&](std::string_view text) { seen += text; });
  ASSERT_FALSE(response);
  EXPECT_EQ(response.error().code, ErrorCode::kDeadlineExceeded);
  EXPECT_EQ(seen, "First wo");  // the one chunk sent
  EXPECT_EQ(requests().size(), 1u);
}

TEST_F(ModelClientTest, CancelStopsAStreamMidway) {
  write_scenario("long", R"yaml(
steps:
  - chunk_delay: 200ms
    chunk_size: 4
    content: "This answer trickles in slowly enough to be cancelled long before it ends."
)yaml");
  start_server();
  auto client = client_for(config_for("long"));
  int fds[2];
  ASSERT_EQ(::pipe2(fds, O_CLOEXEC), 0);
  UniqueFd cancel_read(fds[0]), cancel_write(fds[1]);
  std::string seen;
  const auto start = Clock::now();
  auto response = client->complete(
      question("q"),
      [&](std::string_view text) {
        seen += text;
        if (seen.size() >= 8) {
          EXPECT_EQ(::write(cancel_write.get(), "x", 1), 1);
        }
      },
      cancel_read.get());
  ASSERT_FALSE(response);
  EXPECT_EQ(response.error().code, ErrorCode::kCancelled);
  EXPECT_EQ(seen, "This ans");
  EXPECT_LT(Clock::now() - start, seconds(2));
}

TEST_F(ModelClientTest, CancelStopsTheWaitBeforeARetry) {
  write_scenario("patience", R"yaml(
steps:
  - fail: {status: 429, retry_after: 30, times: 5}
    content: never
)yaml");
  start_server();
  auto client = client_for(config_for("patience"));
  int fds[2];
  ASSERT_EQ(::pipe2(fds, O_CLOEXEC), 0);
  UniqueFd cancel_read(fds[0]), cancel_write(fds[1]);
  // Cancelled once the first try has been refused, so the client is waiting to retry.
  std::thread canceller([&] {
    for (int i = 0; i < 1000 && requests().empty(); ++i)
      std::this_thread::sleep_for(milliseconds(10));
    EXPECT_EQ(::write(cancel_write.get(), "x", 1), 1);
  });
  const auto start = Clock::now();
  auto response = client->complete(question("q"), nullptr, cancel_read.get());
  const auto elapsed = Clock::now() - start;
  canceller.join();
  ASSERT_FALSE(response);
  EXPECT_EQ(response.error().code, ErrorCode::kCancelled);
  EXPECT_LT(elapsed, seconds(2));
  EXPECT_EQ(requests().size(), 1u);
}

TEST_F(ModelClientTest, AnAlreadyCancelledCallFailsAtOnce) {
  write_scenario("idle", "steps:\n  - content: hi\n");
  start_server();
  auto client = client_for(config_for("idle"));
  int fds[2];
  ASSERT_EQ(::pipe2(fds, O_CLOEXEC), 0);
  UniqueFd cancel_read(fds[0]), cancel_write(fds[1]);
  ASSERT_EQ(::write(cancel_write.get(), "x", 1), 1);
  auto response = client->complete(question("q"), nullptr, cancel_read.get());
  ASSERT_FALSE(response);
  EXPECT_EQ(response.error().code, ErrorCode::kCancelled);
}

}  // namespace
}  // namespace quarry::testing

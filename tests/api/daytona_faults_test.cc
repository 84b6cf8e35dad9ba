// Faults between the Daytona provider and a Daytona-compatible server (quarry's own, in another
// process), made by a proxy in between (daytona_faults.py): a 502 with an empty body, 429 with
// Retry-After, 409 while a state changes, the toolbox's 408, a hung connection, a lost answer to
// a create, a sandbox stuck in `creating`. The provider retries or reports clearly, and no
// sandbox is left behind: the server, asked directly, has none of the test's.
#include <gtest/gtest.h>
#include <signal.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <sstream>
#include <thread>

#include "api_environment.h"
#include "child_process.h"
#include "common/http_client.h"
#include "common/unique_fd.h"
#include "sandbox/daytona/daytona_provider.h"

namespace quarry::testing {
namespace {

using sandbox::daytona::DaytonaProvider;
using Clock = std::chrono::steady_clock;

class DaytonaFaults : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = std::make_unique<QuarryServer>(ServerOptions{.tokens = true});
    ASSERT_TRUE(server_->started());
    proxy_ = std::make_unique<ChildProcess>(std::vector<std::string>{
        "/usr/bin/python3", std::string(QUARRY_SOURCE_DIR) + "/tests/api/daytona_faults.py",
        server_->url() + "/daytona"});
    auto listening = proxy_->line_with("listening ", std::chrono::seconds(20));
    ASSERT_TRUE(listening);
    proxy_url_ = "http://127.0.0.1:" + listening->substr(listening->find(' ') + 1);
    SandboxConfig config;
    config.provider = "daytona";
    config.daytona.api_url = proxy_url_ + "/daytona/api";
    config.daytona.image = "quarry";
    config.daytona.create_timeout = std::chrono::seconds(3);
    config.daytona.request_timeout = std::chrono::seconds(2);
    config.daytona.max_retries = 3;
    auto provider = DaytonaProvider::open(config, server_->token("alice"));
    ASSERT_TRUE(provider) << provider.error().message;
    provider_ = std::move(*provider);
  }

  // What to break next (see daytona_faults.py). The proxy's own routes go around ApiClient,
  // which records every exchange for the check against quarry's OpenAPI document.
  HttpResponse control(const std::string& method, const std::string& body = "") {
    auto client = HttpClient::create({});
    EXPECT_TRUE(client);
    HttpRequest request;
    request.method = method;
    request.url = *parse_url(proxy_url_);
    request.target = "/_faults";
    request.headers = {{"Content-Type", "application/json"}};
    request.body = body;
    auto response = client->send(request);
    EXPECT_TRUE(response) << response.error().message;
    return response ? *response : HttpResponse{};
  }
  void faults(const nlohmann::json& rules) { ASSERT_EQ(control("POST", rules.dump()).status, 204); }
  nlohmann::json hits() { return nlohmann::json::parse(control("GET").body, nullptr, false); }

  // The test's sandboxes as the server lists them, asked directly.
  size_t on_server() {
    ApiClient direct(server_->url());
    direct.use_token(server_->token("alice"));
    auto listed = direct.get("/daytona/api/sandbox");
    EXPECT_EQ(listed.status, 200) << listed.body;
    return listed.json.value("items", nlohmann::json::array()).size();
  }

  std::string create() {
    sandbox::SandboxSpec spec;
    auto created = provider_->create(spec);
    EXPECT_TRUE(created) << created.error().message << "\n" << server_->log();
    return created ? created->id : "";
  }

  sandbox::ExecRequest echo() {
    sandbox::ExecRequest request;
    request.argv = {"echo", "through"};
    request.timeout = std::chrono::seconds(20);
    return request;
  }

  std::unique_ptr<QuarryServer> server_;
  std::unique_ptr<ChildProcess> proxy_;
  std::string proxy_url_;
  std::unique_ptr<DaytonaProvider> provider_;
};

TEST_F(DaytonaFaults, TransientAnswersAreRetriedAndPersistentOnesReported) {
  // 429 on the create, honouring Retry-After (1 s); 502 with an empty body twice on a command.
  faults({{{"method", "POST"}, {"path", "/api/sandbox"}, {"action", "429"}, {"times", 1}},
          {{"path", "/process/execute"}, {"action", "502"}, {"times", 2}}});
  const auto started = Clock::now();
  const auto id = create();
  ASSERT_FALSE(id.empty());
  EXPECT_GE(Clock::now() - started, std::chrono::milliseconds(900)) << "Retry-After: 1";
  auto ran = provider_->exec(id, echo());
  ASSERT_TRUE(ran) << ran.error().message;
  EXPECT_EQ(ran->stdout_text, "through\n");
  EXPECT_EQ(hits().size(), 3u);

  // Always 502: given up after the retries, said as the sandbox being unavailable.
  faults({{{"path", "/process/execute"}, {"action", "502"}, {"times", -1}}});
  auto refused = provider_->exec(id, echo());
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code, ErrorCode::kUnavailable);
  EXPECT_NE(refused.error().message.find("gave up after 4 attempts"), std::string::npos)
      << refused.error().message;
  EXPECT_NE(refused.error().message.find("502 HTTP 502 with an empty body"), std::string::npos)
      << refused.error().message;

  // The toolbox's 408 is the command's timeout, not an error.
  faults({{{"path", "/process/execute"}, {"action", "408"}, {"times", 1}}});
  auto late = provider_->exec(id, echo());
  ASSERT_TRUE(late) << late.error().message;
  EXPECT_TRUE(late->timed_out);

  // 409 while a state changes: the delete is sent again until it is taken.
  faults({{{"method", "DELETE"}, {"path", "/api/sandbox/"}, {"action", "409"}, {"times", 2}}});
  ASSERT_TRUE(provider_->destroy(id));
  EXPECT_EQ(on_server(), 0u);
}

TEST_F(DaytonaFaults, AHungConnectionTimesOutAndIsTriedAgain) {
  const auto id = create();
  ASSERT_FALSE(id.empty());
  faults({{{"method", "GET"}, {"path", "/api/sandbox/"}, {"action", "hang"}, {"times", 1}}});
  const auto started = Clock::now();
  auto alive = provider_->is_alive(id);
  ASSERT_TRUE(alive) << alive.error().message;
  EXPECT_TRUE(*alive);
  EXPECT_GE(Clock::now() - started, std::chrono::milliseconds(1900)) << "request_timeout: 2s";
  ASSERT_TRUE(provider_->destroy(id));
}

TEST_F(DaytonaFaults, ALostCreateAnswerIsFoundByItsLabelAndNothingLeaks) {
  // The server makes the sandbox, the answer never comes: found by its quarry.create label.
  faults({{{"method", "POST"}, {"path", "/api/sandbox"}, {"action", "drop"}, {"times", 1}}});
  const auto id = create();
  ASSERT_FALSE(id.empty());
  EXPECT_EQ(on_server(), 1u) << "one sandbox, not a second one made by a retry";
  auto ran = provider_->exec(id, echo());
  ASSERT_TRUE(ran) << ran.error().message;
  ASSERT_TRUE(provider_->destroy(id));
  EXPECT_EQ(on_server(), 0u);
}

TEST_F(DaytonaFaults, ASandboxStuckInCreatingIsDeletedAndReported) {
  // As Daytona answers a create (the sandbox is "creating"), and every look after.
  faults({{{"method", "POST"}, {"path", "/api/sandbox"}, {"action", "creating"}, {"times", -1}},
          {{"method", "GET"}, {"path", "/api/sandbox/"}, {"action", "creating"}, {"times", -1}}});
  const auto started = Clock::now();
  auto created = provider_->create({});
  ASSERT_FALSE(created);
  EXPECT_EQ(created.error().code, ErrorCode::kDeadlineExceeded);
  EXPECT_NE(created.error().message.find("was still 'creating' after 3s"), std::string::npos)
      << created.error().message;
  EXPECT_LT(Clock::now() - started, std::chrono::seconds(30));
  faults(nlohmann::json::array());
  EXPECT_EQ(on_server(), 0u) << "the stuck sandbox was deleted";
}

// Ctrl-C (or a cancelled turn) while Daytona starts the sandbox: the create stops waiting at
// once and deletes the sandbox, rather than waiting out sandbox.daytona.create_timeout.
TEST_F(DaytonaFaults, ACreateCancelledWhileTheSandboxStartsDeletesIt) {
  faults({{{"method", "POST"}, {"path", "/api/sandbox"}, {"action", "creating"}, {"times", -1}},
          {{"method", "GET"}, {"path", "/api/sandbox/"}, {"action", "creating"}, {"times", -1}}});
  UniqueFd cancel(::eventfd(1, EFD_CLOEXEC));  // readable from the start
  sandbox::SandboxSpec spec;
  spec.cancel_fd = cancel.get();
  // What the log says, at every level: a cancel is what was asked for, not a warning.
  std::ostringstream log;
  auto logged = std::make_shared<spdlog::logger>(
      "test", std::make_shared<spdlog::sinks::ostream_sink_mt>(log));
  logged->set_level(spdlog::level::trace);
  logged->set_pattern("%l %v");
  auto previous = spdlog::default_logger();
  spdlog::set_default_logger(logged);
  auto created = provider_->create(spec);
  spdlog::set_default_logger(previous);
  EXPECT_NE(log.str().find("info daytona: deleting sandbox "), std::string::npos) << log.str();
  EXPECT_EQ(log.str().find("warning"), std::string::npos) << log.str();
  ASSERT_FALSE(created) << "created " << created->id;
  EXPECT_EQ(created.error().code, ErrorCode::kCancelled) << created.error().message;
  EXPECT_NE(created.error().message.find("cancelled while sandbox"), std::string::npos)
      << created.error().message;
  faults(nlohmann::json::array());
  EXPECT_EQ(on_server(), 0u) << "the sandbox of the cancelled create was left";
}

// A cancel (a turn's Stop, Ctrl-C in quarry sandbox cp) stops an upload or a download the
// toolbox does not answer, where it waited out the attempt's deadline (and any retries).
TEST_F(DaytonaFaults, ACancelStopsATransferThatHangs) {
  const auto id = create();
  ASSERT_FALSE(id.empty());
  // One attempt with a long deadline: only the cancel ends it soon.
  SandboxConfig config;
  config.provider = "daytona";
  config.daytona.api_url = proxy_url_ + "/daytona/api";
  config.daytona.request_timeout = std::chrono::seconds(60);
  config.daytona.max_retries = 0;
  auto patient = DaytonaProvider::open(config, server_->token("alice"));
  ASSERT_TRUE(patient) << patient.error().message;
  for (const char* transfer : {"/files/bulk-upload", "/files/bulk-download"}) {
    SCOPED_TRACE(transfer);
    faults({{{"method", "POST"}, {"path", transfer}, {"action", "hang"}, {"times", -1}}});
    UniqueFd cancel(::eventfd(0, EFD_CLOEXEC));
    std::thread stop([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      const uint64_t one = 1;
      EXPECT_EQ(::write(cancel.get(), &one, sizeof one), 8);
    });
    std::istringstream content(std::string(1 << 20, 'x'));
    std::ostringstream out;
    Result<void> done;
    if (std::string_view(transfer) == "/files/bulk-upload") {
      done = (*patient)->write_file(id, "/home/sandbox/big.bin", content, cancel.get());
    } else if (auto read =
                   (*patient)->read_file(id, "/home/sandbox/big.bin", out, 2 << 20, cancel.get());
               !read) {
      done = std::unexpected(read.error());
    }
    stop.join();
    ASSERT_FALSE(done);
    EXPECT_EQ(done.error().code, ErrorCode::kCancelled) << done.error().message;
    EXPECT_EQ(hits().size(), 1u) << "the call was sent once";
  }
  faults(nlohmann::json::array());
  ASSERT_TRUE(provider_->destroy(id));
}

// The same through a conversation: Stop while a step's script is being uploaded ends the step as
// stopped (the turn cancelled, the model told so next time), not as failed after the upload's
// deadline, and the sandbox takes the next step.
TEST_F(DaytonaFaults, StopDuringAStepsUploadEndsTheStepAsStopped) {
  QuarryServer remote({.sandbox_config = fmt::format("  provider: daytona\n"
                                                     "  daytona:\n"
                                                     "    api_url: \"{}/daytona/api\"\n"
                                                     "    image: quarry\n"
                                                     "    request_timeout: 60s\n"
                                                     "    max_retries: 0\n",
                                                     proxy_url_),
                       .instance_id = "api-test-faults",
                       .env = {"DAYTONA_API_KEY=" + server_->token("alice")}});
  ASSERT_TRUE(remote.started());
  ApiClient api(remote.url());
  const auto id = api.create_conversation();
  auto first = api.cell(id, "python", "print('ready')");
  ASSERT_EQ(first.events.back().data["status"], "completed") << first.body << remote.log();

  faults({{{"method", "POST"}, {"path", "/files/bulk-upload"}, {"action", "hang"}, {"times", -1}}});
  BackgroundStream cell(api, "POST", fmt::format("/api/v1/conversations/{}/cells", id),
                        nlohmann::json{{"kind", "python"}, {"code", "print('never run')"}}.dump());
  ASSERT_TRUE(cell.wait_for_type("tool_started"));
  for (int i = 0; i < 200 && hits().empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_EQ(hits().size(), 1u) << "the script's upload never reached the toolbox";
  const auto stopped_at = Clock::now();
  auto cancelled = api.post(fmt::format("/api/v1/conversations/{}/cancel", id), nullptr);
  ASSERT_EQ(cancelled.status, 202) << cancelled.body;
  auto stream = cell.finish();
  EXPECT_LT(Clock::now() - stopped_at, std::chrono::seconds(30)) << "waited for the deadline";
  EXPECT_EQ(stream.events.back().data["status"], "cancelled") << stream.body;
  auto document = api.get("/api/v1/conversations/" + id);
  const auto& messages = document.json["messages"];
  ASSERT_FALSE(messages.empty());
  EXPECT_EQ(messages.back()["role"], "tool");
  EXPECT_EQ(messages.back()["content"], "(stopped: the turn was cancelled)");

  faults(nlohmann::json::array());
  auto next = api.cell(id, "python", "print('after')");
  ASSERT_EQ(next.events.back().data["status"], "completed") << next.body << remote.log();
  EXPECT_NE(
      of_type(next.events, "tool_finished")[0].data["content"].get<std::string>().find("after"),
      std::string::npos);
  EXPECT_EQ(remote.stop(SIGTERM), 0);
  EXPECT_EQ(on_server(), 0u) << "the conversation's sandbox was left";
}

}  // namespace
}  // namespace quarry::testing

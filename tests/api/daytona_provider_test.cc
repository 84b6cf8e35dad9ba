// The Daytona provider against quarry's own Daytona-compatible API in another process: both
// ends of one contract, over real HTTP, with real sandboxes behind the server. What quarry does
// with any provider is checked here through this one: create with labels, commands with their
// output, status and metering (CPU time, peak memory and an OOM read by the probe), timeouts,
// files both ways, listing, find by labels, stop_commands and delete.
#include "sandbox/daytona/daytona_provider.h"

#include <gtest/gtest.h>

#include <sstream>

#include "api_environment.h"

namespace quarry::testing {
namespace {

using sandbox::daytona::DaytonaProvider;

class DaytonaProviderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = std::make_unique<QuarryServer>(ServerOptions{.tokens = true});
    ASSERT_TRUE(server_->started());
    provider_ = open(server_->token("alice"));
    ASSERT_TRUE(provider_);
  }

  void TearDown() override {
    for (const auto& id : created_)
      (void)provider_->destroy(id);
  }

  std::unique_ptr<DaytonaProvider> open(const std::string& key, Duration create_timeout = {}) {
    SandboxConfig config;
    config.provider = "daytona";
    config.daytona.api_url = server_->url() + "/daytona/api";
    config.daytona.labels = {{"team", "data"}};
    config.daytona.image = "quarry";  // the image quarry's Daytona API serves
    if (create_timeout.count() > 0) config.daytona.create_timeout = create_timeout;
    auto provider = DaytonaProvider::open(config, key);
    EXPECT_TRUE(provider) << provider.error().message;
    return provider ? std::move(*provider) : nullptr;
  }

  std::string create(sandbox::Labels labels = {}) {
    sandbox::SandboxSpec spec;
    spec.labels = std::move(labels);
    spec.resources.memory_bytes = kGiB;
    auto created = provider_->create(spec);
    EXPECT_TRUE(created) << created.error().message << "\nthe server's log:\n" << server_->log();
    if (!created) return "";
    created_.push_back(created->id);
    return created->id;
  }

  sandbox::ExecResult run(const std::string& id, std::vector<std::string> argv,
                          std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
    sandbox::ExecRequest request;
    request.argv = std::move(argv);
    request.timeout = timeout;
    auto result = provider_->exec(id, request);
    EXPECT_TRUE(result) << result.error().message;
    return result ? *result : sandbox::ExecResult{};
  }

  std::unique_ptr<QuarryServer> server_;
  std::unique_ptr<DaytonaProvider> provider_;
  std::vector<std::string> created_;
};

TEST_F(DaytonaProviderTest, ACommandGivesItsOutputStatusAndMetering) {
  const auto id = create({{"quarry.conversation", "c1"}});
  ASSERT_FALSE(id.empty());
  EXPECT_TRUE(*provider_->is_alive(id));

  auto echoed = run(id, {"sh", "-c", "echo out; echo err >&2; exit 3"});
  EXPECT_EQ(echoed.exit_code, 3);
  EXPECT_EQ(echoed.stdout_text, "out\n");
  EXPECT_EQ(echoed.stderr_text, "err\n");
  EXPECT_GT(echoed.overhead_ms, 0);

  // A second of CPU and 300 MiB held: both measured by the probe in the sandbox.
  auto busy = run(id, {"python3", "-c",
                       "import time\nx = bytearray(300 << 20)\nfor i in range(0, len(x), 4096): "
                       "x[i] = 1\nt = time.process_time()\nwhile time.process_time() - t < 1: "
                       "pass\nprint('done')"});
  EXPECT_EQ(busy.exit_code, 0) << busy.stderr_text;
  EXPECT_EQ(busy.stdout_text, "done\n");
  EXPECT_GE(busy.cpu_ms, 900);
  EXPECT_GE(busy.run_ms, busy.cpu_ms * 0.9);
  EXPECT_GE(busy.peak_memory_bytes, 290 * kMiB);
  EXPECT_FALSE(busy.oom);

  // Past the sandbox's memory: killed, and quarry knows why, as it does locally.
  auto oom = run(id, {"python3", "-c", "x = b'1' * (2 << 30)"});
  EXPECT_TRUE(oom.oom) << oom.exit_code << " " << oom.stderr_text;
  EXPECT_EQ(oom.exit_code, 137);
  ASSERT_TRUE(oom.message);
  EXPECT_NE(oom.message->find("Killed: command ran out of memory."), std::string::npos);
  EXPECT_NE(oom.message->find("Sandbox limit: 1024 MiB"), std::string::npos) << *oom.message;

  auto slow = run(id, {"sleep", "30"}, std::chrono::seconds(1));
  EXPECT_TRUE(slow.timed_out);
  EXPECT_LT(slow.run_ms, 10'000);
  // The model reads the same words whichever provider ran the command.
  EXPECT_EQ(slow.message, "Timed out: command ran longer than 1s and was killed.");
  // The sandbox goes on after all of it.
  EXPECT_EQ(run(id, {"echo", "still here"}).stdout_text, "still here\n");
}

TEST_F(DaytonaProviderTest, FilesGoInAndComeOutAsTheyWere) {
  const auto id = create();
  ASSERT_FALSE(id.empty());
  ASSERT_TRUE(provider_->prepare(id, {.directories = {"/home/sandbox/data/in"}}));
  std::string binary;
  for (int i = 0; i < 300'000; ++i)
    binary += static_cast<char>(i * 7 % 256);
  std::istringstream content(binary);
  auto written = provider_->write_file(id, "/home/sandbox/data/in/blob.bin", content, -1);
  ASSERT_TRUE(written) << written.error().message;
  EXPECT_EQ(run(id, {"sh", "-c", "wc -c < /home/sandbox/data/in/blob.bin"}).stdout_text,
            "300000\n");

  std::ostringstream out;
  auto read = provider_->read_file(id, "/home/sandbox/data/in/blob.bin", out, 1 << 20, -1);
  ASSERT_TRUE(read) << read.error().message;
  EXPECT_EQ(*read, binary.size());
  EXPECT_EQ(out.str(), binary);
  std::ostringstream small;
  auto too_big = provider_->read_file(id, "/home/sandbox/data/in/blob.bin", small, 1000, -1);
  ASSERT_FALSE(too_big);
  EXPECT_EQ(too_big.error().code, ErrorCode::kResourceExhausted) << too_big.error().message;
  EXPECT_NE(too_big.error().message.find("'/home/sandbox/data/in/blob.bin' is larger than"),
            std::string::npos)
      << too_big.error().message;
  // Over the limit by less than the answer's framing: refused all the same.
  std::istringstream five_thousand(std::string(5000, 'x'));
  ASSERT_TRUE(provider_->write_file(id, "/home/sandbox/data/in/small.txt", five_thousand, -1));
  auto over = provider_->read_file(id, "/home/sandbox/data/in/small.txt", small, 4999, -1);
  ASSERT_FALSE(over);
  EXPECT_EQ(over.error().code, ErrorCode::kResourceExhausted) << over.error().message;
  EXPECT_TRUE(small.str().empty());
  auto missing = provider_->read_file(id, "/home/sandbox/nothing.txt", small, 1000, -1);
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error().code, ErrorCode::kNotFound) << missing.error().message;

  auto listed = provider_->list_files(id, "/home/sandbox/data");
  ASSERT_TRUE(listed) << listed.error().message;
  bool found = false;
  for (const auto& file : *listed) {
    if (file.path == "/home/sandbox/data/in/blob.bin") {
      found = true;
      EXPECT_EQ(file.size, 300'000u);
      EXPECT_FALSE(file.is_directory);
    }
  }
  EXPECT_TRUE(found);
}

TEST_F(DaytonaProviderTest, FindTakesLabelsAndDeleteWaitsUntilTheSandboxIsGone) {
  const auto mine = create({{"quarry.conversation", "c-find"}});
  const auto other = create({{"quarry.conversation", "c-other"}});
  ASSERT_FALSE(mine.empty());
  ASSERT_FALSE(other.empty());
  auto found = provider_->find({{"quarry.conversation", "c-find"}});
  ASSERT_TRUE(found) << found.error().message;
  ASSERT_EQ(found->size(), 1u);
  EXPECT_EQ(found->front().id, mine);
  EXPECT_EQ(found->front().labels.at("team"), "data");  // sandbox.daytona.labels
  // Another user's key sees none of them.
  auto bob = open(server_->token("bob"));
  ASSERT_TRUE(bob);
  EXPECT_TRUE(bob->find({{"team", "data"}})->empty());
  EXPECT_FALSE(bob->is_alive(mine));

  // A command left running is stopped by stop_commands.
  sandbox::ExecRequest request;
  request.argv = {"sleep", "60"};
  Result<sandbox::ExecResult> ended = make_error(ErrorCode::kInternal, "not run");
  std::thread running([&] { ended = provider_->exec(mine, request); });
  // Stopped once it runs: until then there is nothing to stop.
  auto stopped = provider_->stop_commands(mine);
  for (int i = 0; i < 200 && stopped && *stopped == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    stopped = provider_->stop_commands(mine);
  }
  running.join();
  ASSERT_TRUE(stopped) << stopped.error().message;
  EXPECT_EQ(*stopped, 1);
  ASSERT_TRUE(ended) << ended.error().message;
  EXPECT_EQ(ended->signal, 9) << ended->exit_code << " " << ended->stderr_text;

  ASSERT_TRUE(provider_->destroy(mine));
  auto gone = provider_->is_alive(mine);
  ASSERT_FALSE(gone);
  EXPECT_EQ(gone.error().code, ErrorCode::kNotFound);
  auto again = provider_->destroy(mine);
  ASSERT_FALSE(again);
  EXPECT_EQ(again.error().code, ErrorCode::kNotFound);
  EXPECT_EQ(provider_->find({{"team", "data"}})->size(), 1u);
}

TEST_F(DaytonaProviderTest, AWrongKeyIsRefusedWithoutTheKeyInTheMessage) {
  auto stranger = open("not-a-token-of-this-server");
  ASSERT_TRUE(stranger);
  auto refused = stranger->create({});
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code, ErrorCode::kPermissionDenied) << refused.error().message;
  EXPECT_EQ(refused.error().message.find("not-a-token-of-this-server"), std::string::npos);
}

}  // namespace
}  // namespace quarry::testing

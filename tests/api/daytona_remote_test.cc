// quarry on a remote engine, as its users run it: a `quarry serve` and the `quarry` command line
// with `sandbox.provider: daytona`, against another quarry's Daytona-compatible API (server A,
// with the real sandboxes behind it). A's two users stand for two Daytona accounts, each key
// seeing only its own sandboxes: the capacity limits share the work between the accounts, and
// whatever the remote server makes is removed again through the account that made it.
#include <gtest/gtest.h>
#include <signal.h>

#include <fstream>
#include <regex>
#include <set>

#include "api_environment.h"
#include "common/command.h"
#include "common/file_util.h"
#include "sandbox/daytona/daytona_provider.h"
#include "sandbox_environment.h"

namespace quarry::testing {
namespace {

using sandbox::daytona::DaytonaProvider;

constexpr std::string_view kRemoteInstance = "api-test-remote";

class DaytonaRemoteTest : public ::testing::Test {
 protected:
  void SetUp() override {
    engine_ = std::make_unique<QuarryServer>(ServerOptions{.tokens = true});
    ASSERT_TRUE(engine_->started());
  }

  // B's configuration: sandboxes on A, in one account per A user, at most one sandbox each.
  ServerOptions remote_options(std::string scenario = "peak_views") const {
    return {.scenario = std::move(scenario),
            .sandbox_config = fmt::format(
                "  provider: daytona\n"
                "  daytona:\n"
                "    api_url: \"{}/daytona/api\"\n"
                "    image: quarry\n"
                "    accounts:\n"
                "      - {{name: north, api_key_env: QUARRY_TEST_KEY_NORTH, max_sandboxes: 1}}\n"
                "      - {{name: south, api_key_env: QUARRY_TEST_KEY_SOUTH, max_sandboxes: 1}}\n",
                engine_->url()),
            .capacity_config = "  max_sandboxes: 2\n",
            .instance_id = std::string(kRemoteInstance),
            .env = {"QUARRY_TEST_KEY_NORTH=" + engine_->token("alice"),
                    "QUARRY_TEST_KEY_SOUTH=" + engine_->token("bob")}};
  }

  // What account `user` of A holds now, as Daytona's API lists it.
  std::vector<sandbox::SandboxInfo> held_by(const std::string& user,
                                            const sandbox::Labels& labels = {}) const {
    SandboxConfig config;
    config.provider = "daytona";
    config.daytona.api_url = engine_->url() + "/daytona/api";
    auto account = DaytonaProvider::open(config, engine_->token(user));
    EXPECT_TRUE(account) << account.error().message;
    if (!account) return {};
    auto found = (*account)->find(labels);
    EXPECT_TRUE(found) << found.error().message;
    return found ? *found : std::vector<sandbox::SandboxInfo>{};
  }

  std::unique_ptr<QuarryServer> engine_;
};

TEST_F(DaytonaRemoteTest, TwoAccountsShareTheSandboxesAndAServerStoppingLeavesNone) {
  QuarryServer remote(remote_options());
  ASSERT_TRUE(remote.started());
  ApiClient api(remote.url());
  const sandbox::Labels ours = {{"quarry.instance", std::string(kRemoteInstance)}};

  const auto first = api.create_conversation("first");
  const auto second = api.create_conversation("second");
  auto one = api.cell(first, "python", "import polars\nprint('first', polars.__version__)");
  ASSERT_EQ(one.events.back().data["status"], "completed") << one.body << remote.log();
  // The first account had room; the second conversation's sandbox goes to the other.
  auto two = api.cell(second, "python", "print('second')");
  ASSERT_EQ(two.events.back().data["status"], "completed") << two.body << remote.log();

  const auto north = held_by("alice", ours);
  const auto south = held_by("bob", ours);
  ASSERT_EQ(north.size(), 1u);
  ASSERT_EQ(south.size(), 1u);
  const auto capacity = api.get("/api/v1/sandboxes").json["capacity"];
  ASSERT_EQ(capacity["accounts"].size(), 2u) << capacity.dump();
  for (const auto& account : capacity["accounts"]) {
    EXPECT_EQ(account["in_use"], 1) << capacity.dump();
    EXPECT_EQ(account["max_sandboxes"], 1) << capacity.dump();
  }
  // Each conversation keeps the sandbox of its account: a second cell runs where the first ran.
  const std::string seconds_sandbox =
      api.get("/api/v1/conversations/" + second).json["sandbox"]["sandbox_id"];
  EXPECT_EQ(seconds_sandbox, south[0].id);
  auto again = api.cell(second, "python", "print('second again')");
  ASSERT_EQ(again.events.back().data["status"], "completed") << again.body;
  EXPECT_EQ(api.get("/api/v1/conversations/" + second).json["sandbox"]["sandbox_id"],
            seconds_sandbox);

  // A normal stop deletes both, each through the account that holds it.
  EXPECT_EQ(remote.stop(SIGTERM), 0) << remote.log();
  EXPECT_NE(remote.log().find("destroyed 2 sandbox"), std::string::npos) << remote.log();
  EXPECT_TRUE(held_by("alice", ours).empty());
  EXPECT_TRUE(held_by("bob", ours).empty());
}

TEST_F(DaytonaRemoteTest, TheSandboxCommandsManageTheRemoteSandboxes) {
  QuarryServer remote(remote_options());
  ASSERT_TRUE(remote.started());
  std::string output;

  ASSERT_EQ(remote.quarry({"sandbox", "run", "--", "python3", "-c", "print(6 * 7)"}, &output), 0)
      << output;
  EXPECT_EQ(output, "42\n");

  ASSERT_EQ(remote.quarry({"sandbox", "create", "--label", "team=data"}, &output), 0) << output;
  const std::string id = output.substr(0, output.find('\n'));
  // Made in one of the two accounts.
  ASSERT_FALSE(id.empty());
  EXPECT_EQ(held_by("alice", {{"team", "data"}}).size() + held_by("bob", {{"team", "data"}}).size(),
            1u);

  const auto local_file = remote.config().parent_path() / "in.txt";
  std::ofstream(local_file) << "through the account\n";
  // Into a directory named without the trailing '/', under the file's own name, as cp does.
  ASSERT_EQ(remote.quarry({"sandbox", "cp", local_file.string(), id + ":/home/sandbox"}, &output),
            0)
      << output;
  ASSERT_EQ(remote.quarry({"sandbox", "exec", id, "--", "sh", "-c",
                           "test -d /home/sandbox && tr a-z A-Z < /home/sandbox/in.txt > "
                           "/home/sandbox/out.txt"},
                          &output),
            0)
      << output;
  const auto copied = remote.config().parent_path() / "out.txt";
  ASSERT_EQ(
      remote.quarry({"sandbox", "cp", id + ":/home/sandbox/out.txt", copied.string()}, &output), 0)
      << output;
  EXPECT_EQ(read_file(copied).value_or(""), "THROUGH THE ACCOUNT\n");

  ASSERT_EQ(remote.quarry({"sandbox", "exec", id, "--json", "--", "python3", "-c",
                           "x = bytearray(200 << 20)\nfor i in range(0, len(x), 4096): x[i] = 1"},
                          &output),
            0)
      << output;
  auto metered = nlohmann::json::parse(output, nullptr, false);
  ASSERT_TRUE(metered.is_object()) << output;
  EXPECT_GE(metered["peak_memory_bytes"].get<uint64_t>(), 190ull << 20) << output;

  ASSERT_EQ(remote.quarry({"sandbox", "ls", "--label", "team=data"}, &output), 0) << output;
  EXPECT_NE(output.find(id), std::string::npos) << output;
  EXPECT_NE(output.find("team=data"), std::string::npos) << output;
  ASSERT_EQ(remote.quarry({"sandbox", "rm", id}, &output), 0) << output;
  EXPECT_EQ(output, id + "\n");
  EXPECT_TRUE(held_by("alice", {{"team", "data"}}).empty());
  EXPECT_TRUE(held_by("bob", {{"team", "data"}}).empty());
  ASSERT_NE(remote.quarry({"sandbox", "exec", id, "--", "true"}, &output), 0);
  EXPECT_NE(output.find("no account has a sandbox " + id), std::string::npos) << output;

  // Without an account's key the command says which variable to export.
  auto argv = remote.quarry_argv({"sandbox", "ls"});
  std::erase_if(argv,
                [](const std::string& word) { return word.starts_with("QUARRY_TEST_KEY_SOUTH="); });
  argv.insert(argv.begin() + 1, {"-u", "QUARRY_TEST_KEY_SOUTH"});
  auto refused = run_command(argv);  // a nonzero exit is an error with what it printed
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().message.find("$QUARRY_TEST_KEY_SOUTH holds no API key for account "
                                         "south: export QUARRY_TEST_KEY_SOUTH=<key>"),
            std::string::npos)
      << refused.error().message;
}

TEST_F(DaytonaRemoteTest, QuarryAskRunsTheFirstReferenceCaseOnTheRemoteEngine) {
  ApiEnvironment::get().load_demo_data();
  QuarryServer remote(remote_options("peak_views"));
  ASSERT_TRUE(remote.started());
  std::string output;
  const int status = remote.quarry(
      {"ask",
       "Compute the median and 90th percentile of peak views per video for each category, and "
       "make an interactive bar chart of the medians"},
      &output);
  ASSERT_EQ(status, 0) << output;
  // The export went up to the remote sandbox, the step ran there and its files came back.
  EXPECT_NE(output.find("Wrote 6351 rows"), std::string::npos) << output;
  EXPECT_NE(output.find("outputs/category_medians.html"), std::string::npos) << output;
  const std::regex conversation("conversation ([0-9a-z]+)");
  std::smatch found;
  ASSERT_TRUE(std::regex_search(output, found, conversation)) << output;
  ApiClient api(remote.url());
  const auto document = api.get("/api/v1/conversations/" + found[1].str());
  ASSERT_EQ(document.status, 200) << document.body;
  std::set<std::string> artifacts;
  for (const auto& artifact : document.json["artifacts"])
    artifacts.insert(artifact["name"].get<std::string>());
  EXPECT_TRUE(artifacts.contains("category_medians.html")) << document.body;
  EXPECT_TRUE(artifacts.contains("category_stats.csv")) << document.body;
  // The step metered by the probe in the remote sandbox.
  int steps = 0;
  for (const auto& exec : document.json["execs"]) {
    if (exec["tool"] != "run_python") continue;
    ++steps;
    EXPECT_EQ(exec["exit_code"], 0) << exec.dump();
    EXPECT_GT(exec["cpu_ms"].get<double>(), 0) << exec.dump();
    EXPECT_GT(exec["peak_memory_bytes"].get<uint64_t>(), 10ull << 20) << exec.dump();
  }
  EXPECT_EQ(steps, 1) << document.body;

  // The conversation's sandbox stays for its next question; removed here with the command line.
  ASSERT_EQ(remote.quarry({"sandbox", "rm", "--all"}, &output), 0) << output;
  EXPECT_TRUE(held_by("alice").empty());
  EXPECT_TRUE(held_by("bob").empty());
}

}  // namespace
}  // namespace quarry::testing

// The web UI in real browsers: Debian's Chromium and Firefox ESR, driven by playwright-core
// (web/tests/*.mjs), against a real `quarry serve` with PostgreSQL and the demo data, sandboxes
// and the scripted model. Each test starts the server it needs and runs one browser script in
// each browser; the script's assertions decide, and its screenshots are in
// build/test-results/browser (Firefox's named firefox-*.png).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <sys/wait.h>

#include "api_environment.h"
#include "child_process.h"
#include "common/command.h"
#include "common/file_util.h"
#include "sandbox_environment.h"

namespace quarry::testing {
namespace {

// A non-loopback IPv4 address of this host, or "" when it has none: a page served from it over
// plain http is no secure context (as a server reached over the LAN is), so it has no
// navigator.clipboard.
std::string lan_address() {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return "";
  std::string found;
  for (const ifaddrs* entry = list; entry && found.empty(); entry = entry->ifa_next) {
    if (!entry->ifa_addr || entry->ifa_addr->sa_family != AF_INET) continue;
    const auto* address = reinterpret_cast<const sockaddr_in*>(entry->ifa_addr);
    if ((ntohl(address->sin_addr.s_addr) >> 24) == 127) continue;
    char text[INET_ADDRSTRLEN] = {};
    if (::inet_ntop(AF_INET, &address->sin_addr, text, sizeof text)) found = text;
  }
  ::freeifaddrs(list);
  return found;
}

// The model's settings of a server without a model: notebook mode.
constexpr const char* kNoModel =
    "  base_url: https://models.invalid/v1\n"
    "  api_key_env: QUARRY_TEST_NO_SUCH_KEY\n";

// The browser is the test's parameter: "chromium" or "firefox".
class BrowserTest : public ::testing::TestWithParam<std::string> {
 protected:
  static void SetUpTestSuite() { ApiEnvironment::get().load_demo_data(); }

  // Runs web/tests/<script> against `server` and fails the test with its output if it fails.
  void browse(const QuarryServer& server, const std::string& script) {
    ASSERT_TRUE(server.started());
    auto node = find_program("node");
    ASSERT_TRUE(node) << "node is not installed (scripts/setup installs it)";
    const auto results = std::filesystem::path(QUARRY_BUILD_DIR) / "test-results/browser";
    std::filesystem::create_directories(results);
    ::setenv("QUARRY_URL", server.url().c_str(), 1);
    ::setenv("QUARRY_RESULTS", results.c_str(), 1);
    ::setenv("QUARRY_TOKEN_ALICE", server.token("alice").c_str(), 1);
    ::setenv("QUARRY_TOKEN_BOB", server.token("bob").c_str(), 1);
    ::setenv("QUARRY_BROWSER", GetParam().c_str(), 1);
    // Where the servers keep their sandboxes, for a script that kills one from outside.
    ::setenv("QUARRY_STATE_DIR", SandboxEnvironment::get().state_dir().c_str(), 1);
    const auto log = results / (GetParam() + "-" + script + ".log");
    std::filesystem::remove(log);
    ChildProcess browser(
        {node->string(),
         (std::filesystem::path(QUARRY_SOURCE_DIR) / "web/tests" / script).string()},
        log);
    const std::string output = browser.rest();
    const int status = browser.wait();
    auto errors = read_file(log);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << script << " failed:\n"
        << output << (errors ? *errors : "") << "\nthe server's log:\n"
        << server.log();
    EXPECT_TRUE(output.ends_with("ok\n")) << output;
  }
};

TEST_P(BrowserTest, TheFirstCaseTypedIntoTheUi) {
  QuarryServer server({.scenario = "peak_views"});
  browse(server, "peak_views.mjs");
}

TEST_P(BrowserTest, TheSecondCaseShowsTheOomAndTheLoadPage) {
  // Exporting 20 million events takes about 10 s on a quiet 2-core host and went past the
  // default statement_timeout (30 s) under a parallel build: what is tested is what follows.
  QuarryServer server({.scenario = "sessions_oom", .database_config = "  statement_timeout: 5m\n"});
  browse(server, "sessions_oom.mjs");
}

TEST_P(BrowserTest, StopDuringARunningStep) {
  QuarryServer server({.scenario = "long_command"});
  browse(server, "stop.mjs");
}

TEST_P(BrowserTest, AReloadMidTurnResumesTheStream) {
  QuarryServer server({.scenario = "resume"});
  browse(server, "reload.mjs");
}

TEST_P(BrowserTest, ABrokenConnectionIsPickedUpAgainAndARefusedQuestionIsKept) {
  QuarryServer server({.scenario = "reconnect"});
  browse(server, "connection.mjs");
}

TEST_P(BrowserTest, NotebookModeWithoutAModel) {
  QuarryServer server({.model_config = kNoModel});
  browse(server, "notebook.mjs");
}

TEST_P(BrowserTest, AStepShowsTheConnectionsItsNetworkAllowlistRefused) {
  QuarryServer server({.sandbox_config = "  network: {mode: allowlist, allow: [pypi.org]}\n",
                       .model_config = kNoModel});
  browse(server, "network.mjs");
}

TEST_P(BrowserTest, ATurnWaitingForASandboxSaysSoAndTheLoadPageShowsCapacity) {
  QuarryServer server({.model_config = kNoModel, .capacity_config = "  max_sandboxes: 1\n"});
  browse(server, "capacity.mjs");
}

TEST_P(BrowserTest, HostileContentRunsNothingInThePage) {
  QuarryServer server({.scenario = "hostile", .tokens = true});
  browse(server, "hostile.mjs");
}

// Without tokens every request on loopback is the user 'local': only the origin check stands
// between the artifact's requests and the user's conversations.
TEST_P(BrowserTest, HostileContentChangesNothingOnAServerWithoutTokens) {
  QuarryServer server({.scenario = "hostile"});
  browse(server, "hostile.mjs");
}

TEST_P(BrowserTest, StepsShowTheirCodeOutputChartsAndTablesAndRunAgainAsCells) {
  QuarryServer server(
      {.scenario = "chat", .sandbox_config = "  exec_timeout: 5s\n  output_limit: 4KiB\n"});
  browse(server, "chat.mjs");
}

TEST_P(BrowserTest, SandboxEventsShowWhereTheyHappened) {
  QuarryServer server({.sandbox_config = "  idle_timeout: 3s\n  resources: {memory: 256MiB}\n",
                       .model_config = kNoModel});
  browse(server, "sandbox_events.mjs");
}

// With tokens, so the user is the test's own and the overview holds only its steps.
TEST_P(BrowserTest, TheLoadPageOfAllConversationsListsSortsAndFollows) {
  QuarryServer server({.scenario = "many_steps", .tokens = true});
  browse(server, "load.mjs");
}

// Served on a LAN address, as a team would reach it: no secure context, so copying takes the
// fallback that works without navigator.clipboard.
TEST_P(BrowserTest, AWholeFlowWithTheKeyboardAlone) {
  const std::string address = lan_address();
  if (address.empty()) GTEST_SKIP() << "this host has no IPv4 address but loopback";
  QuarryServer server({.scenario = "long_command", .tokens = true, .listen = address + ":0"});
  browse(server, "keyboard.mjs");
}

TEST_P(BrowserTest, SignInAndAnotherUsersConversationIsOutOfReach) {
  QuarryServer server({.tokens = true});
  browse(server, "access.mjs");
}

INSTANTIATE_TEST_SUITE_P(Browsers, BrowserTest, ::testing::Values("chromium", "firefox"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace quarry::testing

// The web UI in a real browser: Debian's Chromium driven by playwright-core (web/tests/*.mjs)
// against a real `quarry serve` with PostgreSQL and the demo data, sandboxes and the scripted
// model. Each test starts the server it needs and runs one browser script; the script's
// assertions decide, and its screenshots are in build/test-results/browser.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>

#include "api_environment.h"
#include "child_process.h"
#include "common/command.h"
#include "common/file_util.h"

namespace quarry::testing {
namespace {

class BrowserTest : public ::testing::Test {
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
    const auto log = results / (script + ".log");
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

TEST_F(BrowserTest, TheFirstCaseTypedIntoTheUi) {
  QuarryServer server({.scenario = "peak_views"});
  browse(server, "peak_views.mjs");
}

TEST_F(BrowserTest, TheSecondCaseShowsTheOomAndTheLoadPage) {
  QuarryServer server({.scenario = "sessions_oom"});
  browse(server, "sessions_oom.mjs");
}

TEST_F(BrowserTest, StopDuringARunningStep) {
  QuarryServer server({.scenario = "long_command"});
  browse(server, "stop.mjs");
}

TEST_F(BrowserTest, AReloadMidTurnResumesTheStream) {
  QuarryServer server({.scenario = "resume"});
  browse(server, "reload.mjs");
}

TEST_F(BrowserTest, NotebookModeWithoutAModel) {
  QuarryServer server({.model_config = "  base_url: https://models.invalid/v1\n"
                                       "  api_key_env: QUARRY_TEST_NO_SUCH_KEY\n"});
  browse(server, "notebook.mjs");
}

TEST_F(BrowserTest, HostileContentRunsNothingInThePage) {
  QuarryServer server({.scenario = "hostile", .tokens = true});
  browse(server, "hostile.mjs");
}

TEST_F(BrowserTest, SignInAndAnotherUsersConversationIsOutOfReach) {
  QuarryServer server({.tokens = true});
  browse(server, "access.mjs");
}

}  // namespace
}  // namespace quarry::testing

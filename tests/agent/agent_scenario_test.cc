// The agent end to end: a real PostgreSQL with the demo data, real sandboxes, and the scripted
// model server playing the model through the real HTTP protocol. Each test runs one scenario
// of tests/agent/scenarios and checks what a user would: the numbers against SQL, the files,
// the history.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <sstream>

#include "agent/agent.h"
#include "agent/guidance.h"
#include "common/file_util.h"
#include "conversation/sqlite_history_store.h"
#include "data/connection.h"
#include "data/demo_data.h"
#include "postgres_environment.h"
#include "reference_numbers.h"
#include "sandbox_environment.h"
#include "server_process.h"

namespace quarry::testing {
namespace {

using agent::AgentEvent;
using conversation::ExecRecord;

class AgentScenarioTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // The reference cases' data at full size: 20 million events are what makes Polars run out
    // of a 1 GiB sandbox in the second case (about half a minute to generate).
    Progress progress("seed-demo", 3);
    auto seeded = data::seed_demo(PostgresEnvironment::get().server().admin_conninfo, {}, progress);
    ASSERT_TRUE(seeded) << seeded.error().message;
    auto server = ScriptedModelServer::start(
        {.scenario_dir = std::filesystem::path(QUARRY_SOURCE_DIR) / "tests/agent/scenarios"});
    ASSERT_TRUE(server) << server.error().message;
    model_server_ = std::move(*server);
  }
  static void TearDownTestSuite() { model_server_.reset(); }

  void SetUp() override {
    ASSERT_TRUE(model_server_);
    auto& sandboxes = SandboxEnvironment::get();
    state_dir_ =
        sandboxes.state_dir() / ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::create_directories(state_dir_);
    auto history = conversation::SqliteHistoryStore::open(state_dir_ / "history.db", clock_);
    ASSERT_TRUE(history) << history.error().message;
    history_ = std::move(*history);
    config_.model.base_url = model_server_->base_url();
    config_.sandbox.export_max_rows = 50'000'000;  // the second case exports every event
    // ... which takes about 10 s on a quiet 2-core host, past the default statement_timeout
    // (30 s) under load.
    config_.database.statement_timeout = std::chrono::minutes(5);
    config_.conversations.instance_id = fmt::format("agent-test-{}", ::getpid());
    manager_ = std::make_unique<conversation::ConversationManager>(
        sandboxes.provider(), *history_, clock_, conversation::manager_options(config_));
  }

  void TearDown() override {
    if (manager_) (void)manager_->shutdown();
  }

  struct Turn {
    Result<std::string> answer;
    std::vector<std::string> steps;  // "tool_call run_python", "artifact x.html", ...
  };

  // One turn of `conversation` (a new one if empty) answered from `scenario`.
  Turn ask(const std::string& scenario, const std::string& question, std::string& conversation) {
    config_.model.name = scenario;
    auto model = agent::make_model_client(config_.model);
    EXPECT_TRUE(model) << model.error().message;
    if (conversation.empty()) conversation = history_->create_conversation(question)->id;
    agent::Toolbox toolbox(
        {config_,
         data::DatabaseTarget{PostgresEnvironment::get().server().reader_conninfo, "", false},
         *history_, state_dir_});
    // The model is told what the real image holds, as quarry ask and serve tell it.
    auto runtime = manager_->sandbox_runtime();
    EXPECT_TRUE(runtime) << runtime.error().message;
    agent::Agent agent(
        model->get(), *manager_, *history_, toolbox,
        agent::system_prompt(config_, runtime ? std::optional(*runtime) : std::nullopt),
        agent::agent_options(config_));
    Turn turn{Result<std::string>(""), {}};
    turn.answer = agent.run_turn(conversation, question, [&](const AgentEvent& event) {
      switch (event.kind) {
        case AgentEvent::Kind::kToolCall:
          turn.steps.push_back("call " + event.tool);
          break;
        case AgentEvent::Kind::kToolResult:
          turn.steps.push_back(
              fmt::format("{} {}", event.result->ok ? "ok" : "failed", event.tool));
          break;
        case AgentEvent::Kind::kArtifact:
          turn.steps.push_back("artifact " + event.artifact->name);
          break;
        default:
          break;
      }
    });
    return turn;
  }

  // The turn's executions as recorded, each also printed with its metering: the figures the
  // reference cases are judged by.
  std::vector<ExecRecord> execs(const std::string& conversation) {
    auto records = *history_->execs(conversation);
    for (const auto& record : records) {
      const auto& r = record.result;
      fmt::print(
          "  exec {}: exit {}, run {:.0f} ms, cpu {:.0f} ms, peak {} MiB of {} MiB, "
          "overhead {:.2f} ms{}\n",
          record.id, r.exit_code, r.run_ms, r.cpu_ms, r.peak_memory_bytes >> 20,
          r.memory_limit_bytes >> 20, r.overhead_ms, r.oom ? ", OOM" : "");
    }
    return records;
  }

  static inline std::unique_ptr<ScriptedModelServer> model_server_;
  ManualClock clock_;
  Config config_;
  std::filesystem::path state_dir_;
  std::unique_ptr<conversation::SqliteHistoryStore> history_;
  std::unique_ptr<conversation::ConversationManager> manager_;
};

// The model writes code for the libraries the image has: the prompt names the image's Python
// and the version of each configured package, read from the built image (the pinned defaults).
TEST_F(AgentScenarioTest, TheModelIsToldThePythonAndLibraryVersionsOfTheImage) {
  auto runtime = manager_->sandbox_runtime();
  ASSERT_TRUE(runtime) << runtime.error().message;
  const auto prompt = agent::system_prompt(config_, *runtime);
  EXPECT_NE(prompt.find(fmt::format("Python {} with polars ", runtime->python_version)),
            std::string::npos)
      << prompt;
  for (const auto& requirement : config_.sandbox.packages) {
    const auto pin = requirement.find("==");
    ASSERT_NE(pin, std::string::npos) << requirement;
    const auto named =
        fmt::format("{} {}", requirement.substr(0, pin), requirement.substr(pin + 2));
    EXPECT_NE(prompt.find(named), std::string::npos) << named << "\n" << prompt;
  }
}

TEST_F(AgentScenarioTest, MedianAndP90OfPeakViewsWithAnInteractiveChart) {
  std::string conversation;
  auto turn = ask("peak_views",
                  "Compute the median and 90th percentile of peak views per video for each "
                  "category, and make an interactive bar chart of the medians",
                  conversation);
  ASSERT_TRUE(turn.answer) << turn.answer.error().message;
  EXPECT_NE(turn.answer->find("outputs/category_medians.html"), std::string::npos);
  EXPECT_EQ(turn.steps,
            (std::vector<std::string>{"call export_query", "ok export_query", "call run_python",
                                      "ok run_python", "artifact category_medians.html",
                                      "artifact category_stats.csv"}));
  // One code step, metered and recorded.
  auto runs = execs(conversation);
  ASSERT_EQ(runs.size(), 1u);
  const auto& run = runs[0].result;
  EXPECT_EQ(run.exit_code, 0) << run.stderr_text;
  EXPECT_GT(run.run_ms, 0);
  EXPECT_GT(run.cpu_ms, 0);
  EXPECT_GT(run.peak_memory_bytes, 50u << 20);
  EXPECT_EQ(run.memory_limit_bytes, 1u << 30);
  // The numbers the turn reports are PostgreSQL's own, computed independently.
  auto reported = parse_table(run.stdout_text);
  expect_same_numbers(reported, sql_table(kPeakViewsSql));
  double videos = 0;
  for (const auto& [name, numbers] : reported)
    videos += numbers[2];
  EXPECT_EQ(videos, 6351);
  // The chart is an interactive plotly page, kept with the conversation.
  auto artifacts = *history_->artifacts(conversation);
  ASSERT_EQ(artifacts.size(), 2u);
  EXPECT_EQ(artifacts[0].name, "category_medians.html");
  EXPECT_EQ(artifacts[0].type, "html");
  auto page = read_file(artifacts[0].location);
  ASSERT_TRUE(page);
  EXPECT_GT(page->size(), 100'000u);
  EXPECT_NE(page->find("plotly"), std::string::npos);
  auto table = read_file(artifacts[1].location);
  ASSERT_TRUE(table);
  EXPECT_TRUE(table->starts_with("category_name,median,p90,videos\n")) << *table;
  EXPECT_EQ(std::count(table->begin(), table->end(), '\n'), static_cast<long>(reported.size()) + 1);
}

TEST_F(AgentScenarioTest, PolarsRunsOutOfMemoryAndTheRewriteInDuckDbCompletes) {
  std::string conversation;
  auto turn =
      ask("sessions_oom", "What is the typical session length per device? Use the events table.",
          conversation);
  ASSERT_TRUE(turn.answer) << turn.answer.error().message;
  EXPECT_EQ(turn.steps,
            (std::vector<std::string>{"call export_query", "ok export_query", "call run_python",
                                      "failed run_python", "call run_python", "ok run_python"}));
  auto runs = execs(conversation);
  ASSERT_EQ(runs.size(), 2u);
  // The Polars step: killed by the kernel for memory, measured at the 1 GiB limit.
  const auto& polars = runs[0].result;
  EXPECT_TRUE(polars.oom);
  EXPECT_EQ(polars.memory_limit_bytes, 1u << 30);
  EXPECT_GT(polars.peak_memory_bytes, 900u << 20);
  ASSERT_TRUE(polars.message);
  EXPECT_TRUE(polars.message->starts_with("Killed: command ran out of memory.\nPeak memory: "));
  // The model was told in those words (the scenario only goes on if it was).
  auto messages = *history_->messages(conversation);
  auto told = std::find_if(messages.begin(), messages.end(), [](const auto& m) {
    return m.role == conversation::Role::kTool &&
           m.content.find("Killed: command ran out of memory.") != std::string::npos;
  });
  ASSERT_NE(told, messages.end());
  EXPECT_NE(told->content.find("Environment error (out of memory)"), std::string::npos);
  // The DuckDB rewrite: completes inside the same limit, with PostgreSQL's numbers.
  const auto& duckdb = runs[1].result;
  EXPECT_EQ(duckdb.exit_code, 0) << duckdb.stderr_text;
  EXPECT_FALSE(duckdb.oom);
  EXPECT_LT(duckdb.peak_memory_bytes, 1u << 30);
  EXPECT_EQ(runs[0].sandbox_id, runs[1].sandbox_id);
  expect_same_numbers(parse_table(duckdb.stdout_text), sql_table(kSessionLengthSql));
}

TEST_F(AgentScenarioTest, ACodeErrorGoesBackAsATracebackAndTheFixWorks) {
  std::string conversation;
  auto turn = ask("code_error", "Add up 1, 2 and 3 with Polars.", conversation);
  ASSERT_TRUE(turn.answer) << turn.answer.error().message;
  EXPECT_EQ(*turn.answer, "The sum is 6.");
  auto runs = execs(conversation);
  ASSERT_EQ(runs.size(), 2u);
  EXPECT_EQ(runs[0].result.exit_code, 1);
  EXPECT_NE(runs[0].result.stderr_text.find("NameError: name 'pritn' is not defined"),
            std::string::npos);
  EXPECT_EQ(runs[1].result.exit_code, 0);
  EXPECT_EQ(runs[1].result.stdout_text, "6\n");
  EXPECT_EQ(runs[0].command, "python count.py (kernel)");
}

TEST_F(AgentScenarioTest, AFollowUpTurnReusesTheFilesOfThePreviousOne) {
  std::string conversation;
  auto first = ask("follow_up", "What are the median peak views per category?", conversation);
  ASSERT_TRUE(first.answer) << first.answer.error().message;
  auto second = ask("follow_up", "Thanks, now chart it", conversation);
  ASSERT_TRUE(second.answer) << second.answer.error().message;
  // No new export: the chart is drawn from the file the first turn left in the sandbox.
  EXPECT_EQ(second.steps,
            (std::vector<std::string>{"call run_python", "ok run_python", "artifact medians.png"}));
  auto runs = execs(conversation);
  ASSERT_EQ(runs.size(), 2u);
  EXPECT_EQ(runs[0].turn, 1);
  EXPECT_EQ(runs[1].turn, 2);
  EXPECT_EQ(runs[0].sandbox_id, runs[1].sandbox_id);
  EXPECT_NE(runs[1].result.stdout_text.find("categories charted"), std::string::npos);
  auto artifacts = *history_->artifacts(conversation);
  ASSERT_EQ(artifacts.size(), 2u);
  EXPECT_EQ(artifacts[1].name, "medians.png");
  EXPECT_EQ(artifacts[1].turn, 2);
  auto png = read_file(artifacts[1].location);
  ASSERT_TRUE(png);
  EXPECT_TRUE(png->starts_with("\x89PNG"));
}

TEST_F(AgentScenarioTest, ClaimsAreCheckedAndBadCallsComeBackAsErrorsToFix) {
  std::string conversation;
  auto turn = ask("unchecked_claim", "Make a chart of the summary.", conversation);
  ASSERT_TRUE(turn.answer) << turn.answer.error().message;
  // The user gets the corrected answer, not the claim of a file that does not exist.
  EXPECT_EQ(*turn.answer, "I could not make the chart; nothing was written to outputs.");
  EXPECT_EQ(turn.steps,
            (std::vector<std::string>{"call run_python", "failed run_python", "call run_python",
                                      "failed run_python", "call run_python", "ok run_python"}));
  EXPECT_TRUE(history_->artifacts(conversation)->empty());
}

}  // namespace
}  // namespace quarry::testing

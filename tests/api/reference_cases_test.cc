// The seed's two reference cases through the HTTP API, as a client of `quarry serve` sees them:
// the turn streamed as it happens, the numbers equal to PostgreSQL's own, the metering, the
// history and the artifacts.
#include <gtest/gtest.h>

#include "api_environment.h"
#include "reference_numbers.h"

namespace quarry::testing {
namespace {

class ReferenceCasesTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { ApiEnvironment::get().load_demo_data(); }
};

// Every event's id is TURN-SEQ, in order, none missing: what a resuming client relies on.
void expect_numbered(const std::vector<StreamEvent>& events, int turn) {
  for (size_t i = 0; i < events.size(); ++i) {
    EXPECT_EQ(events[i].id, fmt::format("{}-{}", turn, i + 1));
    EXPECT_EQ(events[i].data.value("type", ""), events[i].type);
    EXPECT_EQ(events[i].data.value("turn", 0), turn);
  }
}

// What the client saw of each tool step: "tool_started export_query", "tool_finished ok", ...
std::vector<std::string> steps(const std::vector<StreamEvent>& events) {
  std::vector<std::string> seen;
  for (const auto& event : events) {
    if (event.type == "tool_started") {
      seen.push_back("started " + event.data.value("tool", ""));
    } else if (event.type == "tool_finished") {
      seen.push_back(fmt::format("{} {}", event.data.value("ok", false) ? "ok" : "failed",
                                 event.data.value("tool", "")));
    } else if (event.type == "artifact") {
      seen.push_back("artifact " + event.data["artifact"].value("name", ""));
    }
  }
  return seen;
}

// A step's stdout as it streamed.
std::string streamed_stdout(const std::vector<StreamEvent>& events, const std::string& call_id) {
  std::string text;
  for (const auto& event : of_type(events, "output")) {
    if (event.data["call_id"] == call_id && event.data["stream"] == "stdout") {
      text += event.data.value("text", "");
    }
  }
  return text;
}

TEST_F(ReferenceCasesTest, MedianAndP90OfPeakViewsWithAnInteractiveChart) {
  QuarryServer server({.scenario = "peak_views"});
  ASSERT_TRUE(server.started());
  ApiClient api(server.url());
  const auto id = api.create_conversation();
  auto turn = api.ask(id,
                      "Compute the median and 90th percentile of peak views per video for each "
                      "category, and make an interactive bar chart of the medians");
  ASSERT_EQ(turn.status, 200) << turn.body;
  EXPECT_TRUE(turn.header("Content-Type").starts_with("text/event-stream"));
  ASSERT_FALSE(turn.events.empty());
  expect_numbered(turn.events, 1);
  EXPECT_EQ(turn.events.front().type, "turn_started");
  const auto& done = turn.events.back();
  ASSERT_EQ(done.type, "done");
  EXPECT_EQ(done.data["status"], "completed") << done.data.dump();
  EXPECT_NE(done.data.value("answer", "").find("outputs/category_medians.html"), std::string::npos);
  EXPECT_EQ(steps(turn.events),
            (std::vector<std::string>{
                "started export_query", "ok export_query", "started run_python", "ok run_python",
                "artifact category_medians.html", "artifact category_stats.csv"}));
  // The answer streamed in pieces before the end.
  EXPECT_GT(of_type(turn.events, "text").size(), 3u);

  // One code step, metered by the sandbox, not reported by the model.
  auto finished = of_type(turn.events, "tool_finished");
  const auto& run = finished[1].data;
  ASSERT_TRUE(run["exec"].is_object()) << run.dump();
  EXPECT_EQ(run["exec"]["exit_code"], 0);
  EXPECT_GT(run["exec"]["run_ms"].get<double>(), 0);
  EXPECT_GT(run["exec"]["cpu_ms"].get<double>(), 0);
  EXPECT_GT(run["exec"]["peak_memory_bytes"].get<uint64_t>(), 50u << 20);
  EXPECT_EQ(run["exec"]["memory_limit_bytes"], 1u << 30);
  EXPECT_GE(run["elapsed_ms"].get<double>(), run["exec"]["run_ms"].get<double>());
  // Its output streamed live is what it printed, and its numbers are PostgreSQL's.
  const std::string call_id = run["call_id"];
  const std::string printed = streamed_stdout(turn.events, call_id);
  auto reported = parse_table(printed);
  expect_same_numbers(reported, sql_table(kPeakViewsSql));
  double videos = 0;
  for (const auto& [name, numbers] : reported)
    videos += numbers[2];
  EXPECT_EQ(videos, 6351);

  // The history holds the same, in one document.
  auto conversation = api.get("/api/v1/conversations/" + id);
  ASSERT_EQ(conversation.status, 200);
  const auto& document = conversation.json;
  EXPECT_NE(document.value("title", "").find("median and 90th percentile"), std::string::npos);
  ASSERT_EQ(document["turns"].size(), 1u);
  EXPECT_EQ(document["turns"][0]["status"], "completed");
  ASSERT_EQ(document["execs"].size(), 1u);
  EXPECT_EQ(document["execs"][0]["tool_call_id"], call_id);
  EXPECT_EQ(document["execs"][0]["stdout"], printed);
  EXPECT_EQ(document["execs"][0]["peak_memory_bytes"], run["exec"]["peak_memory_bytes"]);
  ASSERT_EQ(document["artifacts"].size(), 2u);
  EXPECT_EQ(document["sandbox"]["state"], "idle");

  // The chart: an interactive page, served as untrusted sandbox output.
  const auto& chart = document["artifacts"][0];
  EXPECT_EQ(chart["name"], "category_medians.html");
  EXPECT_EQ(chart["tool_call_id"], call_id);
  auto page = api.get(chart["url"]);
  ASSERT_EQ(page.status, 200);
  EXPECT_EQ(page.header("Content-Type"), "text/html; charset=utf-8");
  EXPECT_EQ(page.body.size(), chart["size_bytes"].get<size_t>());
  EXPECT_NE(page.body.find("plotly"), std::string::npos);
  EXPECT_TRUE(page.header("Content-Security-Policy").starts_with("sandbox allow-scripts;"));
  EXPECT_EQ(page.header("X-Content-Type-Options"), "nosniff");
  auto table = api.get(document["artifacts"][1]["url"].get<std::string>() + "?download=1");
  ASSERT_EQ(table.status, 200);
  EXPECT_TRUE(table.body.starts_with("category_name,median,p90,videos\n")) << table.body;
  EXPECT_TRUE(table.header("Content-Disposition").starts_with("attachment;"));

  // Metering, as the Load page reads it.
  auto execs = api.get("/api/v1/execs?conversation=" + id);
  ASSERT_EQ(execs.status, 200);
  EXPECT_EQ(execs.json["totals"]["steps"], 1);
  EXPECT_EQ(execs.json["totals"]["ooms"], 0);
  EXPECT_EQ(execs.json["execs"][0]["conversation_id"], id);
  EXPECT_FALSE(execs.json["execs"][0].contains("stdout"));
  EXPECT_EQ(server.stop(SIGTERM), 0);
}

TEST_F(ReferenceCasesTest, PolarsRunsOutOfMemoryAndTheRewriteInDuckDbCompletes) {
  // Exporting 20 million events takes about 10 s on a quiet 2-core host and went past the
  // default statement_timeout (30 s) under a parallel build: what is tested is what follows.
  QuarryServer server({.scenario = "sessions_oom", .database_config = "  statement_timeout: 5m\n"});
  ASSERT_TRUE(server.started());
  ApiClient api(server.url());
  const auto id = api.create_conversation();
  auto turn = api.ask(id, "What is the typical session length per device? Use the events table.");
  ASSERT_EQ(turn.status, 200) << turn.body;
  expect_numbered(turn.events, 1);
  ASSERT_EQ(turn.events.back().type, "done");
  EXPECT_EQ(turn.events.back().data["status"], "completed");
  EXPECT_EQ(steps(turn.events), (std::vector<std::string>{"started export_query", "ok export_query",
                                                          "started run_python", "failed run_python",
                                                          "started run_python", "ok run_python"}));
  auto finished = of_type(turn.events, "tool_finished");
  // The Polars step: killed by the kernel for memory, measured at the 1 GiB limit, and the
  // model was told so in words it acts on.
  const auto& polars = finished[1].data;
  EXPECT_EQ(polars["exec"]["oom"], true);
  EXPECT_GT(polars["exec"]["peak_memory_bytes"].get<uint64_t>(), 900u << 20);
  EXPECT_EQ(polars["failure"]["kind"], "environment");
  EXPECT_NE(polars["content"].get<std::string>().find("Killed: command ran out of memory."),
            std::string::npos);
  // The DuckDB rewrite: within the same limit, with PostgreSQL's numbers.
  const auto& duckdb = finished[2].data;
  EXPECT_EQ(duckdb["exec"]["exit_code"], 0);
  EXPECT_EQ(duckdb["exec"]["oom"], false);
  EXPECT_LT(duckdb["exec"]["peak_memory_bytes"].get<uint64_t>(), 1u << 30);
  expect_same_numbers(parse_table(streamed_stdout(turn.events, duckdb["call_id"])),
                      sql_table(kSessionLengthSql));

  auto execs = api.get("/api/v1/execs?conversation=" + id);
  ASSERT_EQ(execs.status, 200);
  EXPECT_EQ(execs.json["totals"]["steps"], 2);
  EXPECT_EQ(execs.json["totals"]["ooms"], 1);
  EXPECT_EQ(execs.json["execs"].size(), 2u);
  // Newest first: the DuckDB run, then the one that ran out of memory.
  EXPECT_EQ(execs.json["execs"][0]["oom"], false);
  EXPECT_EQ(execs.json["execs"][1]["oom"], true);
  EXPECT_EQ(server.stop(SIGTERM), 0);
}

}  // namespace
}  // namespace quarry::testing

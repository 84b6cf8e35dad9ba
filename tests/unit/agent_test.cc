// The agent's pieces that need no model and no sandbox: argument checks, failure
// classification, artifact types, the guidance prompt.
#include "agent/agent.h"

#include <gtest/gtest.h>

#include "agent/artifacts.h"
#include "agent/failure.h"
#include "agent/guidance.h"
#include "agent/tools.h"

namespace quarry::agent {
namespace {

ToolSchema run_python_definition() {
  return {"run_python",
          "",
          {{"type", "object"},
           {"properties",
            {{"path", {{"type", "string"}}},
             {"code", {{"type", "string"}}},
             {"expected_outputs", {{"type", "array"}, {"items", {{"type", "string"}}}}}}},
           {"additionalProperties", false}}};
}

TEST(ToolArguments, BadArgumentsSayWhatToFix) {
  ToolSchema export_query{
      "export_query",
      "",
      {{"type", "object"},
       {"properties", {{"sql", {{"type", "string"}}}, {"filename", {{"type", "string"}}}}},
       {"required", {"sql", "filename"}}}};
  struct Case {
    nlohmann::json arguments;
    const char* message;
  } cases[] = {
      {nlohmann::json::array(), "export_query: the arguments must be a JSON object, not array"},
      {{{"sql", "select 1"}}, "export_query: 'filename' is required"},
      {{{"sql", 1}, {"filename", "a.parquet"}}, "export_query: 'sql' must be a string, not number"},
      {{{"sql", "s"}, {"filename", "f"}, {"limit", 5}},
       "export_query: unknown argument 'limit' (its arguments are: filename, sql)"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.arguments.dump());
    auto checked = check_arguments(export_query, c.arguments);
    ASSERT_FALSE(checked);
    EXPECT_EQ(checked.error().message, c.message);
  }
  EXPECT_TRUE(check_arguments(export_query, {{"sql", "select 1"}, {"filename", "a.parquet"}}));
  EXPECT_FALSE(check_arguments(run_python_definition(), {{"expected_outputs", {1, 2}}}));
  EXPECT_TRUE(check_arguments(run_python_definition(),
                              {{"path", "a.py"}, {"expected_outputs", {"chart.html"}}}));
}

sandbox::ExecResult failed_run(int exit_code, std::string stderr_text) {
  sandbox::ExecResult result;
  result.exit_code = exit_code;
  result.stderr_text = std::move(stderr_text);
  return result;
}

TEST(NamedOutputs, FindsThePathsAnAnswerNamesUnderTheOutputDirectory) {
  const std::string dir = "/home/sandbox/outputs";
  EXPECT_EQ(named_outputs("See outputs/chart.png and /home/sandbox/outputs/plots/a.svg.", dir),
            (std::set<std::string>{"chart.png", "plots/a.svg"}));
  EXPECT_EQ(named_outputs("outputs/report.v2.csv, (outputs/x.html)", dir),
            (std::set<std::string>{"report.v2.csv", "x.html"}));
  // Not under it, or no extension.
  EXPECT_TRUE(
      named_outputs("my_outputs/a.png data/outputs/b.png outputs/notes outputs/.", dir).empty());
  EXPECT_EQ(named_outputs("outputs/a.png-draft", dir), (std::set<std::string>{"a.png"}));
  // A std::regex recursed once a character: this overflowed the stack of the server.
  const std::string long_path = "outputs/" + std::string(200000, 'a') + ".png";
  EXPECT_EQ(named_outputs(long_path, dir),
            (std::set<std::string>{std::string(200000, 'a') + ".png"}));
  EXPECT_TRUE(
      named_outputs(std::string(100000, '/') + "outputs/" + std::string(100000, 'b'), dir).empty());
}

TEST(FailureClassification, TellsCodeFromEnvironment) {
  const std::vector<std::string> packages = {"polars", "duckdb"};
  struct Case {
    const char* name;
    sandbox::ExecResult result;
    FailureKind kind;
    const char* cause;
  } cases[] = {
      {"success", failed_run(0, ""), FailureKind::kNone, ""},
      {"traceback",
       failed_run(1,
                  "Traceback (most recent call last):\n  File \"a.py\", line 3\nNameError: "
                  "name 'pl' is not defined"),
       FailureKind::kCode, ""},
      {"syntax error", failed_run(1, "  File \"a.py\", line 1\nSyntaxError: invalid syntax"),
       FailureKind::kCode, ""},
      {"missing module", failed_run(1, "ModuleNotFoundError: No module named 'sklearn'"),
       FailureKind::kEnvironment, "missing module"},
      {"disk full", failed_run(1, "OSError: [Errno 122] Disk quota exceeded"),
       FailureKind::kEnvironment, "disk full"},
      {"network",
       failed_run(1,
                  "urllib.error.URLError: <urlopen error [Errno -3] Temporary failure in name "
                  "resolution>"),
       FailureKind::kEnvironment, "network"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    auto failure = classify(c.result, packages);
    EXPECT_EQ(failure.kind, c.kind);
    EXPECT_EQ(failure.cause, c.cause);
  }
  sandbox::ExecResult oom = failed_run(137, "");
  oom.oom = true;
  oom.signal = 9;
  auto failure = classify(oom, packages);
  EXPECT_EQ(failure.cause, "out of memory");
  EXPECT_NE(describe(failure).find("Environment error (out of memory): Running the same code "
                                   "again will fail"),
            std::string::npos);
  EXPECT_NE(failure.advice.find("DuckDB"), std::string::npos);
  sandbox::ExecResult timeout = failed_run(137, "");
  timeout.timed_out = true;
  EXPECT_EQ(classify(timeout, packages).cause, "timeout");
  EXPECT_NE(classify(failed_run(1, "No module named 'x'"), packages).advice.find("polars, duckdb"),
            std::string::npos);
  EXPECT_EQ(describe(classify(failed_run(1, "boom"), packages)),
            "Code error: Read the error above, fix the code, and run it again.");
}

TEST(Artifacts, OnlyTheListedTypesAreCollected) {
  EXPECT_EQ(artifact_type("outputs/chart.html"), "html");
  EXPECT_EQ(artifact_type("a.PNG"), "png");
  EXPECT_EQ(artifact_type("table.parquet"), "parquet");
  EXPECT_EQ(artifact_type("notes.txt"), "");
  EXPECT_EQ(artifact_type("Makefile"), "");
}

TEST(Guidance, CarriesTheExecutionAdvice) {
  Config config;
  auto prompt = system_prompt(config, std::nullopt);
  for (const char* advice :
       {"Filter and aggregate in SQL first", "Export only the columns", "Polars for smaller",
        "DuckDB for large data, medians, percentiles and distinct counts",
        "After an out-of-memory error, change the approach", "never rerun the same code",
        "/home/sandbox/data", "/home/sandbox/outputs"}) {
    EXPECT_NE(prompt.find(advice), std::string::npos) << advice;
  }
  // Without an image to read, the configured packages by name.
  EXPECT_NE(prompt.find("Python packages available: polars=="), std::string::npos) << prompt;
}

TEST(Guidance, NamesThePythonAndLibraryVersionsOfTheImage) {
  Config config;
  sandbox::Runtime runtime;
  runtime.python_version = "3.11";
  runtime.requested = {{"polars", "1.35.2"}, {"duckdb", "1.4.4"}, {"pyarrow", "22.0.0"},
                       {"pandas", "2.3.3"},  {"numpy", "2.3.5"},  {"matplotlib", "3.10.8"},
                       {"plotly", "6.5.2"}};
  auto prompt = system_prompt(config, runtime);
  for (const char* part :
       {"Python 3.11 with polars 1.35.2, duckdb 1.4.4, pyarrow 22.0.0, pandas 2.3.3, numpy 2.3.5, "
        "matplotlib 3.10.8, plotly 6.5.2",
        "Write code for exactly these versions"}) {
    EXPECT_NE(prompt.find(part), std::string::npos) << part << "\n" << prompt;
  }
  EXPECT_EQ(prompt.find("Python packages available"), std::string::npos);
}

TEST(Guidance, NamesAConversationsExtraPackages) {
  EXPECT_EQ(extra_packages_text({}), "");
  const auto text = extra_packages_text({"tabulate==0.9.0", "quarry-probe"});
  EXPECT_NE(text.find("also has tabulate==0.9.0, quarry-probe installed"), std::string::npos)
      << text;
}

}  // namespace
}  // namespace quarry::agent

#include "agent/guidance.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "agent/artifacts.h"
#include "common/units.h"

namespace quarry::agent {

namespace {

// "Python 3.11 with polars 1.35.2, duckdb 1.4.4 ... Write code for these versions ...", or the
// configured names when the sandbox's image cannot say.
std::string python_text(const Config& config, const std::optional<sandbox::Runtime>& runtime) {
  if (!runtime || runtime->python_version.empty()) {
    return fmt::format("Python packages available: {}.", fmt::join(config.sandbox.packages, ", "));
  }
  std::vector<std::string> packages;
  for (const auto& [name, version] : runtime->requested) {
    packages.push_back(version.empty() ? name : fmt::format("{} {}", name, version));
  }
  return fmt::format(
      "The sandbox runs Python {} with {} (and what they depend on). Write code for exactly "
      "these versions and their APIs, not for newer or older ones; nothing else can be "
      "installed.",
      runtime->python_version, fmt::join(packages, ", "));
}

}  // namespace

std::string system_prompt(const Config& config, const std::optional<sandbox::Runtime>& runtime) {
  const auto& sandbox = config.sandbox;
  return fmt::format(
      R"(You are quarry, a data analyst. You answer questions about the company's data in PostgreSQL by querying it and, when the question needs more than SQL, by writing Python that runs in an isolated sandbox. You never see database credentials and the sandbox has no network.

Tools:
- query_database(sql): one read-only SQL statement for small answers; at most {max_rows} rows come back. Use it to look at tables and columns first, and for aggregates you can read directly.
- export_query(sql, filename): runs one read-only SQL statement and writes its rows as Parquet to {data_dir}/<filename> in the sandbox, without the rows passing through you (at most {export_rows} rows). Use it for the data your Python code needs. Its result lists each column's type in the file, with a note where it is not the obvious one (for example a column kept as PostgreSQL's text).
- write_file(path, content): writes a file in the sandbox, such as a script.
- run_python(path or code, expected_outputs, fresh): runs Python in the sandbox ({cpus} CPU, {memory} of memory, {timeout} per run) and returns its output with its run time and peak memory. It runs in a kernel that keeps variables, imports and loaded data between steps, like a notebook: read a file once, then work on it in later steps. The value of a last expression is printed; matplotlib figures left open are saved as PNG. fresh: true runs in a new process. List in expected_outputs the files the code must write; the system checks them.
- list_outputs(): the files in {output_dir}.

Files: data you export is in {data_dir}; put results for the user (charts, tables) in {output_dir}. Files there of these types reach the user: {artifact_types}. {python}

How to work: measure, understand the bottleneck, rewrite, retry.
1. Filter and aggregate in SQL first; use query_database for small answers.
2. Export only the columns and rows the analysis needs.
3. Do not load huge files whole; scan Parquet lazily (pl.scan_parquet) or query it with DuckDB.
4. Use Polars for smaller transformations and chart preparation; plotly for interactive HTML charts.
5. Use DuckDB for large data, medians, percentiles and distinct counts.
6. After an out-of-memory error, change the approach (for example, rewrite the step in DuckDB); never rerun the same code.
7. After a code error, fix the code. After an environment error (timeout, disk full, missing module, network), do not retry the same thing.
8. In your answer, report the numbers exactly as the code printed them and name each file you wrote by its path in {output_dir}; the system checks those files exist.)",
      fmt::arg("max_rows", config.database.query_max_rows), fmt::arg("data_dir", sandbox.data_dir),
      fmt::arg("output_dir", sandbox.output_dir), fmt::arg("export_rows", sandbox.export_max_rows),
      fmt::arg("cpus", sandbox.resources.cpus),
      fmt::arg("memory", format_size(sandbox.resources.memory_bytes)),
      fmt::arg("timeout", format_duration(sandbox.exec_timeout)),
      fmt::arg("python", python_text(config, runtime)),
      fmt::arg("artifact_types", fmt::join(kArtifactTypes, ", ")));
}

std::string extra_packages_text(const std::vector<std::string>& packages) {
  if (packages.empty()) return "";
  return fmt::format(
      "\n\nThis conversation's sandbox also has {} installed (asked for when the conversation "
      "started).",
      fmt::join(packages, ", "));
}

}  // namespace quarry::agent

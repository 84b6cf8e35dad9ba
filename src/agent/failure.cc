#include "agent/failure.h"

#include <fmt/format.h>

#include <array>

namespace quarry::agent {
namespace {

bool contains_any(std::string_view text, std::initializer_list<std::string_view> needles) {
  for (auto needle : needles) {
    if (text.find(needle) != std::string_view::npos) return true;
  }
  return false;
}

Failure environment(std::string cause, std::string advice) {
  return {FailureKind::kEnvironment, std::move(cause), std::move(advice)};
}

}  // namespace

Failure classify(const sandbox::ExecResult& result, const std::vector<std::string>& packages) {
  if (result.oom) {
    return environment(
        "out of memory",
        "Running the same code again will fail the same way. Change the approach: filter and "
        "aggregate in SQL before exporting, export only the columns you need, scan Parquet "
        "lazily (pl.scan_parquet) instead of reading it whole, and use DuckDB for large data, "
        "medians, percentiles and distinct counts.");
  }
  if (result.timed_out) {
    return environment("timeout",
                       "Do not run it again as it is: make it do less (aggregate in SQL first, "
                       "work on the columns and rows you need) or make it faster.");
  }
  if (result.exit_code == 0) return {};
  const std::string& err = result.stderr_text;
  if (contains_any(err, {"No space left on device", "Disk quota exceeded"})) {
    return environment("disk full",
                       "The sandbox's disk is full: delete files you no longer need, or write "
                       "smaller outputs (Parquet instead of CSV, fewer rows).");
  }
  if (contains_any(err, {"ModuleNotFoundError", "No module named"})) {
    return environment(
        "missing module",
        fmt::format("The sandbox cannot install packages (it has no network). Use what it has: "
                    "{}, and the Python standard library.",
                    fmt::join(packages, ", ")));
  }
  if (contains_any(err, {"Temporary failure in name resolution", "Network is unreachable",
                         "Name or service not known", "urlopen error",
                         "Failed to establish a new connection", "No route to host"})) {
    return environment("network",
                       "The sandbox has no network. Get data into it with export_query; results "
                       "go to the output directory.");
  }
  if (result.signal && *result.signal != 6 && *result.signal != 11) {
    return environment(fmt::format("killed by signal {}", *result.signal),
                       "The process was killed from outside; check its resource use before "
                       "running it again.");
  }
  return {FailureKind::kCode, "", "Read the error above, fix the code, and run it again."};
}

std::string_view to_string(FailureKind kind) {
  switch (kind) {
    case FailureKind::kNone:
      return "";
    case FailureKind::kCode:
      return "code";
    case FailureKind::kEnvironment:
      return "environment";
  }
  return "";
}

std::string describe(const Failure& failure) {
  switch (failure.kind) {
    case FailureKind::kNone:
      return "";
    case FailureKind::kCode:
      return fmt::format("Code error: {}", failure.advice);
    case FailureKind::kEnvironment:
      return fmt::format("Environment error ({}): {}", failure.cause, failure.advice);
  }
  return "";
}

}  // namespace quarry::agent

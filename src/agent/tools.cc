#include "agent/tools.h"

#include <sstream>

#include "common/file_util.h"
#include "common/json.h"
#include "common/units.h"
#include "conversation/context_filter.h"
#include "data/query.h"
#include "data/sandbox_export.h"
#include "sandbox/metering.h"

namespace quarry::agent {
namespace {

constexpr uint64_t kMaxFileContent = 1 << 20;  // write_file
constexpr size_t kOutputShownChars = 6000;     // of stdout and of stderr, per run

nlohmann::json string_property(std::string_view description) {
  return {{"type", "string"}, {"description", description}};
}

std::vector<ToolSchema> make_definitions(const Config& config) {
  const auto& sandbox = config.sandbox;
  return {
      {"query_database",
       fmt::format("Run one read-only SQL statement on PostgreSQL and read the result (at most "
                   "{} rows). For small answers and for looking at tables and columns.",
                   config.database.query_max_rows),
       {{"type", "object"},
        {"properties", {{"sql", string_property("one SELECT statement")}}},
        {"required", {"sql"}},
        {"additionalProperties", false}}},
      {"export_query",
       fmt::format("Run one read-only SQL statement and write its rows as Parquet to {}/FILENAME "
                   "in the sandbox (at most {} rows), for Python to read. The rows do not pass "
                   "through you.",
                   sandbox.data_dir, sandbox.export_max_rows),
       {{"type", "object"},
        {"properties",
         {{"sql", string_property("one SELECT statement; select only the columns you need")},
          {"filename",
           string_property("a plain file name ending in .parquet, e.g. views.parquet")}}},
        {"required", {"sql", "filename"}},
        {"additionalProperties", false}}},
      {"write_file",
       "Write a text file in the sandbox (for example a Python script). A relative path is taken "
       "from the sandbox user's home directory.",
       {{"type", "object"},
        {"properties",
         {{"path", string_property("where to write it, e.g. analysis.py")},
          {"content", string_property("the whole content of the file")}}},
        {"required", {"path", "content"}},
        {"additionalProperties", false}}},
      {"run_python",
       fmt::format("Run Python in the sandbox: a script written earlier (path) or code given "
                   "here (code). It runs in the conversation's Python kernel, which keeps "
                   "variables, imports and loaded data from one step to the next (load data "
                   "once, then reuse it); the value of a last expression is printed, and "
                   "matplotlib figures left open are saved as PNG in {}. Returns its output, "
                   "run time, CPU time and peak memory. Limits: {} of memory, {} per run, no "
                   "network.",
                   sandbox.output_dir, format_size(sandbox.resources.memory_bytes),
                   format_duration(sandbox.exec_timeout)),
       {{"type", "object"},
        {"properties",
         {{"path", string_property("a script in the sandbox, e.g. analysis.py")},
          {"code", string_property("Python source to run")},
          {"fresh",
           {{"type", "boolean"},
            {"description",
             "true: run in a new Python process; what earlier steps defined is dropped"}}},
          {"expected_outputs",
           {{"type", "array"},
            {"items", {{"type", "string"}}},
            {"description",
             fmt::format("files the code must write in {} (e.g. chart.html); the system checks "
                         "that each exists and is not empty",
                         sandbox.output_dir)}}}}},
        {"additionalProperties", false}}},
      {"list_outputs",
       fmt::format("List the files in the output directory {} with their sizes.",
                   sandbox.output_dir),
       {{"type", "object"},
        {"properties", nlohmann::json::object()},
        {"additionalProperties", false}}},
  };
}

// A short view of something the model sent, for an error message.
std::string cut_middle_text(std::string_view text) {
  return conversation::cut_middle(text, 300);
}

ToolResult succeeded(std::string content) {
  ToolResult result;
  result.content = std::move(content);
  return result;
}

ToolResult failed(std::string message) {
  ToolResult result;
  result.ok = false;
  result.content = std::move(message);
  return result;
}

// A data tool stopped by the turn's cancel fd: the turn ends here, as after a stopped command.
ToolResult stopped(const Error& error) {
  ToolResult result = failed(error.message);
  result.cancelled = true;
  return result;
}

// A file not written into, or read from, the sandbox: stopped by the turn's cancel
// (kCancelled), failed otherwise.
ToolResult file_failure(const Error& error, std::string_view tool) {
  Error said = error.with_context(tool);
  return error.code == ErrorCode::kCancelled ? stopped(said) : failed(said.message);
}

}  // namespace

Result<void> check_arguments(const ToolSchema& definition, const nlohmann::json& arguments) {
  if (!arguments.is_object()) {
    return make_error(ErrorCode::kInvalidArgument,
                      "{}: the arguments must be a JSON object, not {}", definition.name,
                      arguments.type_name());
  }
  const auto& properties = definition.parameters["properties"];
  for (const auto& [key, value] : arguments.items()) {
    if (!properties.contains(key)) {
      std::vector<std::string> known;
      for (const auto& [name, _] : properties.items())
        known.push_back(name);
      return make_error(ErrorCode::kInvalidArgument,
                        "{}: unknown argument '{}' (its arguments are: {})", definition.name, key,
                        known.empty() ? "none" : fmt::format("{}", fmt::join(known, ", ")));
    }
    const std::string expected = properties[key]["type"];
    if (value.type_name() != expected) {
      return make_error(ErrorCode::kInvalidArgument, "{}: '{}' must be a {}, not {}",
                        definition.name, key, expected, value.type_name());
    }
    if (expected == "array") {
      for (const auto& item : value) {
        if (!item.is_string()) {
          return make_error(ErrorCode::kInvalidArgument, "{}: '{}' must be a list of strings",
                            definition.name, key);
        }
      }
    }
  }
  if (definition.parameters.contains("required")) {
    for (const auto& key : definition.parameters["required"]) {
      if (!arguments.contains(key.get<std::string>())) {
        return make_error(ErrorCode::kInvalidArgument, "{}: '{}' is required", definition.name,
                          key.get<std::string>());
      }
    }
  }
  return {};
}

Toolbox::Toolbox(ToolEnvironment environment)
    : environment_(std::move(environment)),
      definitions_(make_definitions(environment_.config)),
      collector_(environment_.config.sandbox.output_dir, environment_.state_dir / "artifacts",
                 environment_.config.sandbox.artifacts),
      kernel_(environment_.config) {}

ToolResult Toolbox::call(const ToolCall& call, conversation::Turn& turn, const ToolIo& io) {
  const auto started = std::chrono::steady_clock::now();
  turn.set_step(call.id, call.name);
  ToolResult result = dispatch(call, turn, io);
  // A new sandbox is told with the result of whichever tool used it first (run_python's says
  // it among its notes, and has taken it).
  if (auto notice = turn.sandbox().take_notice()) {
    result.content = fmt::format("{}\n{}", *notice, result.content);
  }
  turn.set_step("", "");
  result.elapsed_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count();
  return result;
}

ToolResult Toolbox::dispatch(const ToolCall& call, conversation::Turn& turn, const ToolIo& io) {
  const std::string_view name = call.name;
  const std::string_view arguments_text = call.arguments;
  auto definition = std::find_if(definitions_.begin(), definitions_.end(),
                                 [&](const ToolSchema& d) { return d.name == name; });
  if (definition == definitions_.end()) {
    std::vector<std::string> names;
    for (const auto& d : definitions_)
      names.push_back(d.name);
    return failed(
        fmt::format("There is no tool '{}'. The tools are: {}.", name, fmt::join(names, ", ")));
  }
  auto arguments = parse_json_or_discarded(arguments_text.empty() ? "{}" : arguments_text);
  if (arguments.is_discarded()) {
    return failed(fmt::format("{}: the arguments are not valid JSON: {}", name,
                              cut_middle_text(arguments_text)));
  }
  if (auto valid = check_arguments(*definition, arguments); !valid) {
    return failed(valid.error().message);
  }
  if (name == "query_database") return query_database(arguments, io);
  if (name == "export_query") return export_query(arguments, turn, io);
  if (name == "write_file") return write_file(arguments, turn);
  if (name == "run_python") return run_python(arguments, turn, io);
  return list_outputs(turn);
}

ToolResult Toolbox::query_database(const nlohmann::json& arguments, const ToolIo& io) {
  if (!environment_.database) {
    return failed(fmt::format("query_database: {}", environment_.database.error().message));
  }
  const auto& database = environment_.config.database;
  data::QueryOptions options{database.query_max_rows, database.statement_timeout};
  options.cancel_fd = io.cancel_fd;
  auto result = data::query_database(environment_.database->reader,
                                     arguments["sql"].get<std::string>(), options);
  if (!result && result.error().code == ErrorCode::kCancelled) return stopped(result.error());
  if (!result) return failed(result.error().message + "\nFix the SQL and try again.");
  ToolResult tool;
  tool.content = data::to_text(*result);
  return tool;
}

ToolResult Toolbox::export_query(const nlohmann::json& arguments, conversation::Turn& turn,
                                 const ToolIo& io) {
  if (!environment_.database) {
    return failed(fmt::format("export_query: {}", environment_.database.error().message));
  }
  const auto& config = environment_.config;
  data::SandboxExportRequest request;
  request.data_dir = config.sandbox.data_dir;
  request.conninfo = environment_.database->reader;
  request.sql = arguments["sql"].get<std::string>();
  request.filename = arguments["filename"].get<std::string>();
  request.options = data::export_options(config);
  request.options.cancel_fd = io.cancel_fd;
  request.temp_dir = environment_.state_dir / "tmp";
  auto& sandbox = turn.sandbox();
  auto exported =
      data::export_to_sandbox(request, [&](std::string_view path, std::istream& content) {
        return sandbox.write_file(path, content);
      });
  if (!exported && exported.error().code == ErrorCode::kCancelled) {
    return stopped(exported.error());
  }
  if (!exported) return failed(exported.error().message);
  const auto& summary = exported->summary;
  std::string content = fmt::format("Wrote {} rows to {} ({}, {}).", summary.rows, exported->path,
                                    format_size(summary.bytes), format_elapsed(summary.elapsed_ms));
  auto json = data::to_json(*exported);
  if (json.contains("message") && json["message"].is_string()) {
    content += " " + json["message"].get<std::string>();
  }
  content += "\nColumns:";
  for (const auto& column : json["columns"]) {
    content += fmt::format("\n  {} ({} -> {})", column.value("name", ""), column.value("type", ""),
                           column.value("parquet_type", ""));
    if (column.contains("note")) content += fmt::format(": {}", column["note"].get<std::string>());
  }
  ToolResult tool;
  tool.content = std::move(content);
  return tool;
}

ToolResult Toolbox::write_file(const nlohmann::json& arguments, conversation::Turn& turn) {
  const std::string path = arguments["path"];
  const std::string content = arguments["content"];
  if (content.size() > kMaxFileContent) {
    return failed(
        fmt::format("write_file: the content is {} bytes; the limit is {}. Write "
                    "smaller files, or have code produce large ones.",
                    content.size(), kMaxFileContent));
  }
  if (auto written = turn.sandbox().write_file(path, std::string_view(content)); !written) {
    return file_failure(written.error(), "write_file");
  }
  ToolResult tool;
  tool.content = fmt::format("Wrote {} bytes to {}.", content.size(), path);
  return tool;
}

ToolResult Toolbox::run_python(const nlohmann::json& arguments, conversation::Turn& turn,
                               const ToolIo& io) {
  const bool has_path = arguments.contains("path");
  const bool has_code = arguments.contains("code");
  if (has_path == has_code) {
    return failed("run_python: give exactly one of 'path' (a script in the sandbox) or 'code'.");
  }
  auto& sandbox = turn.sandbox();
  std::string script;
  std::string code;
  const std::string step_name = fmt::format("turn{}_step{}", turn.number(), ++scripts_);
  if (has_code) {
    // Kept as a file, so tracebacks name lines the model can find and it can run it again.
    // Relative paths are taken from the sandbox user's home, where commands start.
    script = fmt::format(".steps/{}.py", step_name);
    code = arguments["code"].get<std::string>();
    if (auto written = sandbox.write_file(script, std::string_view(code)); !written) {
      return file_failure(written.error(), "run_python");
    }
  } else {
    script = arguments["path"];
    std::ostringstream text;
    if (auto read = sandbox.read_file(script, text, kMaxFileContent); !read) {
      return file_failure(read.error(), "run_python");
    }
    code = text.str();
  }
  // An output directory too big to list does not stop the code (it may be what clears it);
  // nothing is collected after it then, and the result says why.
  auto before = collector_.snapshot(sandbox);
  if (!before && before.error().code != ErrorCode::kResourceExhausted) {
    return failed(fmt::format("run_python: {}", before.error().message));
  }

  // In the conversation's kernel; as a command of its own where the provider keeps no process.
  const bool fresh = arguments.value("fresh", false);
  std::vector<std::string> notes;
  std::optional<sandbox::ExecResult> ran;
  bool cancelled = false;
  auto stepped = kernel_.run(sandbox, {code, script, fresh, step_name}, io);
  if (stepped) {
    ran = std::move(stepped->exec);
    notes = std::move(stepped->notes);
    cancelled = stepped->cancelled;
  } else if (stepped.error().code == ErrorCode::kFailedPrecondition) {
    sandbox::ExecRequest request;
    request.argv = {"python", script};
    request.timeout = environment_.config.sandbox.exec_timeout;
    request.output_limit = environment_.config.sandbox.output_limit_bytes;
    request.cancel_fd = io.cancel_fd;
    request.on_output = io.on_output;
    auto execution = sandbox.execute(request);
    if (execution) {
      ran = std::move(execution->result);
      if (execution->notice) notes.push_back(*execution->notice);
    } else {
      stepped = std::unexpected(execution.error());
    }
  }
  if (!ran) {
    ToolResult tool = failed(fmt::format("run_python: {}", stepped.error().message));
    tool.failure = {FailureKind::kEnvironment, "sandbox", stepped.error().message};
    tool.cancelled = stepped.error().code == ErrorCode::kCancelled;
    return tool;
  }
  const auto& result = *ran;
  ToolResult tool;
  tool.exec = result;
  tool.cancelled = cancelled;
  tool.failure = classify(result, environment_.config.sandbox.packages);
  tool.ok = tool.failure.kind == FailureKind::kNone && !cancelled;

  std::string content;
  for (const auto& note : notes)
    content += note + "\n";
  content += sandbox::metering_line(result);
  if (result.message) content += "\n" + *result.message;
  if (auto network = sandbox::network_message(result)) content += "\n" + *network;
  if (!result.stdout_text.empty()) {
    content +=
        "\n--- stdout ---\n" + conversation::cut_middle(result.stdout_text, kOutputShownChars);
  }
  if (!result.stderr_text.empty()) {
    content +=
        "\n--- stderr ---\n" + conversation::cut_middle(result.stderr_text, kOutputShownChars);
  }
  if (result.truncated) {
    content += fmt::format("\n(The output was longer than {} per stream and was cut; print less.)",
                           format_size(environment_.config.sandbox.output_limit_bytes));
  }

  auto collected = before ? collector_.collect(turn, *before, environment_.history)
                          : Result<Collected>(std::unexpected(before.error()));
  if (collected) {
    for (const auto& artifact : collected->artifacts) {
      content += fmt::format("\nSaved for the user: {}/{} ({}, {})",
                             environment_.config.sandbox.output_dir, artifact.name, artifact.type,
                             format_size(artifact.size_bytes));
    }
    for (const auto& note : collected->notes)
      content += "\n" + note;
    tool.artifacts = std::move(collected->artifacts);

    // The system, not the model's word, decides whether the promised files exist.
    if (arguments.contains("expected_outputs")) {
      for (const auto& expected : arguments["expected_outputs"]) {
        std::string path = expected.get<std::string>();
        if (!path.starts_with("/")) path = environment_.config.sandbox.output_dir + "/" + path;
        auto found = collected->after.find(path);
        std::string problem;
        if (found == collected->after.end()) {
          problem = "was not written";
        } else if (found->second.size == 0) {
          problem = "is empty";
        }
        if (!problem.empty()) {
          content += fmt::format("\nVerification failed: {} {}.", path, problem);
          tool.ok = false;
          if (tool.failure.kind == FailureKind::kNone) {
            tool.failure = {FailureKind::kCode, "",
                            "The code did not write what it should; fix it and run it again."};
          }
        }
      }
    }
  } else {
    content +=
        fmt::format("\n(The output directory could not be read: {})", collected.error().message);
  }
  if (!tool.ok) content += "\n" + describe(tool.failure);
  tool.content = std::move(content);
  return tool;
}

ToolResult Toolbox::list_outputs(conversation::Turn& turn) {
  auto files = turn.sandbox().list_files(environment_.config.sandbox.output_dir);
  if (!files) return failed(fmt::format("list_outputs: {}", files.error().message));
  if (files->empty()) {
    return succeeded(fmt::format("{} is empty.", environment_.config.sandbox.output_dir));
  }
  std::string content;
  for (const auto& file : *files) {
    content += file.is_directory ? fmt::format("{}/\n", file.path)
                                 : fmt::format("{} ({})\n", file.path, format_size(file.size));
  }
  return succeeded(std::move(content));
}

}  // namespace quarry::agent

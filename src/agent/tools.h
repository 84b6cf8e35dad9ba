// The tools the model gets: query_database, export_query, write_file, run_python and
// list_outputs, with their JSON schemas. Every call returns a ToolResult the model can read;
// bad arguments and failures are results too, never a crash.
#pragma once

#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "agent/artifacts.h"
#include "agent/failure.h"
#include "agent/kernel.h"
#include "agent/model_client.h"
#include "config/config.h"
#include "conversation/conversation_manager.h"
#include "data/database.h"

namespace quarry::agent {

struct ToolEnvironment {
  const Config& config;
  // The database to query, or why there is none (the data tools then say so to the model).
  Result<data::DatabaseTarget> database;
  conversation::HistoryStore& history;
  std::filesystem::path state_dir;  // export temp files, artifacts
};

struct ToolResult {
  std::string content;                      // what the model reads
  bool ok = true;                           // false: the call failed and the model should act on it
  double elapsed_ms = 0;                    // the whole call, as the server measured it
  Failure failure;                          // run_python: what kind of failure
  std::optional<sandbox::ExecResult> exec;  // run_python's metering (the full record is in history)
  std::vector<conversation::Artifact> artifacts;  // collected by this call
  bool cancelled = false;                         // stopped through cancel_fd: the turn ends here
};

// What a call may do besides returning its result.
struct ToolIo {
  int cancel_fd = -1;  // readable: stop a running command (the result is `cancelled`)
  // A running command's output as it arrives (all of it; the result keeps it up to a limit).
  std::function<void(sandbox::OutputStream, std::string_view)> on_output;
};

class Toolbox {
 public:
  explicit Toolbox(ToolEnvironment environment);

  const std::vector<ToolSchema>& definitions() const { return definitions_; }

  // Runs `call` (its arguments are the JSON text the model sent) as the turn's current step:
  // what it executes and saves is recorded under the call's id.
  ToolResult call(const ToolCall& call, conversation::Turn& turn, const ToolIo& io = {});

 private:
  ToolResult dispatch(const ToolCall& call, conversation::Turn& turn, const ToolIo& io);
  ToolResult query_database(const nlohmann::json& arguments, const ToolIo& io);
  ToolResult export_query(const nlohmann::json& arguments, conversation::Turn& turn,
                          const ToolIo& io);
  ToolResult write_file(const nlohmann::json& arguments, conversation::Turn& turn);
  ToolResult run_python(const nlohmann::json& arguments, conversation::Turn& turn,
                        const ToolIo& io);
  ToolResult list_outputs(conversation::Turn& turn);

  ToolEnvironment environment_;
  std::vector<ToolSchema> definitions_;
  ArtifactCollector collector_;
  PythonKernel kernel_;
  int scripts_ = 0;  // inline code written to files so far
};

// Checks `arguments` against a definition's schema (object, property types, required, no
// unknown properties); the message says what is wrong in terms the model can fix.
Result<void> check_arguments(const ToolSchema& definition, const nlohmann::json& arguments);

}  // namespace quarry::agent

// HistoryStore: everything a conversation leaves behind, kept by the application (not by any
// sandbox): messages, tool calls and results, sandbox events, exec metrics, artifacts, and the
// conversation's current sandbox reference. SqliteHistoryStore implements it; a PostgreSQL
// store can implement it later for several servers.
#pragma once

#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/error.h"
#include "sandbox/provider.h"

namespace quarry::conversation {

struct Conversation {
  std::string id;
  std::string title;
  int turns = 0;  // turns begun so far
  Clock::time_point created_at;
  Clock::time_point updated_at;
};

enum class Role { kUser, kAssistant, kTool };
std::string_view to_string(Role role);

struct Message {
  int64_t id = 0;  // set by the store
  int turn = 0;
  Role role = Role::kUser;
  std::string content;
  nlohmann::json tool_calls;  // assistant: [{id, name, arguments}], else null
  std::string tool_call_id;   // tool: the call this result answers
  Clock::time_point created_at;
};

// Kinds of event: sandbox_ready, sandbox_deleted (reason: idle, shutdown, evicted, dead,
// orphan), sandbox_replaced, and state (one per lifecycle transition, details {from, to}).
struct Event {
  int64_t id = 0;
  int turn = 0;
  std::string kind;
  std::string sandbox_id;
  std::string reason;
  nlohmann::json details;
  Clock::time_point created_at;
};

struct ExecRecord {
  int64_t id = 0;
  int turn = 0;
  std::string sandbox_id;
  std::string command;
  sandbox::ExecResult result;  // the metering; stdout and stderr are kept up to a limit
  Clock::time_point started_at;
};

struct Artifact {
  int64_t id = 0;
  int turn = 0;
  std::string name;  // as the sandbox wrote it, e.g. outputs/chart.html
  std::string type;  // png, svg, html, csv, parquet, json
  uint64_t size_bytes = 0;
  std::string location;  // where the store keeps its bytes
  Clock::time_point created_at;
};

// Which sandbox a conversation holds and in what lifecycle state; survives restarts so a later
// process can reuse the sandbox or know it is gone.
struct SandboxReference {
  std::string state = "new";  // see lifecycle.h
  std::string sandbox_id;     // empty when there is none
  std::optional<Clock::time_point> last_used_at;
  std::vector<std::string> files;  // paths written into this sandbox that a replacement lacks
};

// Held while a turn runs; released when destroyed, or when the process holding it dies.
class TurnLock {
 public:
  virtual ~TurnLock() = default;
};

class HistoryStore {
 public:
  virtual ~HistoryStore() = default;

  // Takes a conversation's turn lock without waiting: kAborted if another turn (in this
  // process or another) holds it.
  virtual Result<std::unique_ptr<TurnLock>> try_lock_turn(std::string_view conversation_id) = 0;

  virtual Result<Conversation> create_conversation(std::string_view title) = 0;
  virtual Result<Conversation> conversation(std::string_view id) = 0;
  virtual Result<std::vector<Conversation>> conversations() = 0;
  // Starts the next turn of a conversation and returns its number (1, 2, ...).
  virtual Result<int> begin_turn(std::string_view conversation_id) = 0;

  virtual Result<Message> append_message(std::string_view conversation_id, Message message) = 0;
  virtual Result<Event> record_event(std::string_view conversation_id, Event event) = 0;
  virtual Result<ExecRecord> record_exec(std::string_view conversation_id, ExecRecord exec) = 0;
  virtual Result<Artifact> record_artifact(std::string_view conversation_id, Artifact artifact) = 0;

  // Everything of a conversation, in the order it happened.
  virtual Result<std::vector<Message>> messages(std::string_view conversation_id) = 0;
  virtual Result<std::vector<Event>> events(std::string_view conversation_id) = 0;
  virtual Result<std::vector<ExecRecord>> execs(std::string_view conversation_id) = 0;
  virtual Result<std::vector<Artifact>> artifacts(std::string_view conversation_id) = 0;

  virtual Result<SandboxReference> sandbox_reference(std::string_view conversation_id) = 0;
  virtual Result<void> set_sandbox_reference(std::string_view conversation_id,
                                             const SandboxReference& reference) = 0;
  // Every conversation's reference, by conversation id (for the idle reaper and shutdown).
  virtual Result<std::vector<std::pair<std::string, SandboxReference>>> sandbox_references() = 0;
};

}  // namespace quarry::conversation

// HistoryStore: everything a conversation leaves behind, kept by the application (not by any
// sandbox): messages, tool calls and results, sandbox events, exec metrics, artifacts, and the
// conversation's current sandbox reference. SqliteHistoryStore implements it for one server,
// PostgresHistoryStore for several sharing one database (open_history_store picks one).
#pragma once

#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "capacity/shared_places.h"
#include "common/clock.h"
#include "common/error.h"
#include "conversation/server_registry.h"
#include "sandbox/provider.h"

namespace quarry::conversation {

// The user conversations belong to when no other is named: the one user of a server without
// tokens, and of the command line.
inline constexpr std::string_view kLocalUser = "local";

struct Conversation {
  std::string id;
  std::string title;
  int turns = 0;  // turns begun so far
  Clock::time_point created_at;
  Clock::time_point updated_at;
  std::string owner = std::string(kLocalUser);
  // The network its sandboxes get when it asked for less than the server's (never more; the
  // API checks); none: the server's sandbox.network.
  std::optional<NetworkPolicy> network;
  // Extra Python packages its sandboxes have (SandboxSpec::packages), asked for at its start.
  std::vector<std::string> packages;
};

// Which conversations to list: newest activity first, optionally one owner's, a page at a time
// (`after` is the last conversation of the previous page).
struct ConversationQuery {
  std::optional<std::string> owner;
  size_t limit = 0;                                                // 0: all
  std::optional<std::pair<Clock::time_point, std::string>> after;  // (updated_at, id)
};

// A turn is a question for the agent or a cell the user runs without the model.
enum class TurnKind { kAsk, kCell };
// running -> completed | failed | cancelled; interrupted when the process running it died.
enum class TurnStatus { kRunning, kCompleted, kFailed, kCancelled, kInterrupted };
std::string_view to_string(TurnKind kind);
std::string_view to_string(TurnStatus status);

struct TurnRecord {
  int number = 0;
  TurnKind kind = TurnKind::kAsk;
  TurnStatus status = TurnStatus::kRunning;
  std::string error;  // why it failed, was cancelled or interrupted
  Clock::time_point started_at;
  std::optional<Clock::time_point> finished_at;
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
  // For people, not the model: a tool result's outcome ({tool, ok, failure, elapsed_ms}), or
  // {"cell": kind} on the user message that starts a cell. Null when there is nothing to add.
  nlohmann::json details;
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
  std::string tool_call_id;  // the tool step that ran it ("" outside one)
  std::string tool;
  std::string sandbox_id;
  std::string command;
  sandbox::ExecResult result;  // the metering; stdout and stderr are kept up to a limit
  Clock::time_point started_at;
};

struct Artifact {
  int64_t id = 0;
  int turn = 0;
  std::string tool_call_id;  // the tool step that wrote it
  std::string name;          // as the sandbox wrote it, e.g. outputs/chart.html
  std::string type;          // png, svg, html, csv, parquet, json
  uint64_t size_bytes = 0;
  // Where the server that collected it stored its file (an absolute path on that server's
  // machine); every server keeps its copy at conversation::artifact_path under its own state.
  std::string location;
  Clock::time_point created_at;
};

// Which executions to read, newest first, a page at a time (ids below `before_id`).
struct ExecQuery {
  std::optional<std::string> owner;
  std::optional<std::string> conversation_id;
  size_t limit = 0;  // 0: all
  std::optional<int64_t> before_id;
};

// Totals over the executions an ExecQuery selects (all of them, not one page).
struct ExecTotals {
  int64_t steps = 0;
  double run_ms = 0;
  double cpu_ms = 0;
  double overhead_ms = 0;
  uint64_t max_peak_memory_bytes = 0;
  int64_t ooms = 0;
  int64_t timeouts = 0;
  int64_t failures = 0;  // exit code not 0
};

// One event of a turn as it was streamed to its watchers, kept so a dropped stream can resume
// (and a finished turn be replayed) from any point. `data` is the event's JSON text.
struct StreamEvent {
  int turn = 0;
  int64_t seq = 0;  // 1, 2, ... within the turn
  std::string type;
  std::string data;
};

// Which sandbox a conversation holds and in what lifecycle state; survives restarts so a later
// process can reuse the sandbox or know it is gone.
struct SandboxReference {
  std::string state = "new";  // see lifecycle.h
  std::string sandbox_id;     // empty when there is none
  std::optional<Clock::time_point> last_used_at;
  std::vector<std::string> files;  // paths written into this sandbox that a replacement lacks
  // What its Python kernel holds ("df: polars.DataFrame 6351 x 4"), which a replacement, or a
  // kernel started again, lacks.
  std::vector<std::string> kernel_names;
  // The provider's id of the kernel's process (sandbox::Process::id), so that a quarry process
  // that did not start it knows it is not its own, and stops it before starting another.
  std::string kernel;
};

// Why a turn stopped when its lock went (TurnLock::watch), as its history and its user see it.
inline constexpr std::string_view kTurnLockLost =
    "cancelled: quarry lost its session with the history database (conversations.url), and with "
    "it the conversation's turn lock; send the message again";

// Held while a turn runs; released when destroyed, or when the process holding it dies.
class TurnLock {
 public:
  virtual ~TurnLock() = default;
  // Calls `lost`, once and on a thread of its own, if the lock goes while held: the database
  // ended the session holding it (restarted, terminated it, or its network died). Another turn
  // can then take it, so the turn holding it must stop. Not called after the lock is destroyed;
  // a lock that cannot go while its process lives (SQLite's) never calls it.
  virtual void watch(std::function<void()> lost) { (void)lost; }
};

class HistoryStore {
 public:
  virtual ~HistoryStore() = default;

  // Takes a conversation's turn lock without waiting: kAborted if another turn (in this
  // process or another) holds it.
  virtual Result<std::unique_ptr<TurnLock>> try_lock_turn(std::string_view conversation_id) = 0;

  virtual Result<Conversation> create_conversation(
      std::string_view title, std::string_view owner = kLocalUser,
      const std::optional<NetworkPolicy>& network = std::nullopt,
      const std::vector<std::string>& packages = {}) = 0;
  virtual Result<Conversation> conversation(std::string_view id) = 0;
  virtual Result<std::vector<Conversation>> conversations(const ConversationQuery& query = {}) = 0;
  // Sets the title if it is still empty (a conversation is named by its first question).
  virtual Result<void> name_conversation(std::string_view id, std::string_view title) = 0;
  // Removes the conversation and everything recorded of it, in one transaction, and its turn
  // lock. The caller holds that lock, and removes the sandbox and the artifacts' files.
  virtual Result<void> delete_conversation(std::string_view id) = 0;

  // Starts the next turn of a conversation, recorded as running, and returns its number
  // (1, 2, ...).
  virtual Result<int> begin_turn(std::string_view conversation_id, TurnKind kind) = 0;
  virtual Result<void> finish_turn(std::string_view conversation_id, int turn, TurnStatus status,
                                   std::string_view error) = 0;
  virtual Result<std::vector<TurnRecord>> turns(std::string_view conversation_id) = 0;
  // Turns still recorded as running, in any conversation: (conversation id, turn).
  virtual Result<std::vector<std::pair<std::string, TurnRecord>>> unfinished_turns() = 0;

  virtual Result<Message> append_message(std::string_view conversation_id, Message message) = 0;
  virtual Result<Event> record_event(std::string_view conversation_id, Event event) = 0;
  virtual Result<ExecRecord> record_exec(std::string_view conversation_id, ExecRecord exec) = 0;
  // An artifact's file must be whole at its `location` when it is recorded: a store several
  // servers share (PostgreSQL) keeps its bytes with the record, in the same transaction.
  virtual Result<Artifact> record_artifact(std::string_view conversation_id, Artifact artifact) = 0;

  // Everything of a conversation, in the order it happened.
  virtual Result<std::vector<Message>> messages(std::string_view conversation_id) = 0;
  virtual Result<std::vector<Event>> events(std::string_view conversation_id) = 0;
  virtual Result<std::vector<ExecRecord>> execs(std::string_view conversation_id) = 0;
  virtual Result<std::vector<Artifact>> artifacts(std::string_view conversation_id) = 0;
  // One artifact by its id, with the conversation it belongs to.
  virtual Result<std::pair<std::string, Artifact>> artifact(int64_t id) = 0;
  // Writes the bytes the store keeps of artifact `id` to the file `to`, whole (a temporary file
  // beside it renamed over it; mode 0600, missing directories made 0700). False when it keeps
  // none: a store of one server keeps only the record, as its files are on that server.
  virtual Result<bool> restore_artifact(int64_t /*id*/, const std::filesystem::path& /*to*/) {
    return false;
  }

  // Executions across conversations (with the conversation of each), and their totals.
  virtual Result<std::vector<std::pair<std::string, ExecRecord>>> find_execs(
      const ExecQuery& query) = 0;
  virtual Result<ExecTotals> exec_totals(const ExecQuery& query) = 0;

  virtual Result<void> append_stream_event(std::string_view conversation_id,
                                           const StreamEvent& event) = 0;
  // A conversation's stream events after (turn, seq), in order: the rest of that turn and all
  // of later turns.
  virtual Result<std::vector<StreamEvent>> stream_events(std::string_view conversation_id, int turn,
                                                         int64_t after_seq) = 0;

  virtual Result<SandboxReference> sandbox_reference(std::string_view conversation_id) = 0;
  virtual Result<void> set_sandbox_reference(std::string_view conversation_id,
                                             const SandboxReference& reference) = 0;
  // Every conversation's reference, by conversation id (for the idle reaper and shutdown), or
  // only those of one owner's conversations.
  virtual Result<std::vector<std::pair<std::string, SandboxReference>>> sandbox_references(
      const std::optional<std::string>& owner = std::nullopt) = 0;

  // The registry of the servers sharing this history; null for a history of one server.
  virtual ServerRegistry* registry() { return nullptr; }
  // The sandboxes of every server sharing this history, for limits across them; nullptr when
  // only one server can use it.
  virtual capacity::SharedPlaces* places() { return nullptr; }
};

}  // namespace quarry::conversation

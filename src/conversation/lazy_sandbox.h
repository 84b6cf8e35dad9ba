// LazySandbox: what the agent holds during a turn. The first call that needs a sandbox
// creates one; a dead one is replaced; every execute is metered and recorded in the history.
// The agent never learns which sandbox, or which provider, is underneath: when the sandbox was
// replaced it is told, in words, which of its files are gone.
#pragma once

#include <functional>
#include <iosfwd>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "conversation/history_store.h"
#include "sandbox/provider.h"

namespace quarry::conversation {

class ConversationManager;

// Called with each event recorded during a turn (sandbox_ready, sandbox_replaced, ...), so
// whoever runs the turn can show it as it happens.
using EventSink = std::function<void(const Event&)>;

// What a turn knows while it runs.
struct TurnContext {
  std::string conversation_id;
  std::string owner;  // the conversation's user: sandboxes are shared fairly between users
  std::vector<std::string> packages;  // the conversation's extra Python packages
  int number = 0;
  TurnKind kind = TurnKind::kAsk;
  SandboxReference reference;
  std::optional<std::string> notice;  // for the next execute's result
  // The tool step running now: executions and artifacts are recorded under it.
  std::string step_call_id;
  std::string step_tool;
  EventSink on_event;
  int cancel_fd = -1;  // readable once the turn is cancelled: stops a wait for a sandbox
  // Set when no sandbox could be had (the queue timed out, or the wait was cancelled): the turn
  // ends with this error instead of going on without one.
  std::optional<Error> refusal;
  bool finished = false;
};

struct Execution {
  sandbox::ExecResult result;
  // Said once, when this command runs in a different sandbox than earlier ones did.
  std::optional<std::string> notice;
};

class LazySandbox {
 public:
  Result<void> write_file(std::string_view path, std::istream& content);
  Result<void> write_file(std::string_view path, std::string_view content);
  Result<Execution> execute(sandbox::ExecRequest request);
  Result<uint64_t> read_file(std::string_view path, std::ostream& out, uint64_t max_bytes);
  Result<std::vector<sandbox::FileInfo>> list_files(std::string_view directory);

  // The process that stays between steps and turns in this conversation's sandbox (the Python
  // kernel): the one this quarry process started, if it runs there and is still the one the
  // history names (nullptr if not: another quarry process sharing the history may have run a
  // turn since, with its own); one started anew (the sandbox made first if need be, and any
  // other kernel it has stopped); or stopped. It goes with the sandbox.
  sandbox::Process* kernel();
  Result<sandbox::Process*> start_kernel(const sandbox::ExecRequest& request);
  void stop_kernel();
  // What the model should hear once about the sandbox since the last execute: that it is a
  // new one, and what the old one held.
  std::optional<std::string> take_notice() { return std::exchange(turn_.notice, std::nullopt); }
  // Whether the conversation has a sandbox now (this turn's, or an earlier one's still there):
  // what only looks at its files need not start one.
  bool has_sandbox() const;
  // Records a step of such a process as an execution, with its metering.
  Result<void> record_step(std::string_view command, const sandbox::ExecResult& result,
                           std::chrono::system_clock::time_point started);
  // What the sandbox's Python kernel holds, kept in the history beside its files, so that a
  // replacement or a kernel started again can say what is gone.
  const std::vector<std::string>& kernel_names() const { return turn_.reference.kernel_names; }
  Result<void> set_kernel_names(std::vector<std::string> names);

 private:
  friend class Turn;
  LazySandbox(ConversationManager& manager, TurnContext& turn) : manager_(manager), turn_(turn) {}

  // Runs `call(id)` on the turn's sandbox, made or replaced first if need be. If the sandbox
  // turns out to have stopped (kUnavailable), it is marked dead (`why`), so the next call gets
  // a new one.
  template <typename Call>
  auto on_sandbox(std::string_view why, Call&& call);

  ConversationManager& manager_;
  TurnContext& turn_;
};

}  // namespace quarry::conversation

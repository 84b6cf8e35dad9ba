// ConversationManager: which sandbox each conversation holds and in what state. It decides
// when a sandbox is created, checked and deleted; the provider decides how. Conversations
// outlive sandboxes: a deleted or dead sandbox is replaced on the next need, and the history
// records why ("turn 12: sandbox died; turn 13: new sandbox").
//
// All state lives in the HistoryStore, so another process (a restarted server, or the next
// `quarry ask`) carries on from it. One turn at a time per conversation, across processes:
// a second turn is refused with kAborted (see begin_turn).
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "capacity/scheduler.h"
#include "common/clock.h"
#include "config/config.h"
#include "conversation/history_store.h"
#include "conversation/lazy_sandbox.h"
#include "conversation/lifecycle.h"
#include "sandbox/provider.h"

namespace quarry::conversation {

// Labels on every sandbox a manager creates: which quarry instance, which run of it, which
// conversation. A restarted server finds what an earlier run left by them.
inline constexpr std::string_view kInstanceLabel = "quarry.instance";
inline constexpr std::string_view kBootLabel = "quarry.boot";
inline constexpr std::string_view kConversationLabel = "quarry.conversation";

// Why a turn is recorded as interrupted.
inline constexpr std::string_view kInterruptedReason =
    "the process running this turn stopped (quarry was killed, crashed or the machine "
    "restarted)";

struct ManagerOptions {
  std::string instance_id = "local";
  sandbox::SandboxSpec spec;     // resources of new sandboxes; the labels above are added
  sandbox::PrepareSpec prepare;  // made ready before a sandbox is assigned
  std::chrono::milliseconds idle_timeout = std::chrono::minutes(15);
  // How many sandboxes there may be and how they are shared (spec and prepare come from above).
  capacity::SchedulerOptions capacity;
  // The provider's accounts (name, most sandboxes in it): the one of a provider that is one
  // account, or the limits of those SandboxProvider::accounts names (others get max_sandboxes).
  std::vector<std::pair<std::string, int>> accounts = {{"local", 16}};
};

// The options `config` gives: its instance id, sandbox resources and network, idle timeout,
// the data and output directories made ready in every new sandbox, and its capacity limits.
ManagerOptions manager_options(const Config& config);

class Turn;

class ConversationManager {
 public:
  ConversationManager(sandbox::SandboxProvider& provider, HistoryStore& history, const Clock& clock,
                      ManagerOptions options);
  ~ConversationManager();

  // This run's id, on the quarry.boot label of the sandboxes it creates.
  const std::string& boot_id() const { return boot_id_; }
  // Where new sandboxes come from: limits, the warm pool, the queue (the server starts its pool
  // and reads its figures).
  capacity::Scheduler& scheduler() { return *scheduler_; }
  // What new sandboxes run (their Python and its packages), for the model's guidance.
  Result<sandbox::Runtime> sandbox_runtime() { return provider_.runtime(); }

  // For a server starting up: destroys every sandbox of this instance that an earlier run
  // left (orphans), recording it in their conversations, except those of the runs in `alive`
  // (the boot ids of live servers sharing the history). Returns how many.
  Result<int> destroy_orphans(const std::vector<std::string>& alive = {});

  // For a live server taking over one that stopped (its heartbeat did): destroys the sandboxes
  // of its run, found by their quarry.boot label, recording sandbox_deleted (reason orphan) in
  // their conversations; those a turn of a live server is using stay. Returns how many.
  Result<int> take_over(std::string_view boot_id);

  // Starts the next turn of a conversation, recorded as running. Refused with kAborted while
  // another turn of the same conversation runs, in this process or any other: two turns never
  // share a sandbox. A previous turn still recorded as running lost its process (it was killed
  // or crashed): it is recorded as interrupted and the commands it left running are stopped,
  // so they cannot change the sandbox under this turn. `on_event` sees this turn's events.
  Result<std::unique_ptr<Turn>> begin_turn(std::string_view conversation_id,
                                           TurnKind kind = TurnKind::kAsk, EventSink on_event = {});

  // For a server starting up: every turn recorded as running whose process is gone is recorded
  // as interrupted (as begin_turn would). Returns them as (conversation id, turn).
  Result<std::vector<std::pair<std::string, int>>> finish_interrupted_turns();

  // Deletes a conversation: its sandbox, its history and its artifacts' files. Refused with
  // kAborted while a turn of it runs.
  Result<void> delete_conversation(std::string_view conversation_id);

  // Deletes sandboxes idle longer than the idle timeout (conversations in a turn are left
  // alone). The conversations stay; their next turn gets a new sandbox. Returns how many.
  Result<int> reap_idle();

  // A normal shutdown: deletes every sandbox of this run that conversations hold, and the warm
  // pool's (sandboxes other servers sharing the history made are theirs to delete).
  Result<int> shutdown();

 private:
  friend class LazySandbox;
  friend class Turn;

  // Makes sure the turn's conversation has a live sandbox, replacing a dead one, and marks it
  // busy. Returns its id.
  Result<std::string> acquire(TurnContext& turn);
  // Records the sandbox `granted` as the turn's (starting, assigned, ready, replacing the
  // `previous` one, busy).
  Result<void> hold(TurnContext& turn, const capacity::Grant& granted, SandboxLifecycle previous,
                    const std::string& previous_id, const std::vector<std::string>& lost_files,
                    const std::vector<std::string>& lost_names);
  // The turn's sandbox stopped (found so, or under a command): moves the reference to dead,
  // removes what is left of the sandbox and records sandbox_deleted.
  Result<void> mark_dead(TurnContext& turn, std::string_view why);
  void end_turn(TurnContext& turn);
  // Records the transition and stores the new state.
  Result<void> move(std::string_view conversation_id, int turn, SandboxReference& reference,
                    SandboxLifecycle to, std::string_view reason, const EventSink& sink = {});
  Result<void> move(TurnContext& turn, SandboxLifecycle to, std::string_view reason);
  Result<void> record(std::string_view conversation_id, int turn, std::string_view kind,
                      std::string_view sandbox_id, std::string_view reason,
                      nlohmann::json details = nlohmann::json::object(),
                      const EventSink& sink = {});
  Result<void> record(TurnContext& turn, std::string_view kind, std::string_view sandbox_id,
                      std::string_view reason, nlohmann::json details = nlohmann::json::object());
  // The conversation's turn lock for a new turn: kAborted while a turn runs.
  Result<std::unique_ptr<TurnLock>> lock_for_turn(const std::string& conversation_id);
  // With the conversation's turn lock held: if its last turn is still recorded as running, its
  // process died; records it as interrupted and stops what it left running. Returns whether
  // there was such a turn.
  Result<bool> finish_interrupted_turn(const std::string& conversation_id);
  void finish_turn(TurnContext& turn, TurnStatus status, std::string_view error);
  // For the scheduler: deletes an idle sandbox whose place a waiting turn needs.
  Result<bool> evict(const std::string& conversation_id, const std::string& sandbox_id);
  // Destroys the sandbox of a conversation not in a turn and records why; used by the reaper,
  // shutdown, eviction and orphan cleanup.
  // Destroys the sandboxes `found`, recording orphan in the conversations that hold them.
  Result<int> destroy_found(const std::vector<sandbox::SandboxInfo>& found);
  Result<bool> delete_between_turns(const std::string& conversation_id,
                                    const std::string& sandbox_id, std::string_view reason,
                                    const std::function<bool(const SandboxReference&)>& still);

  // The conversation's kernel process if this quarry process started it, it runs in the turn's
  // sandbox and it is the one the history names (nullptr if not).
  sandbox::Process* resident(const TurnContext& turn);
  sandbox::Process* keep_resident(const TurnContext& turn,
                                  std::unique_ptr<sandbox::Process> process);
  // Kills a conversation's kernel process (every conversation's when empty): its sandbox is
  // going, or its user is done with it.
  void drop_residents(std::string_view conversation_id);
  // Lets go of the kernels kept for conversations whose sandbox no longer runs them (another
  // quarry process sharing the history reaped it, replaced it, or started its own kernel), or
  // that were deleted. Those of conversations in a turn are left to it.
  void drop_stale_residents();

  sandbox::SandboxProvider& provider_;
  HistoryStore& history_;
  const Clock& clock_;
  ManagerOptions options_;
  std::string boot_id_;
  std::unique_ptr<capacity::Scheduler> scheduler_;
  // The kernel processes this quarry process started in conversations' sandboxes, by
  // conversation; each turn uses only its own conversation's, so the lock guards only the map.
  std::mutex residents_mutex_;
  std::map<std::string, std::unique_ptr<sandbox::Process>, std::less<>> residents_;
};

// A running turn: holds the conversation's turn lock and its LazySandbox. Ending the turn
// (destroying this) leaves the sandbox idle for the next one.
class Turn {
 public:
  ~Turn();
  Turn(const Turn&) = delete;
  Turn& operator=(const Turn&) = delete;

  int number() const { return context_.number; }
  TurnKind kind() const { return context_.kind; }
  const std::string& conversation_id() const { return context_.conversation_id; }
  const std::string& owner() const { return context_.owner; }
  LazySandbox& sandbox() { return sandbox_; }
  // A wait for a sandbox ends when `fd` becomes readable (the turn's cancel eventfd).
  void set_cancel_fd(int fd) { context_.cancel_fd = fd; }
  // Why the turn could not have a sandbox (busy system, cancelled while waiting), if so.
  const std::optional<Error>& refusal() const { return context_.refusal; }

  // The tool step that runs next: its executions and artifacts are recorded under its id.
  void set_step(std::string_view tool_call_id, std::string_view tool);
  const std::string& step_call_id() const { return context_.step_call_id; }

  // Calls `lost` (on a thread of its own) if the turn's lock goes while it runs: see
  // TurnLock::watch. Another turn can then begin on the conversation, so this one must stop.
  void on_lock_lost(std::function<void()> lost) { lock_->watch(std::move(lost)); }

  // Records how the turn ended. A turn destroyed without it is recorded as failed.
  void finish(TurnStatus status, std::string_view error = {});

 private:
  friend class ConversationManager;
  Turn(ConversationManager& manager, std::unique_ptr<TurnLock> lock, TurnContext context);

  ConversationManager& manager_;
  std::unique_ptr<TurnLock> lock_;
  TurnContext context_;
  LazySandbox sandbox_;
};

}  // namespace quarry::conversation

#include "conversation/conversation_manager.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "common/random_id.h"
#include "common/text.h"
#include "common/units.h"

namespace quarry::conversation {
namespace {

using enum SandboxLifecycle;

SandboxLifecycle state_of(const SandboxReference& reference) {
  // A reference written by a newer quarry, or damaged: treat its sandbox as gone.
  return lifecycle_from_string(reference.state).value_or(kDead);
}

// "python3 -c 'print(1)'": argv as a shell would show it, for the exec log.
std::string command_line(const std::vector<std::string>& argv) {
  std::string line;
  for (const auto& arg : argv) {
    if (!line.empty()) line += ' ';
    line += shell_quote(arg);
  }
  return line;
}

// What the agent is told when its files did not survive.
std::string replacement_notice(SandboxLifecycle previous, const std::vector<std::string>& files,
                               const std::vector<std::string>& kernel_names,
                               std::chrono::milliseconds idle_timeout) {
  std::string why = previous == kDead
                        ? "the previous one stopped"
                        : fmt::format(
                              "the previous one was deleted (idle for more than {}, its place "
                              "was needed by another conversation, or the server restarted)",
                              format_duration(idle_timeout));
  std::string text = fmt::format("Note: this runs in a new sandbox; {}.", why);
  if (files.empty()) {
    text += " Files created there earlier are gone.";
  } else {
    text += fmt::format(" Files written there earlier are gone and must be created again: {}.",
                        fmt::join(files, ", "));
  }
  if (!kernel_names.empty()) {
    text += fmt::format(" Its Python kernel is gone with it, and what it held: {}.",
                        fmt::join(kernel_names, "; "));
  }
  return text;
}

}  // namespace

ManagerOptions manager_options(const Config& config) {
  ManagerOptions options;
  options.instance_id = config.conversations.instance_id;
  options.spec.resources = config.sandbox.resources;
  options.spec.network = config.sandbox.network;
  options.prepare.directories = {config.sandbox.data_dir, config.sandbox.output_dir};
  options.idle_timeout = config.sandbox.idle_timeout;
  const auto& capacity = config.capacity;
  options.capacity.max_sandboxes = static_cast<int>(capacity.max_sandboxes);
  options.capacity.max_per_user = static_cast<int>(capacity.max_per_user);
  options.capacity.max_queue = static_cast<int>(capacity.max_queue);
  options.capacity.queue_timeout =
      std::chrono::duration_cast<std::chrono::milliseconds>(capacity.queue_timeout);
  options.capacity.warm_min_idle = static_cast<int>(capacity.warm_pool.min_idle);
  const int total = static_cast<int>(capacity.max_sandboxes);
  options.accounts = {{"local", total}};
  if (!capacity.accounts.empty()) {
    options.accounts = {
        {capacity.accounts.front().first, static_cast<int>(capacity.accounts.front().second)}};
  }
  if (config.sandbox.provider == "daytona" && !config.sandbox.daytona.accounts.empty()) {
    options.accounts.clear();
    for (const auto& account : config.sandbox.daytona.accounts) {
      options.accounts.emplace_back(account.name, account.max_sandboxes > 0
                                                      ? static_cast<int>(account.max_sandboxes)
                                                      : total);
    }
  }
  return options;
}

ConversationManager::ConversationManager(sandbox::SandboxProvider& provider, HistoryStore& history,
                                         const Clock& clock, ManagerOptions options)
    : provider_(provider),
      history_(history),
      clock_(clock),
      options_(std::move(options)),
      boot_id_(random_id()) {
  capacity::SchedulerOptions capacity = options_.capacity;
  capacity.spec = options_.spec;
  capacity.spec.labels[std::string(kInstanceLabel)] = options_.instance_id;
  capacity.spec.labels[std::string(kBootLabel)] = boot_id_;
  capacity.prepare = options_.prepare;
  std::vector<capacity::Account> accounts;
  if (auto several = provider_.accounts(); !several.empty()) {
    for (const auto& [name, provider] : several) {
      int max = options_.capacity.max_sandboxes;
      for (const auto& [limited, limit] : options_.accounts) {
        if (limited == name) max = limit;
      }
      accounts.push_back({name, provider, max});
    }
  } else {
    const auto [name, max] =
        options_.accounts.empty()
            ? std::pair<std::string, int>{"local", options_.capacity.max_sandboxes}
            : options_.accounts.front();
    accounts.push_back({name, &provider_, max});
  }
  scheduler_ = std::make_unique<capacity::Scheduler>(std::move(accounts), std::move(capacity));
  scheduler_->set_evict([this](const std::string& conversation_id, const std::string& sandbox_id) {
    return evict(conversation_id, sandbox_id);
  });
}

ConversationManager::~ConversationManager() {
  scheduler_->shutdown();  // the pool's thread stops before the manager it calls is gone
}

Result<void> ConversationManager::record(std::string_view conversation_id, int turn,
                                         std::string_view kind, std::string_view sandbox_id,
                                         std::string_view reason, nlohmann::json details,
                                         const EventSink& sink) {
  Event event;
  event.turn = turn;
  event.kind = std::string(kind);
  event.sandbox_id = std::string(sandbox_id);
  event.reason = std::string(reason);
  event.details = std::move(details);
  ASSIGN_OR_RETURN(event, history_.record_event(conversation_id, std::move(event)));
  if (sink) sink(event);
  return {};
}

Result<void> ConversationManager::record(TurnContext& turn, std::string_view kind,
                                         std::string_view sandbox_id, std::string_view reason,
                                         nlohmann::json details) {
  return record(turn.conversation_id, turn.number, kind, sandbox_id, reason, std::move(details),
                turn.on_event);
}

Result<void> ConversationManager::move(std::string_view conversation_id, int turn,
                                       SandboxReference& reference, SandboxLifecycle to,
                                       std::string_view reason, const EventSink& sink) {
  const SandboxLifecycle from = state_of(reference);
  RETURN_IF_ERROR(check_transition(from, to));
  reference.state = std::string(to_string(to));
  RETURN_IF_ERROR(history_.set_sandbox_reference(conversation_id, reference));
  return record(conversation_id, turn, "state", reference.sandbox_id, reason,
                {{"from", to_string(from)}, {"to", to_string(to)}}, sink);
}

Result<void> ConversationManager::move(TurnContext& turn, SandboxLifecycle to,
                                       std::string_view reason) {
  return move(turn.conversation_id, turn.number, turn.reference, to, reason, turn.on_event);
}

Result<std::unique_ptr<Turn>> ConversationManager::begin_turn(std::string_view conversation_id,
                                                              TurnKind kind, EventSink on_event) {
  // Existence first, so an unknown id is "not found" rather than a lock file.
  ASSIGN_OR_RETURN(auto conversation, history_.conversation(conversation_id));
  ASSIGN_OR_RETURN(auto lock, lock_for_turn(conversation.id));
  RETURN_IF_ERROR(finish_interrupted_turn(conversation.id));
  ASSIGN_OR_RETURN(int number, history_.begin_turn(conversation.id, kind));
  TurnContext context;
  context.conversation_id = conversation.id;
  context.owner = conversation.owner;
  context.packages = conversation.packages;
  context.number = number;
  context.kind = kind;
  context.on_event = std::move(on_event);
  ASSIGN_OR_RETURN(context.reference, history_.sandbox_reference(conversation.id));
  return std::unique_ptr<Turn>(new Turn(*this, std::move(lock), std::move(context)));
}

Result<std::unique_ptr<TurnLock>> ConversationManager::lock_for_turn(
    const std::string& conversation_id) {
  // The lock is also taken for a moment between turns (the reaper, an eviction, shutdown): a
  // turn that finds it taken while no turn is recorded as running waits for it a little.
  constexpr auto kPatience = std::chrono::seconds(2);
  constexpr auto kPause = std::chrono::milliseconds(5);
  const auto deadline = std::chrono::steady_clock::now() + kPatience;
  for (;;) {
    auto lock = history_.try_lock_turn(conversation_id);
    if (lock || lock.error().code != ErrorCode::kAborted ||
        std::chrono::steady_clock::now() >= deadline) {
      return lock;
    }
    ASSIGN_OR_RETURN(auto turns, history_.turns(conversation_id));
    if (!turns.empty() && turns.back().status == TurnStatus::kRunning) return lock;
    std::this_thread::sleep_for(kPause);
  }
}

Result<bool> ConversationManager::finish_interrupted_turn(const std::string& conversation_id) {
  ASSIGN_OR_RETURN(auto turns, history_.turns(conversation_id));
  if (turns.empty() || turns.back().status != TurnStatus::kRunning) return false;
  const int number = turns.back().number;
  RETURN_IF_ERROR(
      history_.finish_turn(conversation_id, number, TurnStatus::kInterrupted, kInterruptedReason));
  ASSIGN_OR_RETURN(auto reference, history_.sandbox_reference(conversation_id));
  if (state_of(reference) == kBusy) {
    // Its command may still be running in the sandbox; it must not go on writing files under
    // the next turn.
    auto stopped = provider_.stop_commands(reference.sandbox_id);
    if (stopped && *stopped > 0) {
      RETURN_IF_ERROR(record(conversation_id, number, "commands_stopped", reference.sandbox_id,
                             "interrupted", {{"commands", *stopped}}));
    } else if (!stopped && stopped.error().code != ErrorCode::kNotFound &&
               stopped.error().code != ErrorCode::kUnavailable) {
      return std::unexpected(
          stopped.error().with_context("stopping an interrupted turn's commands"));
    }
    // Idle again: the next turn checks that it lives and counts it (this process's scheduler
    // has never seen it), and the reaper may take it.
    RETURN_IF_ERROR(move(conversation_id, number, reference, kIdle, "interrupted", {}));
  }
  spdlog::info("conversation {}: turn {} was interrupted (its process stopped)", conversation_id,
               number);
  return true;
}

Result<std::vector<std::pair<std::string, int>>> ConversationManager::finish_interrupted_turns() {
  ASSIGN_OR_RETURN(auto unfinished, history_.unfinished_turns());
  std::vector<std::pair<std::string, int>> finished;
  for (const auto& [conversation_id, turn] : unfinished) {
    auto lock = history_.try_lock_turn(conversation_id);
    if (!lock) {
      if (lock.error().code == ErrorCode::kAborted) continue;  // its process is alive
      return std::unexpected(lock.error());
    }
    ASSIGN_OR_RETURN(bool done, finish_interrupted_turn(conversation_id));
    if (done) finished.emplace_back(conversation_id, turn.number);
  }
  return finished;
}

Result<void> ConversationManager::delete_conversation(std::string_view conversation_id) {
  ASSIGN_OR_RETURN(auto conversation, history_.conversation(conversation_id));
  ASSIGN_OR_RETURN(auto lock, lock_for_turn(conversation.id));
  ASSIGN_OR_RETURN(auto reference, history_.sandbox_reference(conversation.id));
  const SandboxLifecycle state = state_of(reference);
  if ((holds_sandbox(state) || state == kStarting) && !reference.sandbox_id.empty()) {
    drop_residents(conversation.id);
    if (auto destroyed = scheduler_->destroy(reference.sandbox_id);
        !destroyed && destroyed.error().code != ErrorCode::kNotFound) {
      return std::unexpected(destroyed.error().with_context("deleting the conversation's sandbox"));
    }
  }
  return history_.delete_conversation(conversation.id);
}

Result<std::string> ConversationManager::acquire(TurnContext& turn) {
  auto& reference = turn.reference;
  const std::string& conversation = turn.conversation_id;
  SandboxLifecycle state = state_of(reference);
  if (state == kBusy) return reference.sandbox_id;

  if (holds_sandbox(state)) {
    auto alive = provider_.is_alive(reference.sandbox_id);
    if (!alive && alive.error().code != ErrorCode::kNotFound) {
      return std::unexpected(alive.error().with_context("checking the conversation's sandbox"));
    }
    if (alive && *alive) {
      // Counted from now if an earlier process made it.
      scheduler_->adopt(reference.sandbox_id, turn.owner, conversation);
      RETURN_IF_ERROR(move(turn, kBusy, ""));
      return reference.sandbox_id;
    }
    // Killed, crashed or deleted behind our back: drop it, remove what is left of it.
    RETURN_IF_ERROR(mark_dead(turn, "found stopped"));
    state = kDead;
  } else if (state == kStarting) {
    // A process died while creating it; whatever it made is not to be trusted.
    RETURN_IF_ERROR(move(turn, kDead, "creation interrupted"));
    if (!reference.sandbox_id.empty()) (void)scheduler_->destroy(reference.sandbox_id);
    state = kDead;
  }

  // new, deleted or dead: a sandbox from the scheduler (warm, started, or after a wait). Nothing
  // is recorded as changed until one is had, so a turn that waited in vain leaves the
  // conversation as it was.
  const SandboxLifecycle previous = state;
  const std::string previous_id = reference.sandbox_id;
  const std::vector<std::string> lost_files = reference.files;
  const std::vector<std::string> lost_names = reference.kernel_names;
  capacity::Request request;
  request.user = turn.owner;
  request.conversation_id = conversation;
  if (auto recorded = history_.conversation(conversation); recorded) {
    request.network = recorded->network;
  } else if (recorded.error().code != ErrorCode::kNotFound) {
    return std::unexpected(recorded.error().with_context("reading the conversation's network"));
  }
  request.labels[std::string(kConversationLabel)] = conversation;
  request.packages = turn.packages;
  request.cancel_fd = turn.cancel_fd;
  bool queued = false;
  request.on_queued = [&](const capacity::QueuePosition& place) {
    const nlohmann::json details = {{"position", place.position}, {"waiting", place.waiting}};
    if (!queued) {
      // Once in the history; each later place only to whoever follows the turn.
      queued = true;
      (void)record(turn, "queued", "", "every sandbox is in use", details);
      return;
    }
    if (!turn.on_event) return;
    Event event;
    event.turn = turn.number;
    event.kind = "queued";
    event.reason = "every sandbox is in use";
    event.details = details;
    event.created_at = clock_.now();
    turn.on_event(event);
  };
  auto granted = scheduler_->acquire(request);
  if (!granted) {
    const auto code = granted.error().code;
    if (code == ErrorCode::kResourceExhausted || code == ErrorCode::kCancelled) {
      turn.refusal = granted.error();
    }
    return std::unexpected(granted.error().with_context("getting a sandbox"));
  }
  if (auto held = hold(turn, *granted, previous, previous_id, lost_files, lost_names); !held) {
    // Not recorded as this conversation's, the sandbox would stay counted as in use and nobody
    // would reap it: it goes. The turn's next step asks for another.
    turn.reference.state = std::string(to_string(kDead));
    if (auto destroyed = scheduler_->destroy(granted->sandbox_id); !destroyed) {
      spdlog::warn(
          "conversation {}: destroying sandbox {}, which the history could not record, "
          "failed: {}",
          conversation, granted->sandbox_id, destroyed.error().message);
    }
    return std::unexpected(held.error());
  }
  return reference.sandbox_id;
}

Result<void> ConversationManager::hold(TurnContext& turn, const capacity::Grant& granted,
                                       SandboxLifecycle previous, const std::string& previous_id,
                                       const std::vector<std::string>& lost_files,
                                       const std::vector<std::string>& lost_names) {
  auto& reference = turn.reference;
  reference.sandbox_id = granted.sandbox_id;
  reference.files.clear();
  reference.kernel_names.clear();
  reference.kernel.clear();
  const char* start = granted.warm ? "warm" : "cold";
  RETURN_IF_ERROR(move(turn, kStarting, start));
  RETURN_IF_ERROR(move(turn, kAssigned, ""));
  auto milliseconds = [](std::chrono::microseconds duration) {
    return static_cast<double>(duration.count()) / 1000;
  };
  RETURN_IF_ERROR(record(turn, "sandbox_ready", granted.sandbox_id, "",
                         {{"start", start},
                          {"waited_ms", milliseconds(granted.waited)},
                          {"acquire_ms", milliseconds(granted.acquired)}}));
  if (!previous_id.empty() && (previous == kDead || previous == kDeleted)) {
    if (previous == kDead) {
      RETURN_IF_ERROR(record(turn, "sandbox_replaced", granted.sandbox_id, "dead",
                             {{"previous", previous_id},
                              {"lost_files", lost_files},
                              {"lost_kernel_names", lost_names}}));
    }
    turn.notice = replacement_notice(previous, lost_files, lost_names, options_.idle_timeout);
  }
  return move(turn, kBusy, "");
}

Result<void> ConversationManager::mark_dead(TurnContext& turn, std::string_view why) {
  auto& reference = turn.reference;
  RETURN_IF_ERROR(move(turn, kDead, why));
  drop_residents(turn.conversation_id);
  (void)scheduler_->destroy(reference.sandbox_id);
  return record(turn, "sandbox_deleted", reference.sandbox_id, "dead");
}

void ConversationManager::finish_turn(TurnContext& turn, TurnStatus status,
                                      std::string_view error) {
  if (turn.finished) return;
  turn.finished = true;
  if (auto recorded = history_.finish_turn(turn.conversation_id, turn.number, status, error);
      !recorded) {
    spdlog::warn("conversation {}: could not record how turn {} ended: {}", turn.conversation_id,
                 turn.number, recorded.error().message);
  }
}

void ConversationManager::end_turn(TurnContext& turn) {
  finish_turn(turn, TurnStatus::kFailed, "the turn ended without a result");
  if (state_of(turn.reference) != kBusy) return;
  turn.reference.last_used_at = clock_.now();
  scheduler_->set_busy(turn.reference.sandbox_id, false);
  if (auto moved = move(turn, kIdle, ""); !moved) {
    spdlog::warn("conversation {}: could not record the end of turn {}: {}", turn.conversation_id,
                 turn.number, moved.error().message);
  }
}

Result<bool> ConversationManager::delete_between_turns(
    const std::string& conversation_id, const std::string& sandbox_id, std::string_view reason,
    const std::function<bool(const SandboxReference&)>& still) {
  auto lock = history_.try_lock_turn(conversation_id);
  if (!lock) {
    if (lock.error().code == ErrorCode::kAborted) return false;  // a turn is using it
    return std::unexpected(lock.error());
  }
  // Read again under the lock: the reference may have moved on since it was listed.
  ASSIGN_OR_RETURN(auto reference, history_.sandbox_reference(conversation_id));
  if (reference.sandbox_id != sandbox_id || !still(reference)) return false;
  drop_residents(conversation_id);
  if (auto destroyed = scheduler_->destroy(sandbox_id);
      !destroyed && destroyed.error().code != ErrorCode::kNotFound) {
    return std::unexpected(destroyed.error());
  }
  ASSIGN_OR_RETURN(auto conversation, history_.conversation(conversation_id));
  const SandboxLifecycle state = state_of(reference);
  const SandboxLifecycle to = state == kStarting ? kDead : kDeleted;
  RETURN_IF_ERROR(move(conversation_id, conversation.turns, reference, to, reason));
  RETURN_IF_ERROR(
      record(conversation_id, conversation.turns, "sandbox_deleted", sandbox_id, reason));
  return true;
}

Result<int> ConversationManager::reap_idle() {
  scheduler_->retry_destroys();  // sandboxes a provider failed to destroy, counted meanwhile
  ASSIGN_OR_RETURN(auto references, history_.sandbox_references());
  const auto now = clock_.now();
  auto expired = [&](const SandboxReference& reference) {
    return state_of(reference) == kIdle && reference.last_used_at &&
           now - *reference.last_used_at >= options_.idle_timeout;
  };
  int deleted = 0;
  for (const auto& [conversation_id, reference] : references) {
    if (!expired(reference)) continue;
    ASSIGN_OR_RETURN(bool done,
                     delete_between_turns(conversation_id, reference.sandbox_id, "idle", expired));
    deleted += done;
  }
  drop_stale_residents();
  return deleted;
}

void ConversationManager::drop_stale_residents() {
  std::vector<std::string> kept;
  {
    std::lock_guard lock(residents_mutex_);
    for (const auto& [conversation_id, process] : residents_)
      kept.push_back(conversation_id);
  }
  for (const auto& conversation_id : kept) {
    // Under the turn lock, so that no turn starts a kernel between the read and the drop.
    auto lock = history_.try_lock_turn(conversation_id);
    if (!lock) continue;  // a turn runs (it checks its kernel itself), or another time
    auto reference = history_.sandbox_reference(conversation_id);
    if (!reference && reference.error().code != ErrorCode::kNotFound) continue;
    std::unique_ptr<sandbox::Process> stale;  // let go at the end of the step, outside the lock
    {
      std::lock_guard guard(residents_mutex_);
      auto found = residents_.find(conversation_id);
      if (found == residents_.end()) continue;
      if (reference && holds_sandbox(state_of(*reference)) &&
          reference->kernel == found->second->id()) {
        continue;
      }
      stale = std::move(found->second);
      residents_.erase(found);
    }
  }
}

Result<bool> ConversationManager::evict(const std::string& conversation_id,
                                        const std::string& sandbox_id) {
  auto idle = [](const SandboxReference& reference) { return state_of(reference) == kIdle; };
  return delete_between_turns(conversation_id, sandbox_id, "evicted", idle);
}

Result<int> ConversationManager::shutdown() {
  ASSIGN_OR_RETURN(auto references, history_.sandbox_references());
  ASSIGN_OR_RETURN(auto mine, provider_.find({{std::string(kBootLabel), boot_id_}}));
  std::set<std::string> made_here;
  for (const auto& info : mine)
    made_here.insert(info.id);
  auto held = [](const SandboxReference& reference) {
    return holds_sandbox(state_of(reference)) || state_of(reference) == kStarting;
  };
  int deleted = 0;
  for (const auto& [conversation_id, reference] : references) {
    if (!held(reference) || !made_here.contains(reference.sandbox_id)) continue;
    ASSIGN_OR_RETURN(bool done,
                     delete_between_turns(conversation_id, reference.sandbox_id, "shutdown", held));
    deleted += done;
  }
  drop_residents("");
  return deleted + scheduler_->shutdown();
}

Result<int> ConversationManager::destroy_orphans(const std::vector<std::string>& alive) {
  ASSIGN_OR_RETURN(auto found,
                   provider_.find({{std::string(kInstanceLabel), options_.instance_id}}));
  std::erase_if(found, [&](const sandbox::SandboxInfo& info) {
    auto boot = info.labels.find(std::string(kBootLabel));
    return boot != info.labels.end() &&
           (boot->second == boot_id_ ||
            std::find(alive.begin(), alive.end(), boot->second) != alive.end());
  });
  return destroy_found(found);
}

Result<int> ConversationManager::take_over(std::string_view boot_id) {
  if (boot_id == boot_id_) {
    return make_error(ErrorCode::kInvalidArgument, "a server cannot take over its own run");
  }
  ASSIGN_OR_RETURN(auto found, provider_.find({{std::string(kBootLabel), std::string(boot_id)}}));
  return destroy_found(found);
}

Result<int> ConversationManager::destroy_found(const std::vector<sandbox::SandboxInfo>& found) {
  // Which conversation holds each sandbox: its reference says so (a sandbox from the warm pool
  // carries no conversation label).
  ASSIGN_OR_RETURN(auto references, history_.sandbox_references());
  std::map<std::string, std::string> holder;
  for (const auto& [conversation_id, reference] : references) {
    if (!reference.sandbox_id.empty()) holder[reference.sandbox_id] = conversation_id;
  }
  int destroyed = 0;
  for (const auto& info : found) {
    if (auto conversation = holder.find(info.id); conversation != holder.end()) {
      auto any = [](const SandboxReference&) { return true; };
      ASSIGN_OR_RETURN(bool done,
                       delete_between_turns(conversation->second, info.id, "orphan", any));
      // Not done: in a turn of another live process, which goes on using it.
      destroyed += done;
      continue;
    }
    // A sandbox no conversation refers to (the pool's, or one whose creation was cut short):
    // nothing to record, just remove it.
    if (auto removed = provider_.destroy(info.id); removed) ++destroyed;
  }
  return destroyed;
}

Turn::Turn(ConversationManager& manager, std::unique_ptr<TurnLock> lock, TurnContext context)
    : manager_(manager),
      lock_(std::move(lock)),
      context_(std::move(context)),
      sandbox_(manager, context_) {}

Turn::~Turn() {
  manager_.end_turn(context_);
}

void Turn::set_step(std::string_view tool_call_id, std::string_view tool) {
  context_.step_call_id = std::string(tool_call_id);
  context_.step_tool = std::string(tool);
}

void Turn::finish(TurnStatus status, std::string_view error) {
  manager_.finish_turn(context_, status, error);
}

template <typename Call>
auto LazySandbox::on_sandbox(std::string_view why, Call&& call) {
  using Returned = decltype(call(std::string()));
  auto id = manager_.acquire(turn_);
  if (!id) return Returned(std::unexpected(std::move(id).error()));
  Returned result = call(*id);
  if (!result && result.error().code == ErrorCode::kUnavailable) {
    (void)manager_.mark_dead(turn_, why);
  }
  return result;
}

bool LazySandbox::has_sandbox() const {
  const auto state = lifecycle_from_string(turn_.reference.state);
  return !turn_.reference.sandbox_id.empty() && state &&
         (*state == kAssigned || *state == kBusy || *state == kIdle);
}

Result<void> LazySandbox::write_file(std::string_view path, std::istream& content) {
  RETURN_IF_ERROR(on_sandbox("stopped", [&](const std::string& id) {
    return manager_.provider_.write_file(id, path, content, turn_.cancel_fd);
  }));
  auto& files = turn_.reference.files;
  if (std::find(files.begin(), files.end(), path) == files.end()) {
    files.emplace_back(path);
    RETURN_IF_ERROR(
        manager_.history_.set_sandbox_reference(turn_.conversation_id, turn_.reference));
  }
  return {};
}

Result<void> LazySandbox::write_file(std::string_view path, std::string_view content) {
  std::istringstream stream{std::string(content)};
  return write_file(path, stream);
}

Result<Execution> LazySandbox::execute(sandbox::ExecRequest request) {
  std::string id;
  Clock::time_point started;
  auto result = on_sandbox("stopped during a command", [&](const std::string& sandbox_id) {
    id = sandbox_id;
    started = manager_.clock_.now();
    return manager_.provider_.exec(id, request);
  });
  if (!result) {
    if (!id.empty() && result.error().code == ErrorCode::kUnavailable) {
      return make_error(ErrorCode::kUnavailable,
                        "the sandbox stopped while running this command; the next command runs "
                        "in a new sandbox, without the files written so far");
    }
    return std::unexpected(result.error());
  }
  ExecRecord record;
  record.turn = turn_.number;
  record.tool_call_id = turn_.step_call_id;
  record.tool = turn_.step_tool;
  record.sandbox_id = id;
  record.command = command_line(request.argv);
  record.result = *result;
  record.started_at = started;
  RETURN_IF_ERROR(manager_.history_.record_exec(turn_.conversation_id, std::move(record)));
  Execution execution{std::move(*result), std::move(turn_.notice)};
  turn_.notice.reset();
  return execution;
}

Result<uint64_t> LazySandbox::read_file(std::string_view path, std::ostream& out,
                                        uint64_t max_bytes) {
  return on_sandbox("stopped", [&](const std::string& id) {
    return manager_.provider_.read_file(id, path, out, max_bytes, turn_.cancel_fd);
  });
}

Result<std::vector<sandbox::FileInfo>> LazySandbox::list_files(std::string_view directory) {
  return on_sandbox("stopped", [&](const std::string& id) {
    return manager_.provider_.list_files(id, directory);
  });
}

sandbox::Process* ConversationManager::resident(const TurnContext& turn) {
  std::unique_ptr<sandbox::Process> stale;
  {
    std::lock_guard lock(residents_mutex_);
    auto found = residents_.find(turn.conversation_id);
    if (found == residents_.end()) return nullptr;
    // The reference names the kernel of the sandbox it names (a new sandbox has none); another
    // quarry process sharing the history may have run a turn since, with its own kernel.
    if (found->second->id() == turn.reference.kernel && found->second->alive()) {
      return found->second.get();
    }
    stale = std::move(found->second);
    residents_.erase(found);
  }
  return nullptr;  // `stale` is killed here, outside the lock
}

sandbox::Process* ConversationManager::keep_resident(const TurnContext& turn,
                                                     std::unique_ptr<sandbox::Process> process) {
  std::unique_ptr<sandbox::Process> replaced;
  std::lock_guard lock(residents_mutex_);
  auto& slot = residents_[turn.conversation_id];
  replaced = std::move(slot);
  slot = std::move(process);
  return slot.get();
}

void ConversationManager::drop_residents(std::string_view conversation_id) {
  std::vector<std::unique_ptr<sandbox::Process>> dropped;
  {
    std::lock_guard lock(residents_mutex_);
    for (auto it = residents_.begin(); it != residents_.end();) {
      if (conversation_id.empty() || it->first == conversation_id) {
        dropped.push_back(std::move(it->second));
        it = residents_.erase(it);
      } else {
        ++it;
      }
    }
  }
}

sandbox::Process* LazySandbox::kernel() {
  return manager_.resident(turn_);
}

Result<sandbox::Process*> LazySandbox::start_kernel(const sandbox::ExecRequest& request) {
  manager_.drop_residents(turn_.conversation_id);
  ASSIGN_OR_RETURN(
      auto started,
      on_sandbox(
          "stopped", [&](const std::string& id) -> Result<std::unique_ptr<sandbox::Process>> {
            // A kernel another quarry process started here (it ran a turn since): no one can reach
            // it now, and it holds memory the sandbox's limit counts. Two are not left to share it.
            if (const auto& other = turn_.reference.kernel; !other.empty()) {
              if (auto stopped = manager_.provider_.stop_process(id, other); !stopped) {
                return std::unexpected(stopped.error().with_context(
                    "stopping the Python kernel another quarry process started in the sandbox"));
              }
            }
            return manager_.provider_.start(id, request);
          }));
  turn_.reference.kernel = started->id();
  RETURN_IF_ERROR(manager_.history_.set_sandbox_reference(turn_.conversation_id, turn_.reference));
  return manager_.keep_resident(turn_, std::move(started));
}

void LazySandbox::stop_kernel() {
  manager_.drop_residents(turn_.conversation_id);
}

Result<void> LazySandbox::record_step(std::string_view command, const sandbox::ExecResult& result,
                                      std::chrono::system_clock::time_point started) {
  ExecRecord record;
  record.turn = turn_.number;
  record.tool_call_id = turn_.step_call_id;
  record.tool = turn_.step_tool;
  record.sandbox_id = turn_.reference.sandbox_id;
  record.command = std::string(command);
  record.result = result;
  record.started_at = started;
  RETURN_IF_ERROR(manager_.history_.record_exec(turn_.conversation_id, std::move(record)));
  return {};
}

Result<void> LazySandbox::set_kernel_names(std::vector<std::string> names) {
  if (names == turn_.reference.kernel_names) return {};
  turn_.reference.kernel_names = std::move(names);
  return manager_.history_.set_sandbox_reference(turn_.conversation_id, turn_.reference);
}

}  // namespace quarry::conversation

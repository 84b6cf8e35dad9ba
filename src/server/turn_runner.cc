#include "server/turn_runner.h"

#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>

#include "agent/guidance.h"
#include "common/json.h"
#include "common/units.h"
#include "data/database.h"
#include "sandbox/metering.h"
#include "server/api_error.h"
#include "server/api_json.h"

namespace quarry::server {
namespace {

using conversation::TurnKind;
using conversation::TurnStatus;

// The arguments the model sent, as JSON when they are JSON.
nlohmann::json arguments_json(const std::string& text) {
  auto parsed = parse_json_or_discarded(text.empty() ? "{}" : text);
  return parsed.is_discarded() ? nlohmann::json(text) : parsed;
}

nlohmann::json metering_json(const sandbox::ExecResult& result) {
  auto json = sandbox::to_json(result);
  json.erase("stdout");  // streamed as output events already, and in the history
  json.erase("stderr");
  return json;
}

}  // namespace

TurnRunner::Outcome TurnRunner::outcome_of(const Error& error) {
  return {error.code == ErrorCode::kCancelled ? TurnStatus::kCancelled : TurnStatus::kFailed, "",
          error};
}

TurnRunner::TurnRunner(const Config& config, std::filesystem::path state_dir,
                       conversation::HistoryStore& history,
                       conversation::ConversationManager& manager, agent::ModelClient* model,
                       StreamHub& hub, TurnRunnerOptions options)
    : config_(config),
      state_dir_(std::move(state_dir)),
      history_(history),
      manager_(manager),
      model_(model),
      hub_(hub),
      options_(options) {
  for (size_t i = 0; i < std::max<size_t>(options_.workers, 1); ++i) {
    workers_.emplace_back([this] { work(); });
  }
}

TurnRunner::~TurnRunner() {
  shutdown(std::chrono::milliseconds(0));
}

void TurnRunner::work() {
  for (;;) {
    Queued next;
    {
      std::unique_lock lock(mutex_);
      changed_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      // The user with the fewest turns on workers first; the oldest of theirs.
      auto working = [&](const Queued& queued) {
        auto found = working_.find(queued.user);
        return found == working_.end() ? 0 : found->second;
      };
      auto chosen =
          std::min_element(queue_.begin(), queue_.end(),
                           [&](const auto& a, const auto& b) { return working(a) < working(b); });
      next = std::move(*chosen);
      queue_.erase(chosen);
      ++working_[next.user];
    }
    next.job();
    std::lock_guard lock(mutex_);
    if (--working_[next.user] == 0) working_.erase(next.user);
  }
}

agent::Toolbox TurnRunner::toolbox() const {
  // Resolved for each turn: the private PostgreSQL may have been started since the server was.
  return agent::Toolbox(
      {config_, data::resolve_database(config_.database, state_dir_), history_, state_dir_});
}

agent::AgentEventSink TurnRunner::stream_to(LiveTurn& live) {
  // Output bytes streamed so far per (call, stream): a step that prints without end is cut.
  auto streamed = std::make_shared<std::map<std::pair<std::string, int>, uint64_t>>();
  const uint64_t limit = options_.live_output_limit;
  return [&live, streamed, limit](const agent::AgentEvent& event) {
    using Kind = agent::AgentEvent::Kind;
    switch (event.kind) {
      case Kind::kText:
        if (!event.text.empty()) live.publish("text", {{"step", event.step}, {"text", event.text}});
        break;
      case Kind::kToolCall:
        live.publish("tool_started", {{"step", event.step},
                                      {"call_id", event.tool_call_id},
                                      {"tool", event.tool},
                                      {"arguments", arguments_json(event.arguments)}});
        break;
      case Kind::kOutput: {
        const bool is_stdout = event.stream == sandbox::OutputStream::kStdout;
        auto& sent = (*streamed)[{event.tool_call_id, is_stdout ? 1 : 2}];
        if (sent >= limit) break;
        std::string text = event.text.substr(0, limit - sent);
        sent += event.text.size();
        nlohmann::json data = {{"call_id", event.tool_call_id},
                               {"stream", is_stdout ? "stdout" : "stderr"},
                               {"text", text}};
        if (sent >= limit) data["truncated"] = true;  // the rest is only in the history
        live.publish("output", std::move(data));
        break;
      }
      case Kind::kToolResult: {
        const auto& result = *event.result;
        nlohmann::json failure = nullptr;
        if (result.failure.kind != agent::FailureKind::kNone) {
          failure = {{"kind", agent::to_string(result.failure.kind)},
                     {"cause", result.failure.cause},
                     {"advice", result.failure.advice}};
        }
        live.publish("tool_finished",
                     {{"step", event.step},
                      {"call_id", event.tool_call_id},
                      {"tool", event.tool},
                      {"ok", result.ok},
                      {"content", result.content},
                      {"elapsed_ms", result.elapsed_ms},
                      {"failure", failure},
                      {"exec", result.exec ? metering_json(*result.exec) : nullptr}});
        break;
      }
      case Kind::kArtifact:
        live.publish("artifact", {{"call_id", event.tool_call_id},
                                  {"artifact", artifact_json(*event.artifact)}});
        break;
      case Kind::kError: {
        auto error = from_error(Error{event.error_code, event.text});
        live.publish("error", {{"code", error.code}, {"message", error.message}});
        break;
      }
      case Kind::kSandbox:  // published by the turn's event sink
      case Kind::kDone:     // published with the turn's status once its lock is released
        break;
    }
  };
}

Result<int> TurnRunner::start(const std::string& conversation_id, TurnKind kind,
                              nlohmann::json started, Job job) {
  {
    std::lock_guard lock(mutex_);
    if (!accepting_) {
      return make_error(ErrorCode::kUnavailable,
                        "the server is shutting down and takes no new turns; send it again to "
                        "the server when it is back");
    }
    RETURN_IF_ERROR(manager_.scheduler().admit(static_cast<int>(queue_.size())));
    ++starting_;
  }
  struct Started {
    TurnRunner& runner;
    ~Started() {
      {
        std::lock_guard lock(runner.mutex_);
        --runner.starting_;
      }
      runner.changed_.notify_all();
    }
  } started_guard{*this};
  // Sandbox events are streamed as they are recorded; the stream exists once the turn is begun.
  auto stream = std::make_shared<std::shared_ptr<LiveTurn>>();
  auto on_event = [stream](const conversation::Event& event) {
    if (!*stream || event.kind == "state") return;  // state changes stay in the history
    (*stream)->publish("sandbox", {{"kind", event.kind},
                                   {"sandbox_id", event.sandbox_id},
                                   {"reason", event.reason},
                                   {"details", event.details}});
  };
  ASSIGN_OR_RETURN(auto turn, manager_.begin_turn(conversation_id, kind, on_event));
  auto running = std::make_shared<Running>();
  running->conversation_id = conversation_id;
  running->number = turn->number();
  running->cancel.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!running->cancel) return errno_error("eventfd");
  auto live = hub_.begin(conversation_id, running->number);
  *stream = live;
  started["kind"] = conversation::to_string(kind);
  live->publish("turn_started", std::move(started));

  std::shared_ptr<conversation::Turn> shared_turn(std::move(turn));
  // Without its lock, another turn could begin on the conversation (through any server) and
  // take this one for the remains of a dead process: it stops instead.
  shared_turn->on_lock_lost([this, running] {
    std::lock_guard lock(mutex_);
    if (running->ended) return;
    spdlog::warn("conversation {}: turn {} lost its turn lock: cancelling",
                 running->conversation_id, running->number);
    running->request_cancel(conversation::kTurnLockLost);
  });
  const std::string user = shared_turn->owner();
  std::lock_guard lock(mutex_);
  running_[conversation_id] = running;
  if (!cancel_all_.empty()) running->request_cancel(cancel_all_);  // the grace ended meanwhile
  queue_.push_back(
      {user, [this, running, live, turn = std::move(shared_turn), job = std::move(job)]() mutable {
         Outcome outcome;
         try {
           outcome = job(*running, *live, *turn);
         } catch (const std::exception& error) {
           spdlog::error("conversation {}: turn {} failed: {}", running->conversation_id,
                         running->number, error.what());
           outcome = {TurnStatus::kFailed, "",
                      Error{ErrorCode::kInternal, fmt::format("quarry failed: {}", error.what())}};
           turn->finish(TurnStatus::kFailed, outcome.error->message);
         }
         finish(*running, *live, std::move(turn), outcome);
       }});
  changed_.notify_one();
  return running->number;
}

void TurnRunner::finish(Running& running, LiveTurn& live, std::shared_ptr<conversation::Turn> turn,
                        const Outcome& outcome) {
  std::string error = outcome.error ? outcome.error->message : "";
  {
    std::lock_guard lock(mutex_);
    running.ended = true;  // its outcome is decided: a cancel from now on finds nothing to stop
    if (outcome.status == TurnStatus::kCancelled && !running.cancel_reason.empty()) {
      error = running.cancel_reason;
    }
  }
  if (outcome.status == TurnStatus::kCancelled && !error.empty()) {
    // The agent recorded "cancelled"; the history says why.
    (void)history_.finish_turn(running.conversation_id, running.number, TurnStatus::kCancelled,
                               error);
  }
  turn.reset();  // the lock is released and the sandbox idle before anyone hears the turn ended
  live.publish("done",
               {{"status", conversation::to_string(outcome.status)},
                {"answer", outcome.status == TurnStatus::kCompleted && !outcome.answer.empty()
                               ? nlohmann::json(outcome.answer)
                               : nlohmann::json(nullptr)},
                {"error", error.empty() ? nlohmann::json(nullptr) : nlohmann::json(error)}});
  hub_.end(live);
  {
    std::lock_guard lock(mutex_);
    auto found = running_.find(running.conversation_id);
    if (found != running_.end() && found->second.get() == &running) running_.erase(found);
  }
  changed_.notify_all();
}

Result<int> TurnRunner::cancel(const std::string& conversation_id, std::string reason,
                               std::optional<int> only_turn) {
  std::lock_guard lock(mutex_);
  auto found = running_.find(conversation_id);
  if (found == running_.end() || found->second->ended ||
      (only_turn && found->second->number != *only_turn)) {
    return make_error(ErrorCode::kNotFound, "no turn of conversation {} is running",
                      conversation_id);
  }
  Running& running = *found->second;
  if (!running.request_cancel(reason)) {
    return errno_error("cancelling turn {} of conversation {}", running.number, conversation_id);
  }
  return running.number;
}

bool TurnRunner::Running::request_cancel(std::string_view reason) {
  if (cancel_reason.empty()) cancel_reason = reason;
  const uint64_t one = 1;
  return ::write(cancel.get(), &one, sizeof one) >= 0 || errno == EAGAIN;
}

void TurnRunner::shutdown(std::chrono::milliseconds grace) {
  std::unique_lock lock(mutex_);
  accepting_ = false;
  // Turns still beginning are waited for too: one taken just before is run like the others.
  auto idle = [&] { return running_.empty() && starting_ == 0; };
  if (!changed_.wait_for(lock, grace, idle)) {
    spdlog::warn("{} turn{} still running after {}: cancelling", running_.size() + starting_,
                 running_.size() + starting_ == 1 ? "" : "s", format_duration(grace));
    cancel_all_ =
        "cancelled: the server shut down before the turn finished (server.shutdown_grace)";
    for (auto& [id, running] : running_)
      running->request_cancel(cancel_all_);
    // A cancelled turn ends as soon as its model call or command notices; an export or a query
    // runs until its statement_timeout.
    changed_.wait(lock, idle);
  }
  stopping_ = true;
  lock.unlock();
  changed_.notify_all();
  for (auto& worker : workers_) {
    if (worker.joinable()) worker.join();
  }
}

size_t TurnRunner::queued() const {
  std::lock_guard lock(mutex_);
  return queue_.size();
}

size_t TurnRunner::running() const {
  std::lock_guard lock(mutex_);
  return running_.size();
}

std::string TurnRunner::system_prompt() const {
  auto runtime = manager_.sandbox_runtime();
  return agent::system_prompt(config_, runtime ? std::optional(*runtime) : std::nullopt);
}

Result<int> TurnRunner::ask(const std::string& conversation_id, std::string question) {
  nlohmann::json started = {{"content", question}};
  return start(conversation_id, TurnKind::kAsk, std::move(started),
               [this, question = std::move(question)](Running& running, LiveTurn& live,
                                                      conversation::Turn& turn) {
                 auto toolbox = this->toolbox();
                 agent::Agent agent(model_, manager_, history_, toolbox, system_prompt(),
                                    agent::agent_options(config_));
                 auto answer =
                     agent.run_turn(turn, question, stream_to(live), running.cancel.get());
                 if (answer) return Outcome{TurnStatus::kCompleted, *answer, std::nullopt};
                 return outcome_of(answer.error());
               });
}

Result<int> TurnRunner::run_cell(const std::string& conversation_id, agent::Cell cell) {
  RETURN_IF_ERROR(agent::check_cell(cell));
  nlohmann::json started = {
      {"cell",
       {{"kind", agent::to_string(cell.kind)}, {"code", cell.code}, {"filename", cell.filename}}}};
  return start(
      conversation_id, TurnKind::kCell, std::move(started),
      [this, cell = std::move(cell)](Running& running, LiveTurn& live, conversation::Turn& turn) {
        auto toolbox = this->toolbox();
        agent::Agent agent(model_, manager_, history_, toolbox, system_prompt(),
                           agent::agent_options(config_));
        auto result = agent.run_cell(turn, cell, stream_to(live), running.cancel.get());
        return result ? Outcome{} : outcome_of(result.error());
      });
}

}  // namespace quarry::server

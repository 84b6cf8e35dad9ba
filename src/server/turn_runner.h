// Turns and cells on a bounded pool of worker threads. A turn is begun (its lock taken, its
// number known) by the request that asks for it, so a second turn of the same conversation is
// refused at once, and so is any turn while capacity.max_queue turns wait (for a worker or a
// sandbox). It then waits for a free worker, runs the agent there and publishes what happens to
// the StreamHub. Free workers take the waiting turn of the user with the fewest turns running,
// then the oldest, as the sandbox scheduler does. A slow model or a slow command occupies a worker,
// never the I/O thread, so accepting, streaming and other users go on.
#pragma once

#include <condition_variable>
#include <deque>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "agent/agent.h"
#include "common/unique_fd.h"
#include "server/stream_hub.h"

namespace quarry::server {

struct TurnRunnerOptions {
  size_t workers = 8;
  uint64_t live_output_limit = 1 << 20;  // output bytes streamed per step and stream
};

class TurnRunner {
 public:
  // `model` may be null: cells run, questions are refused. Everything outlives the runner.
  TurnRunner(const Config& config, std::filesystem::path state_dir,
             conversation::HistoryStore& history, conversation::ConversationManager& manager,
             agent::ModelClient* model, StreamHub& hub, TurnRunnerOptions options);
  ~TurnRunner();
  TurnRunner(const TurnRunner&) = delete;
  TurnRunner& operator=(const TurnRunner&) = delete;

  // Begins a turn of the conversation and queues it; returns its number. kAborted while another
  // turn of the conversation runs, kResourceExhausted while the queue is full, kUnavailable while
  // shutting down.
  Result<int> ask(const std::string& conversation_id, std::string question);
  Result<int> run_cell(const std::string& conversation_id, agent::Cell cell);

  // Stops the conversation's running turn now: the model request is closed, a running command
  // killed, the turn recorded as cancelled (`reason`). Returns its number; kNotFound when no
  // turn of it runs in this server (or, given `only_turn`, not that one).
  Result<int> cancel(const std::string& conversation_id, std::string reason,
                     std::optional<int> only_turn = std::nullopt);

  // Shutdown: takes no more turns, waits up to `grace` for the running ones, cancels the rest
  // and waits for them to record their end.
  void shutdown(std::chrono::milliseconds grace);
  size_t running() const;
  // Turns begun and waiting for a worker.
  size_t queued() const;

 private:
  struct Running {
    std::string conversation_id;
    int number = 0;
    UniqueFd cancel;            // an eventfd: readable once cancelled
    std::string cancel_reason;  // guarded by mutex_
    bool ended = false;         // guarded by mutex_: its job returned, the outcome is decided
    // Under mutex_: the first reason given stays; false if the eventfd could not be written.
    bool request_cancel(std::string_view reason);
  };
  // What a job reports when it is done.
  struct Outcome {
    conversation::TurnStatus status = conversation::TurnStatus::kCompleted;
    std::string answer;
    std::optional<Error> error;
  };
  using Job = std::function<Outcome(Running&, LiveTurn&, conversation::Turn&)>;
  static Outcome outcome_of(const Error& error);

  Result<int> start(const std::string& conversation_id, conversation::TurnKind kind,
                    nlohmann::json started, Job job);
  void work();
  // Releases the turn (its lock, its sandbox), then publishes its end and forgets it.
  void finish(Running& running, LiveTurn& live, std::shared_ptr<conversation::Turn> turn,
              const Outcome& outcome);
  agent::AgentEventSink stream_to(LiveTurn& live);
  agent::Toolbox toolbox() const;
  // Read for each turn, so that a rebuilt image is told to the model from the next turn on.
  std::string system_prompt() const;

  const Config& config_;
  std::filesystem::path state_dir_;
  conversation::HistoryStore& history_;
  conversation::ConversationManager& manager_;
  agent::ModelClient* model_;
  StreamHub& hub_;
  TurnRunnerOptions options_;

  mutable std::mutex mutex_;
  std::condition_variable changed_;
  struct Queued {
    std::string user;
    std::function<void()> job;
  };
  std::deque<Queued> queue_;
  std::map<std::string, int> working_;                       // turns on a worker, by user
  std::map<std::string, std::shared_ptr<Running>> running_;  // by conversation
  // Turns taken while accepting_ and still beginning (their lock, their row): shutdown waits
  // for them to be running_ too, and cancels those that begin after it has cancelled the rest.
  int starting_ = 0;
  bool accepting_ = true;
  std::string cancel_all_;  // set by shutdown once the grace is over: the reason
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace quarry::server

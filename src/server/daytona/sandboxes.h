// The sandboxes made through the Daytona-compatible API: what Daytona says of each (its owner,
// name, labels, environment, resources in Daytona's units, auto-stop and auto-delete intervals,
// last activity) beside the provider's sandbox of the same id. Each holds a lease of the
// capacity::Scheduler from create to delete, so it counts against quarry's limits like a
// conversation's sandbox. Records live in memory: like every sandbox of `quarry serve`, these
// are destroyed when the server stops (and, after a crash, as orphans at its next start).
//
// Stop ends every command in the sandbox and refuses toolbox calls until start; its files and its
// place in the limits stay (Daytona's stopped sandbox keeps its disk). A sandbox idle longer
// than its autoStopInterval is stopped; one stopped longer than its autoDeleteInterval is
// deleted (autoDelete 0: at the stop).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "capacity/scheduler.h"
#include "sandbox/provider.h"

namespace quarry::server::daytona {

// On the provider's sandbox: who made it through the Daytona-compatible API.
inline constexpr std::string_view kOwnerLabel = "quarry.daytona.owner";

enum class State { kStarted, kStopped, kDestroyed };

// Daytona's name of the state: started, stopped, destroyed.
std::string_view state_name(State state);

struct Record {
  std::string id;  // the provider's sandbox id
  std::string name;
  std::string owner;  // the quarry user
  std::map<std::string, std::string> labels;
  std::map<std::string, std::string> env;  // given to every command
  ResourceLimits resources;
  NetworkPolicy network;
  // Minutes, as Daytona counts them: autoStop 0 = never; autoDelete < 0 = never.
  int64_t auto_stop = 15;
  int64_t auto_archive = 10080;
  int64_t auto_delete = -1;
  State state = State::kStarted;
  std::chrono::system_clock::time_point created_at, updated_at, last_activity, stopped_at;
  uint64_t sequence = 0;  // creation order, for the list's cursor
  int in_use = 0;         // toolbox calls running now: never idle meanwhile
};

class Sandboxes {
 public:
  // `provider` is the scheduler's: stop ends the commands in its sandboxes.
  Sandboxes(capacity::Scheduler& scheduler, sandbox::SandboxProvider& provider,
            std::chrono::milliseconds reap_interval);
  ~Sandboxes();
  Sandboxes(const Sandboxes&) = delete;
  Sandboxes& operator=(const Sandboxes&) = delete;

  // Makes the sandbox of `draft` (its owner, name, labels, env, intervals, resources) from
  // `spec` through the scheduler. kAlreadyExists when the owner has a sandbox of that name.
  Result<Record> create(Record draft, sandbox::SandboxSpec spec);
  // The owner's sandbox by id or name; anyone else's is kNotFound, as a missing one.
  Result<Record> get(std::string_view owner, std::string_view id_or_name);
  // The owner's sandboxes, newest first.
  std::vector<Record> list(std::string_view owner);
  // Changes the owner's sandbox with `change` (under the lock: no blocking work) and returns it.
  Result<Record> update(std::string_view owner, std::string_view id_or_name,
                        const std::function<void(Record&)>& change);
  // Destroys the owner's sandbox and returns what it was, destroyed.
  Result<Record> remove(std::string_view owner, std::string_view id_or_name);
  // Stops the owner's started sandbox: its commands end (toolbox calls running now fail) and
  // later toolbox calls are refused until start. kFailedPrecondition when it is not started.
  // With autoDeleteInterval 0 the sandbox is deleted instead, as Daytona does.
  Result<Record> stop(std::string_view owner, std::string_view id_or_name);
  // Starts the owner's stopped sandbox again (a started one is left as it is).
  Result<Record> start(std::string_view owner, std::string_view id_or_name);

  // A toolbox call on the owner's started sandbox: its record, marked in use (never idle) until
  // `release` with the same id, which also counts as activity. kFailedPrecondition when stopped.
  Result<Record> use(std::string_view owner, std::string_view id);
  void release(std::string_view id);

  // The reaper's pass (every reap_interval) as at `now`: stops the sandboxes idle past their
  // autoStopInterval, deletes those stopped past their autoDeleteInterval.
  void reap(std::chrono::system_clock::time_point now);

  // Destroys every sandbox; returns how many. New creates are refused from then on.
  int shutdown();

 private:
  std::map<std::string, Record>::iterator find(std::string_view owner, std::string_view id_or_name);
  Result<Record> not_found(std::string_view id_or_name) const;
  // Ends the commands of a sandbox just marked stopped: those running now, then, once no
  // toolbox call is in flight (none can begin any more), any such a call started meanwhile.
  void end_commands(const std::string& id);
  // Kills the commands running in a sandbox now (a failure is logged: the stop stands).
  void kill_commands(const std::string& id);
  void reap_loop(std::chrono::milliseconds interval);

  capacity::Scheduler& scheduler_;
  sandbox::SandboxProvider& provider_;
  std::mutex mutex_;
  std::condition_variable stop_;
  std::condition_variable released_;  // a toolbox call ended
  bool stopping_ = false;
  uint64_t next_sequence_ = 1;
  std::map<std::string, Record> records_;  // by id
  std::thread reaper_;
};

}  // namespace quarry::server::daytona

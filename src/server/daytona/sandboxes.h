// The sandboxes made through the Daytona-compatible API: what Daytona says of each (its owner,
// name, labels, environment, resources in Daytona's units, auto-stop and auto-delete intervals,
// last activity) beside the provider's sandbox of the same id. Each holds a lease of the
// capacity::Scheduler from create to delete, so it counts against quarry's limits like a
// conversation's sandbox. Records live in memory: like every sandbox of `quarry serve`, these
// are destroyed when the server stops (and, after a crash, as orphans at its next start).
//
// A sandbox idle longer than its autoStopInterval is deleted, not stopped: the local provider
// cannot stop a sandbox and start it again with its files (docs/daytona.md).
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
  std::chrono::system_clock::time_point created_at, updated_at, last_activity;
  uint64_t sequence = 0;  // creation order, for the list's cursor
  int in_use = 0;         // toolbox calls running now: never idle meanwhile
};

class Sandboxes {
 public:
  Sandboxes(capacity::Scheduler& scheduler, std::chrono::milliseconds reap_interval);
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
  // Destroys the owner's sandbox and returns what it was.
  Result<Record> remove(std::string_view owner, std::string_view id_or_name);

  // A toolbox call on the owner's sandbox: its record, marked in use (never idle) until
  // `release` with the same id, which also counts as activity.
  Result<Record> use(std::string_view owner, std::string_view id);
  void release(std::string_view id);

  // Destroys every sandbox; returns how many. New creates are refused from then on.
  int shutdown();

 private:
  std::map<std::string, Record>::iterator find(std::string_view owner, std::string_view id_or_name);
  Result<Record> not_found(std::string_view id_or_name) const;
  void reap_loop(std::chrono::milliseconds interval);

  capacity::Scheduler& scheduler_;
  std::mutex mutex_;
  std::condition_variable stop_;
  bool stopping_ = false;
  uint64_t next_sequence_ = 1;
  std::map<std::string, Record> records_;  // by id
  std::thread reaper_;
};

}  // namespace quarry::server::daytona

// ServerRegistry: what the quarry servers sharing one history know of each other. Each records
// itself and refreshes a heartbeat; a live server takes over one whose heartbeat stopped (its
// sandboxes and its running turns), and each hears of the stream events the others record, so
// any of them serves any conversation's stream. Only a history several servers can share has
// one (PostgresHistoryStore); a SQLite history is one server's, and needs none of it.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/error.h"

namespace quarry::conversation {

struct ServerRecord {
  std::string boot_id;  // ConversationManager::boot_id(): the quarry.boot label of its sandboxes
  std::string instance_id;
  std::string url;
  Clock::time_point started_at;
  Clock::time_point heartbeat_at;
  // How long ago its heartbeat was, by the registry's clock (the database's), so servers whose
  // clocks disagree still agree on who is silent.
  std::chrono::milliseconds silent_for{0};
};

// Called with (conversation id, turn, seq) of each stream event recorded by any server
// (this one's too), on a thread of the registry's; an empty conversation id means events may
// have been missed (the registry lost its connection): look again at every conversation.
using StreamEventListener = std::function<void(const std::string&, int, int64_t)>;
// Called with (conversation id, turn) of each cancel asked through any server, on the same
// thread.
using CancelListener = std::function<void(const std::string&, int)>;

// Listening for stream events; stops when destroyed.
class Subscription {
 public:
  virtual ~Subscription() = default;
};

class ServerRegistry {
 public:
  virtual ~ServerRegistry() = default;

  // Records a server (started and heartbeat now), replacing an earlier record of its boot id.
  virtual Result<void> enter(const ServerRecord& server) = 0;
  // Refreshes its heartbeat. False when its record is gone: another server took it for dead.
  virtual Result<bool> beat(std::string_view boot_id) = 0;
  // A normal shutdown: removes its record.
  virtual Result<void> leave(std::string_view boot_id) = 0;
  virtual Result<std::vector<ServerRecord>> servers() = 0;
  // Removes the record of a server silent for longer than `timeout`, and says whether this call
  // did: of servers claiming one dead server at once, exactly one gets true and takes it over.
  virtual Result<bool> claim(std::string_view boot_id, std::chrono::milliseconds timeout) = 0;

  // Asks whichever server runs turn `turn` of the conversation to cancel it (a server hears
  // only the cancels of its own turns; none when the turn has ended meanwhile).
  virtual Result<void> request_cancel(std::string_view conversation_id, int turn) = 0;

  // Calls `on_event` with the stream events recorded from now on and `on_cancel` with the
  // cancels asked, until the subscription is destroyed (it must not outlive what the listeners
  // use, nor the registry).
  virtual Result<std::unique_ptr<Subscription>> listen(StreamEventListener on_event,
                                                       CancelListener on_cancel) = 0;
};

}  // namespace quarry::conversation

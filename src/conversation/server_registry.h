// ServerRegistry: what the quarry servers sharing one history know of each other. Each records
// itself and refreshes a heartbeat; a live server takes over one whose heartbeat stopped (its
// sandboxes and its running turns), and each hears of the stream events the others record, so
// any of them serves any conversation's stream. Only a history several servers can share has
// one (PostgresHistoryStore); a SQLite history is one server's, and needs none of it.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
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

// A live server's claim on a silent one, to take it over: `stamp` is the heartbeat the claim
// wrote in the silent server's record.
struct TakeOver {
  std::string boot_id;
  int64_t stamp = 0;
};

// Called with (conversation id, turn, seq) of each stream event recorded by any server
// (this one's too), on a thread of the registry's; an empty conversation id means events may
// have been missed (the registry lost its connection): look again at every conversation.
using StreamEventListener = std::function<void(const std::string&, int, int64_t)>;
// Called with (conversation id, turn) of each cancel asked through any server, on the same
// thread.
using CancelListener = std::function<void(const std::string&, int)>;
// A turn waiting on `server` needs room that only the others' sandboxes take (Scheduler's
// AskElsewhere): an idle sandbox of `user` (anyone's when empty) should go, on one server only.
struct RoomRequest {
  int64_t id = 0;  // for claim_room
  std::string server;
  std::string user;
};
// Called with each request for room, on the same thread: a server that has an idle sandbox to
// evict for it claims the request first (claim_room) and evicts only if the claim is its.
using RoomListener = std::function<void(const RoomRequest&)>;
// Called with the id of each conversation deleted through any server (this one's too), on the
// same thread: what a server keeps of it outside the history (its artifacts' files) can go.
using DeletedListener = std::function<void(const std::string&)>;

// What a subscription calls; any may be empty.
struct Listeners {
  StreamEventListener on_event;
  CancelListener on_cancel;
  RoomListener on_room;
  DeletedListener on_deleted;
};

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
  // Claims a server silent for longer than `timeout` for taking it over: of servers claiming it
  // at once, exactly one gets the claim (the others nullopt). The claim is written as the
  // silent server's heartbeat, so its record stays until `taken_over`: should the claimer die
  // half way, the server is silent again `timeout` later and a live server claims it anew,
  // finishing what was cut short.
  virtual Result<std::optional<TakeOver>> claim(std::string_view boot_id,
                                                std::chrono::milliseconds timeout) = 0;
  // After its sandboxes and turns were dealt with: removes the claimed server's record and its
  // sandboxes' places, unless its heartbeat changed since the claim (it was alive after all, or
  // another claim came after this one's time ran out).
  virtual Result<void> taken_over(const TakeOver& claim) = 0;

  // Asks whichever server runs turn `turn` of the conversation to cancel it (a server hears
  // only the cancels of its own turns; none when the turn has ended meanwhile).
  virtual Result<void> request_cancel(std::string_view conversation_id, int turn) = 0;

  // Asks the other servers to evict an idle sandbox for a turn waiting on `server` (of `user`,
  // unless empty): every one hears the request, the one that claims it first evicts.
  virtual Result<void> request_room(std::string_view server, std::string_view user) = 0;
  // Of the servers claiming request `id` at once, exactly one gets true; the others, and any
  // claim after a minute (the turn has asked again since), false.
  virtual Result<bool> claim_room(int64_t id) = 0;

  // Of `conversation_ids`, those deleted in the last 30 days (through any server): what a
  // server that was not listening then keeps of them can go.
  virtual Result<std::vector<std::string>> deleted_among(
      const std::vector<std::string>& conversation_ids) = 0;

  // Calls the listeners with the stream events recorded from now on, the cancels asked, the
  // requests for room (every server's, this one's too) and the conversations deleted, until the
  // subscription is destroyed (it must not outlive what the listeners use, nor the registry).
  virtual Result<std::unique_ptr<Subscription>> listen(Listeners listeners) = 0;
};

}  // namespace quarry::conversation

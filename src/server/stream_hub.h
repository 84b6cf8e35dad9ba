// The events of turns on their way to the clients that watch them. A running turn publishes
// each event once: it is numbered (turn, seq), recorded in the history (so a dropped stream can
// resume from any event, and a finished turn be replayed, even after a restart) and kept in
// memory while the turn runs, and every watcher of the conversation is woken. Watchers are
// coroutines on the server's I/O thread: an idle one costs a timer, not a thread.
//
// With several servers on one history, a turn runs on one of them and may be watched through
// any: the others read its events from the history, and are woken by heard() when one is
// recorded (the registry's LISTEN/NOTIFY), through the same next/arm path as their own turns.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "conversation/history_store.h"
#include "server/asio.h"

namespace quarry::server {

// Where a watcher is: after event `seq` of turn `turn` ("3-17" on the wire; seq 0 is before
// the turn's first event).
struct EventId {
  int turn = 0;
  int64_t seq = 0;
  auto operator<=>(const EventId&) const = default;
};
std::string to_string(const EventId& id);
std::optional<EventId> parse_event_id(std::string_view text);

// The Server-Sent Events frame of an event: "id: 3-17\nevent: text\ndata: {...}\n\n".
std::string sse_frame(const conversation::StreamEvent& event);

class StreamHub;

// One running turn's stream. Events come from the thread running the turn, one at a time.
class LiveTurn {
 public:
  LiveTurn(StreamHub& hub, std::string conversation_id, int number)
      : hub_(hub), conversation_id_(std::move(conversation_id)), number_(number) {}

  // Adds "type" and "turn" to `data`, records it and wakes the watchers.
  void publish(std::string_view type, nlohmann::json data);
  const std::string& conversation_id() const { return conversation_id_; }
  int number() const { return number_; }

 private:
  friend class StreamHub;
  StreamHub& hub_;
  std::string conversation_id_;
  int number_;
  // Guarded by the hub's mutex.
  std::vector<conversation::StreamEvent> events_;  // events_[i].seq == i + 1
};

using Waiter = std::shared_ptr<net::steady_timer>;

class StreamHub {
 public:
  explicit StreamHub(conversation::HistoryStore& history) : history_(history) {}

  // The stream of a turn that starts now.
  std::shared_ptr<LiveTurn> begin(const std::string& conversation_id, int number);
  // The turn published its last event: later reads come from the history.
  void end(const LiveTurn& turn);
  // The number of the conversation's running turn, if any.
  std::optional<int> live_turn(const std::string& conversation_id);

  // The events after `after`, in order: those of finished turns from the history, those of the
  // running turn from memory; and where to read next when there are none yet (past finished
  // turns that have nothing more). Reads the history: call it off the I/O thread.
  struct Batch {
    std::vector<conversation::StreamEvent> events;
    EventId position;  // the last event's id, or where the reader stands if there is none
  };
  Result<Batch> next(const std::string& conversation_id, EventId after);
  // Makes `waiter` (a timer on the I/O thread, with its keep-alive expiry set) wake when the
  // conversation has an event after `after`, and returns true; returns false when it has one
  // already (read again instead of waiting) or the hub is closing. On the I/O thread, with no
  // suspension between this and the wait, so no wake-up is lost.
  bool arm(const std::string& conversation_id, EventId after, const Waiter& waiter);
  void disarm(const std::string& conversation_id, const Waiter& waiter);

  // A stream's hold on a conversation, from before its first next() to its end. While one is
  // held the hub keeps the latest event it heard of there, which is what closes the gap
  // between reading the history and arming; a conversation with no watch, no waiter and no
  // running turn is forgotten, so a server's memory does not grow with every conversation it
  // has streamed or heard of.
  class [[nodiscard]] Watch {
   public:
    Watch(StreamHub& hub, std::string conversation_id);
    ~Watch();
    Watch(const Watch&) = delete;
    Watch& operator=(const Watch&) = delete;

   private:
    StreamHub& hub_;
    std::string conversation_id_;
  };
  Watch watch(const std::string& conversation_id) { return Watch(*this, conversation_id); }
  // The conversations the hub keeps state for (watched, waited on or running a turn).
  size_t conversations();

  // For a turn that lost its process: its stream ends with a "done" event of status
  // "interrupted" (after the events it recorded), so a watcher resuming it is not left waiting.
  Result<void> end_interrupted(const std::string& conversation_id, int turn,
                               std::string_view reason);

  // Another server sharing the history recorded event `id` of the conversation (or this one
  // did; the registry cannot tell): its watchers here wake and read it from the history. An
  // empty conversation id wakes every watcher (events may have been missed).
  void heard(const std::string& conversation_id, EventId id);

  // Server shutdown: every watcher wakes and finds the hub closing.
  void close();
  bool closing();

 private:
  friend class LiveTurn;
  struct Feed {
    std::shared_ptr<LiveTurn> live;
    // Turns whose next one began before they published their last event ("done" comes after
    // the turn lock is released): read from memory until they end, so a watcher of one does
    // not pass its "done" by.
    std::vector<std::shared_ptr<LiveTurn>> ending;
    EventId latest;  // the last event published in this process, or heard of from another
    std::vector<Waiter> waiters;
    int watches = 0;
  };
  using Feeds = std::map<std::string, Feed>;
  void record(LiveTurn& turn, conversation::StreamEvent event);
  // Under the mutex: drops the feed if nothing needs it any more.
  void forget_if_idle(Feeds::iterator feed);
  static void wake(std::vector<Waiter>& waiters);

  conversation::HistoryStore& history_;
  std::mutex mutex_;
  Feeds feeds_;
  bool closing_ = false;
};

}  // namespace quarry::server

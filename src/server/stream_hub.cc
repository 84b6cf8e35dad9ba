#include "server/stream_hub.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <charconv>

namespace quarry::server {

std::string to_string(const EventId& id) {
  return fmt::format("{}-{}", id.turn, id.seq);
}

std::optional<EventId> parse_event_id(std::string_view text) {
  auto dash = text.find('-');
  if (dash == std::string_view::npos) return std::nullopt;
  EventId id;
  auto turn = text.substr(0, dash);
  auto seq = text.substr(dash + 1);
  auto [turn_end, turn_error] = std::from_chars(turn.data(), turn.data() + turn.size(), id.turn);
  auto [seq_end, seq_error] = std::from_chars(seq.data(), seq.data() + seq.size(), id.seq);
  if (turn.empty() || seq.empty() || turn_error != std::errc() || seq_error != std::errc() ||
      turn_end != turn.data() + turn.size() || seq_end != seq.data() + seq.size() || id.turn < 0 ||
      id.seq < 0) {
    return std::nullopt;
  }
  return id;
}

std::string sse_frame(const conversation::StreamEvent& event) {
  return fmt::format("id: {}-{}\nevent: {}\ndata: {}\n\n", event.turn, event.seq, event.type,
                     event.data);
}

namespace {

// An event of turn `turn`; its data carries its type and turn too, so it stands on its own.
conversation::StreamEvent make_event(int turn, std::string_view type, nlohmann::json data) {
  data["type"] = type;
  data["turn"] = turn;
  conversation::StreamEvent event;
  event.turn = turn;
  event.type = std::string(type);
  event.data = data.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return event;
}

}  // namespace

void LiveTurn::publish(std::string_view type, nlohmann::json data) {
  hub_.record(*this, make_event(number_, type, std::move(data)));
}

Result<void> StreamHub::end_interrupted(const std::string& conversation_id, int turn,
                                        std::string_view reason) {
  ASSIGN_OR_RETURN(auto recorded, history_.stream_events(conversation_id, turn, 0));
  int64_t last = 0;
  for (const auto& event : recorded) {
    if (event.turn == turn) last = event.seq;
  }
  auto done =
      make_event(turn, "done", {{"status", "interrupted"}, {"answer", nullptr}, {"error", reason}});
  done.seq = last + 1;
  return history_.append_stream_event(conversation_id, done);
}

void StreamHub::record(LiveTurn& turn, conversation::StreamEvent event) {
  {
    std::lock_guard lock(mutex_);
    event.seq = static_cast<int64_t>(turn.events_.size()) + 1;
  }
  // Recorded before anyone can see it, so whatever a watcher saw survives this process.
  if (auto recorded = history_.append_stream_event(turn.conversation_id(), event); !recorded) {
    spdlog::warn(
        "conversation {}: a stream event was not recorded ({}); a stream resumed later "
        "may miss it",
        turn.conversation_id(), recorded.error().message);
  }
  std::lock_guard lock(mutex_);
  const EventId id{event.turn, event.seq};
  turn.events_.push_back(std::move(event));
  // A running or ending turn has its feed; one publishing after its end wakes nobody.
  auto found = feeds_.find(turn.conversation_id());
  if (found == feeds_.end()) return;
  // An ending turn's last events come after the next turn's first: the latest stays the latest.
  found->second.latest = std::max(found->second.latest, id);
  wake(found->second.waiters);
}

void StreamHub::wake(std::vector<Waiter>& waiters) {
  for (auto& waiter : waiters) {
    net::post(waiter->get_executor(), [waiter] { waiter->cancel(); });
  }
  waiters.clear();
}

std::shared_ptr<LiveTurn> StreamHub::begin(const std::string& conversation_id, int number) {
  auto turn = std::make_shared<LiveTurn>(*this, conversation_id, number);
  std::lock_guard lock(mutex_);
  auto& feed = feeds_[conversation_id];
  if (feed.live) feed.ending.push_back(std::move(feed.live));
  feed.live = turn;
  wake(feed.waiters);
  return turn;
}

void StreamHub::end(const LiveTurn& turn) {
  std::lock_guard lock(mutex_);
  auto found = feeds_.find(turn.conversation_id());
  if (found == feeds_.end()) return;
  auto& feed = found->second;
  if (feed.live.get() == &turn) feed.live.reset();
  std::erase_if(feed.ending, [&](const auto& ending) { return ending.get() == &turn; });
  wake(feed.waiters);
  forget_if_idle(found);
}

void StreamHub::forget_if_idle(Feeds::iterator feed) {
  const auto& [id, state] = *feed;
  if (!state.live && state.ending.empty() && state.waiters.empty() && state.watches == 0) {
    feeds_.erase(feed);
  }
}

StreamHub::Watch::Watch(StreamHub& hub, std::string conversation_id)
    : hub_(hub), conversation_id_(std::move(conversation_id)) {
  std::lock_guard lock(hub_.mutex_);
  ++hub_.feeds_[conversation_id_].watches;
}

StreamHub::Watch::~Watch() {
  std::lock_guard lock(hub_.mutex_);
  auto found = hub_.feeds_.find(conversation_id_);
  if (found == hub_.feeds_.end()) return;
  --found->second.watches;
  hub_.forget_if_idle(found);
}

size_t StreamHub::conversations() {
  std::lock_guard lock(mutex_);
  return feeds_.size();
}

std::optional<int> StreamHub::live_turn(const std::string& conversation_id) {
  std::lock_guard lock(mutex_);
  auto found = feeds_.find(conversation_id);
  if (found == feeds_.end() || !found->second.live) return std::nullopt;
  return found->second.live->number();
}

Result<StreamHub::Batch> StreamHub::next(const std::string& conversation_id, EventId after) {
  for (;;) {
    std::shared_ptr<LiveTurn> live;
    int first_in_memory = 0;
    {
      std::lock_guard lock(mutex_);
      auto found = feeds_.find(conversation_id);
      if (found != feeds_.end()) {
        live = found->second.live;
        for (const auto& ending : found->second.ending) {
          if (ending->number() != after.turn) continue;
          // A turn still publishing its last events while the next one runs.
          Batch batch{{}, after};
          for (auto i = static_cast<size_t>(after.seq); i < ending->events_.size(); ++i) {
            batch.events.push_back(ending->events_[i]);
          }
          if (!batch.events.empty()) {
            batch.position = {batch.events.back().turn, batch.events.back().seq};
          }
          return batch;
        }
        for (const auto& ending : found->second.ending) {
          if (first_in_memory == 0 || ending->number() < first_in_memory) {
            first_in_memory = ending->number();
          }
        }
      }
      if (live && (first_in_memory == 0 || live->number() < first_in_memory)) {
        first_in_memory = live->number();
      }
      if (live && after.turn >= live->number()) {
        // The running turn, from memory: it holds every event of the turn.
        Batch batch{{}, after};
        if (after.turn == live->number()) {
          for (auto i = static_cast<size_t>(after.seq); i < live->events_.size(); ++i) {
            batch.events.push_back(live->events_[i]);
          }
        }
        if (!batch.events.empty()) {
          batch.position = {batch.events.back().turn, batch.events.back().seq};
        }
        return batch;
      }
    }
    // Finished turns, from the history.
    ASSIGN_OR_RETURN(auto events, history_.stream_events(conversation_id, after.turn, after.seq));
    if (first_in_memory != 0) {
      // The running turn's events (and an ending one's) are read from memory, where all of
      // them are.
      std::erase_if(events, [&](const auto& event) { return event.turn >= first_in_memory; });
      if (events.empty()) {
        after = {first_in_memory, 0};
        continue;
      }
    }
    Batch batch{std::move(events), after};
    if (!batch.events.empty()) {
      batch.position = {batch.events.back().turn, batch.events.back().seq};
    }
    return batch;
  }
}

bool StreamHub::arm(const std::string& conversation_id, EventId after, const Waiter& waiter) {
  std::lock_guard lock(mutex_);
  if (closing_) return false;
  auto& feed = feeds_[conversation_id];
  // A watcher of an ending turn that has seen all its events so far waits for the rest (its
  // "done"), whatever the next turn has published.
  const bool waits_on_ending =
      std::any_of(feed.ending.begin(), feed.ending.end(), [&](const auto& ending) {
        return ending->number() == after.turn &&
               static_cast<int64_t>(ending->events_.size()) <= after.seq;
      });
  if (!waits_on_ending) {
    if (feed.latest > after) return false;
    if (feed.live && feed.live->number() > after.turn) return false;
  }
  feed.waiters.push_back(waiter);
  return true;
}

void StreamHub::disarm(const std::string& conversation_id, const Waiter& waiter) {
  std::lock_guard lock(mutex_);
  auto found = feeds_.find(conversation_id);
  if (found == feeds_.end()) return;
  std::erase(found->second.waiters, waiter);
  forget_if_idle(found);
}

void StreamHub::heard(const std::string& conversation_id, EventId id) {
  std::lock_guard lock(mutex_);
  if (conversation_id.empty()) {
    for (auto& [ignored, feed] : feeds_)
      wake(feed.waiters);
    return;
  }
  // Kept for a watcher that read the history but has not armed yet: it must find the event
  // newer than where it stands and read again. A conversation nobody here watches needs nothing.
  auto found = feeds_.find(conversation_id);
  if (found == feeds_.end()) return;
  auto& feed = found->second;
  feed.latest = std::max(feed.latest, id);
  wake(feed.waiters);
}

void StreamHub::close() {
  std::lock_guard lock(mutex_);
  closing_ = true;
  for (auto& [id, feed] : feeds_)
    wake(feed.waiters);
}

bool StreamHub::closing() {
  std::lock_guard lock(mutex_);
  return closing_;
}

}  // namespace quarry::server

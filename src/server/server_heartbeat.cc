#include "server/server_heartbeat.h"

#include <spdlog/spdlog.h>

#include <algorithm>

namespace quarry::server {

ServerHeartbeat::ServerHeartbeat(conversation::ServerRegistry& registry,
                                 conversation::ConversationManager& manager, StreamHub& hub,
                                 conversation::ServerRecord self, std::chrono::milliseconds timeout)
    : registry_(registry),
      manager_(manager),
      hub_(hub),
      self_(std::move(self)),
      timeout_(timeout),
      // Several beats fit in the timeout, so one slow beat never makes a live server look dead.
      interval_(std::clamp<std::chrono::milliseconds>(timeout / 6, std::chrono::milliseconds(50),
                                                      std::chrono::seconds(5))) {}

ServerHeartbeat::~ServerHeartbeat() {
  stop();
}

Result<void> ServerHeartbeat::start() {
  RETURN_IF_ERROR(registry_.enter(self_));
  beating_since_ = last_recorded_ = std::chrono::steady_clock::now();
  thread_ = std::thread([this] {
    std::unique_lock lock(mutex_);
    while (!stop_.wait_for(lock, interval_, [this] { return stopping_; })) {
      lock.unlock();
      beat();
      lock.lock();
    }
  });
  return {};
}

void ServerHeartbeat::stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  stop_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void ServerHeartbeat::leave() {
  stop();
  if (auto left = registry_.leave(self_.boot_id); !left) {
    spdlog::warn(
        "removing this server from the registry failed ({}); another server will take "
        "it for dead after {} ms, and find nothing left to clean up",
        left.error().message, timeout_.count());
  }
}

void ServerHeartbeat::beat() {
  auto alive = registry_.beat(self_.boot_id);
  const auto now = std::chrono::steady_clock::now();
  if (!alive) {
    spdlog::warn("refreshing this server's heartbeat failed: {}", alive.error().message);
    beating_since_.reset();
    return;
  }
  // Steady since now after a failure, and after a beat that took long (the database hung): any
  // gap longer than the timeout between two recorded beats.
  if (!beating_since_ || now - last_recorded_ > timeout_) beating_since_ = now;
  last_recorded_ = now;
  if (!*alive) {
    // Another server took this one for dead (it was silent for longer than the timeout): its
    // idle sandboxes are gone, its turns were left alone (their turn locks held). Back in.
    spdlog::warn(
        "another server took this one for dead (no heartbeat for {} ms); recording it "
        "again",
        timeout_.count());
    if (auto entered = registry_.enter(self_); !entered) {
      spdlog::warn("recording this server again failed: {}", entered.error().message);
    }
    beating_since_ = now;  // silent for a while: so may the others have been
  }
  // After the database was out of reach, every server's heartbeat is old, not only a dead
  // one's: the others get a whole timeout to beat again before any is taken for dead (and its
  // sandboxes destroyed under its running turns).
  if (now - *beating_since_ < timeout_) return;
  if (auto taken = take_over_silent(); !taken) {
    spdlog::warn("taking over silent servers failed: {}", taken.error().message);
  }
}

Result<int> ServerHeartbeat::take_over_silent() {
  ASSIGN_OR_RETURN(auto servers, registry_.servers());
  int taken = 0;
  for (const auto& server : servers) {
    if (server.boot_id == self_.boot_id || server.silent_for <= timeout_) continue;
    ASSIGN_OR_RETURN(auto claim, registry_.claim(server.boot_id, timeout_));
    if (!claim) continue;  // another live server is taking it over
    ++taken;
    ASSIGN_OR_RETURN(int destroyed, manager_.take_over(server.boot_id));
    // Its turn locks died with its connections; turns of live servers hold theirs and stay.
    ASSIGN_OR_RETURN(auto interrupted, manager_.finish_interrupted_turns());
    for (const auto& [conversation_id, turn] : interrupted) {
      RETURN_IF_ERROR(
          hub_.end_interrupted(conversation_id, turn, conversation::kInterruptedReason));
    }
    spdlog::info(
        "took over server {} (instance {}, {}), silent for {} ms: destroyed {} of its "
        "sandboxes, {} turn{} recorded interrupted",
        server.boot_id, server.instance_id, server.url, server.silent_for.count(), destroyed,
        interrupted.size(), interrupted.size() == 1 ? "" : "s");
    RETURN_IF_ERROR(registry_.taken_over(*claim));
  }
  return taken;
}

}  // namespace quarry::server

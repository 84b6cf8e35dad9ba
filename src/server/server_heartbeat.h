// ServerHeartbeat: this server's place among the servers sharing a PostgreSQL history. It
// records the server, refreshes its heartbeat every sixth of conversations.server_timeout (at
// most every 5 s), and takes over any server silent for longer than the timeout: destroys the
// sandboxes of its run (found by their quarry.boot label) and records its running turns
// interrupted, as a server starting up does for its own instance. Of the live servers, the one
// whose claim succeeds does it, so it is done once; its record goes only when that is done, so
// a takeover cut short (the claimer died) is claimed and finished by another. A server takes
// over none until its own beats have been recorded for a whole timeout (after it started, and
// after the registry could not be reached), so the live servers have beaten again by then.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <thread>

#include "conversation/conversation_manager.h"
#include "conversation/server_registry.h"
#include "server/stream_hub.h"

namespace quarry::server {

class ServerHeartbeat {
 public:
  ServerHeartbeat(conversation::ServerRegistry& registry,
                  conversation::ConversationManager& manager, StreamHub& hub,
                  conversation::ServerRecord self, std::chrono::milliseconds timeout);
  // Stops the heartbeat without leaving: a server that ends without leave() is taken over.
  ~ServerHeartbeat();
  ServerHeartbeat(const ServerHeartbeat&) = delete;
  ServerHeartbeat& operator=(const ServerHeartbeat&) = delete;

  // Records the server and starts the heartbeat.
  Result<void> start();
  // A normal shutdown, once this run's sandboxes are gone: stops and removes the record.
  void leave();

  // Takes over every server silent for longer than the timeout, once. Returns how many.
  Result<int> take_over_silent();

 private:
  void stop();
  void beat();

  conversation::ServerRegistry& registry_;
  conversation::ConversationManager& manager_;
  StreamHub& hub_;
  const conversation::ServerRecord self_;
  const std::chrono::milliseconds timeout_;
  const std::chrono::milliseconds interval_;
  std::mutex mutex_;
  std::condition_variable stop_;
  bool stopping_ = false;
  std::thread thread_;
  // Since when every beat has been recorded, each within a timeout of the one before (none while
  // the registry cannot be reached), and when the last was.
  std::optional<std::chrono::steady_clock::time_point> beating_since_;
  std::chrono::steady_clock::time_point last_recorded_;
};

}  // namespace quarry::server

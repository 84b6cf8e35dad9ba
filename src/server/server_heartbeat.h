// ServerHeartbeat: this server's place among the servers sharing a PostgreSQL history. It
// records the server, refreshes its heartbeat every sixth of conversations.server_timeout (at
// most every 5 s), and takes over any server silent for longer than the timeout: destroys the
// sandboxes of its run (found by their quarry.boot label) and records its running turns
// interrupted, as a server starting up does for its own instance. Of the live servers, the one
// whose claim succeeds does it, so it is done once; its record goes only when that is done, so
// a takeover cut short (the claimer died) is claimed and finished by another.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
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
};

}  // namespace quarry::server

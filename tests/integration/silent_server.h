// A server on loopback that takes connections and never answers: a package index (or any HTTP
// service) that hangs, for what a client stuck on it does when it is told to stop.
#pragma once

#include <chrono>
#include <string>

#include "common/unique_fd.h"

namespace quarry::testing {

class SilentServer {
 public:
  SilentServer();  // fails the test if it cannot listen
  // http://127.0.0.1:<port><path>
  std::string url(const std::string& path) const;
  // The next connection within `timeout` (invalid if none came).
  UniqueFd accept(std::chrono::milliseconds timeout);
  // Whether the client closes `connection` within `timeout` (what it sent is read and dropped).
  static bool closed_within(const UniqueFd& connection, std::chrono::milliseconds timeout);

 private:
  UniqueFd listener_;
  int port_ = 0;
};

}  // namespace quarry::testing

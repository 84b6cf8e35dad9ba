// quarry-proxy's server: the HTTP proxy a sandbox with `network.mode: allowlist` reaches at
// 127.0.0.1:3128 of its own network namespace, and the only way out of it.
//
// It takes CONNECT host:port (any TLS, checked again on the ClientHello's server name) and
// absolute-form http:// requests (one per connection), lets through the host names the
// allowlist has, resolves them itself (the sandbox has no DNS) and connects from the host's
// network namespace, never to a loopback, link-local, multicast or unspecified address. Every
// refusal is answered (403 with the reason), logged, counted and kept in a short ring that the
// host reads over the control socket, which is how a command's denied connections are told with
// its metering:
//
//   host -> proxy   {"since": N}\n
//   proxy -> host   {"allowed": A, "denied": D, "seq": S, "denials": [{"seq", "at_ms", "host",
//                    "port", "reason"}, ...]}\n      (the denials after N still in the ring)
#pragma once

#include <boost/asio/io_context.hpp>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace quarry::sandbox::local::proxy {

struct ProxyOptions {
  std::vector<std::string> allow;  // canonical entries (config/allowlist.h)
  int listen_fd = -1;              // a listening TCP socket in the sandbox's namespace
  int control_fd = -1;             // a listening unix socket for the host
  size_t max_connections = 128;    // clients at once; more are refused
};

// Runs on `io` (one thread) until the io_context is stopped.
class Proxy {
 public:
  Proxy(boost::asio::io_context& io, ProxyOptions options);
  ~Proxy();
  void start();

 private:
  struct State;
  std::shared_ptr<State> state_;
};

}  // namespace quarry::sandbox::local::proxy

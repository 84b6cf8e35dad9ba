// HTTP/1.1 for the API (Boost.Beast, C++20 coroutines on one I/O thread): reads requests with
// limits on headers, bodies and time, checks who is asking, hands the request to the Api on a
// pool for blocking work, and writes JSON, artifact files or Server-Sent Events. Every request
// is logged as one JSON line (method, path, status, bytes, duration, user; never a token or a
// query value that could hold one).
#pragma once

#include <spdlog/logger.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "server/api.h"
#include "server/asio.h"
#include "server/auth.h"
#include "server/daytona/daytona_api.h"
#include "server/stream_hub.h"

namespace quarry::server {

struct HttpServerOptions {
  uint64_t max_body = 1 << 20;
  // The body of a signed-in client's upload through the Daytona-compatible API may be this large.
  uint64_t max_file_transfer = 256 << 20;
  std::chrono::seconds keep_alive{15};     // a comment line on idle streams this often
  std::chrono::seconds read_timeout{60};   // a request's header (idle keep-alive too), and
                                           // each piece of its body
  std::chrono::seconds write_timeout{30};  // each piece of an answer: a client that stopped
                                           // reading
  size_t blocking_threads = 4;             // the pool the handlers run on
  // The pool of the Daytona-compatible API's handlers, whose commands may run for minutes: they
  // never hold up the rest of the API.
  size_t daytona_threads = 8;
};

// What the access log needs to know of a response sent, and whether the connection goes on.
struct Sent {
  int status = 0;
  uint64_t bytes = 0;
  bool keep_alive = true;
};

class HttpServer {
 public:
  // `daytona` null: the /daytona paths are not served.
  HttpServer(net::io_context& io, Api& api, daytona::DaytonaApi* daytona, Authenticator& auth,
             StreamHub& hub, HttpServerOptions options);
  ~HttpServer();

  // Binds and listens; returns the address (its port, when 0 was asked for).
  Result<tcp::endpoint> listen(const tcp::endpoint& endpoint);
  void start();
  // Shutdown: no new connections; requests on open ones get 503.
  void stop_accepting();
  // Shutdown: waits up to `limit` for the requests taken before it to be answered (a slow
  // handler, a file still being sent); returns how many were not. Not from the I/O thread.
  int wait_for_requests(std::chrono::milliseconds limit);
  // Waits for handlers still on the pool.
  void join();

 private:
  net::awaitable<void> accept_loop();
  net::awaitable<void> session(tcp::socket socket);
  net::awaitable<Sent> send_file(beast::tcp_stream& stream, const FileReply& file, bool keep_alive,
                                 bool head);
  // Server-Sent Events: the conversation's events from plan.after on.
  net::awaitable<Sent> send_events(beast::tcp_stream& stream, const StreamReply& plan,
                                   bool keep_alive);
  // Runs `work` on the pool for blocking work and resumes on the I/O thread with its result.
  template <typename Work>
  net::awaitable<std::invoke_result_t<Work>> on_pool(Work work) {
    return on(pool_, std::move(work));
  }
  // The same on another pool.
  template <typename Work>
  net::awaitable<std::invoke_result_t<Work>> on(net::thread_pool& pool, Work work) {
    using Value = std::invoke_result_t<Work>;
    co_return co_await net::co_spawn(
        pool, [work = std::move(work)]() mutable -> net::awaitable<Value> { co_return work(); },
        net::use_awaitable);
  }

  net::io_context& io_;
  Api& api_;
  daytona::DaytonaApi* daytona_;
  Authenticator& auth_;
  StreamHub& hub_;
  HttpServerOptions options_;
  tcp::acceptor acceptor_;
  net::thread_pool pool_;
  net::thread_pool daytona_pool_;
  std::atomic<bool> stopping_{false};
  // Requests being handled or answered (not event streams, which shutdown ends): shutdown lets
  // them finish before the I/O loop stops. Shared with each request's coroutine: one still
  // pending when the loop stops is destroyed with the io_context, after this server.
  class InFlight;
  struct InFlightCount {
    std::mutex mutex;
    std::condition_variable changed;
    int count = 0;
  };
  std::shared_ptr<InFlightCount> in_flight_ = std::make_shared<InFlightCount>();
  std::shared_ptr<spdlog::logger> access_log_;
};

// The parameters of a query as the access log shows them ("limit=1&token=[redacted]"): the
// values of the API's own parameters; any other value redacted, and any name that is not a
// plain word (a secret pasted as a name, ?qry_...).
std::string loggable_query(const std::map<std::string, std::string, std::less<>>& query);

// "host:port" (IPv6 in brackets) into an endpoint; the host must be an address.
Result<tcp::endpoint> parse_listen_address(std::string_view text);

}  // namespace quarry::server

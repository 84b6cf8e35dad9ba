#include "server/http_server.h"

#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <variant>

#include "conversation/history_json.h"
#include "server/router.h"

namespace quarry::server {
namespace {

using Request = http::request<http::string_body>;

void common_headers(http::header<false>& header) {
  header.set(http::field::server, "quarry");
  header.set(http::field::cache_control, "no-store");
  header.set("X-Content-Type-Options", "nosniff");
  header.set("Referrer-Policy", "no-referrer");
}

bool changes_state(http::verb method) {
  return method == http::verb::post || method == http::verb::put || method == http::verb::patch ||
         method == http::verb::delete_;
}

// Writes a whole response with the headers every answer has; to a HEAD request, the headers
// alone (with the length the body would have). `timeout` is for each piece: a large file to a
// slow client goes on as long as the client keeps reading.
template <typename Body>
net::awaitable<Sent> write_response(beast::tcp_stream& stream, http::response<Body>& response,
                                    std::chrono::seconds timeout, bool head = false) {
  common_headers(response.base());
  response.prepare_payload();
  Sent sent{static_cast<int>(response.result_int()), 0, response.keep_alive()};
  boost::system::error_code error;
  stream.expires_after(timeout);
  if (head) {
    http::response_serializer<Body> serializer{response};
    sent.bytes = co_await http::async_write_header(stream, serializer,
                                                   net::redirect_error(net::use_awaitable, error));
  } else {
    http::response_serializer<Body> serializer{response};
    while (!error && !serializer.is_done()) {
      stream.expires_after(timeout);
      sent.bytes += co_await http::async_write_some(stream, serializer,
                                                    net::redirect_error(net::use_awaitable, error));
    }
  }
  if (error) sent.keep_alive = false;
  co_return sent;
}

// `body` null: no body (204).
net::awaitable<Sent> write_json(beast::tcp_stream& stream, int status, const nlohmann::json& body,
                                const Headers& headers, bool keep_alive,
                                std::chrono::seconds timeout, bool head = false) {
  http::response<http::string_body> response{static_cast<http::status>(status), 11};
  response.keep_alive(keep_alive);
  for (const auto& [name, value] : headers)
    response.insert(name, value);
  if (!body.is_null()) {
    response.set(http::field::content_type, "application/json");
    response.body() = body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }
  co_return co_await write_response(stream, response, timeout, head);
}

// An error in the shape its path's API has: quarry's {"error": {code, message}}, or Daytona's
// under /daytona.
net::awaitable<Sent> write_error(beast::tcp_stream& stream, const ApiError& failure,
                                 bool keep_alive, const Headers& headers,
                                 std::chrono::seconds timeout, std::string_view method = {},
                                 std::string_view path = {}, bool head = false) {
  const nlohmann::json body =
      daytona::is_daytona_path(path) ? daytona::error_body(failure, method, path) : failure.body();
  co_return co_await write_json(stream, failure.status, body, headers, keep_alive, timeout, head);
}

net::awaitable<Sent> write_bytes(beast::tcp_stream& stream, const BytesReply& reply,
                                 bool keep_alive, std::chrono::seconds timeout, bool head) {
  http::response<http::string_body> response{static_cast<http::status>(reply.status), 11};
  response.keep_alive(keep_alive);
  for (const auto& [name, value] : reply.headers)
    response.insert(name, value);
  response.set(http::field::content_type, reply.content_type);
  response.body() = reply.body;
  co_return co_await write_response(stream, response, timeout, head);
}

// Closing a socket with unread bytes makes the kernel reset the connection, and a client still
// sending its body may lose the answer it was about to read. So: stop sending, then read and
// drop what still comes, for a little while (as nginx's lingering close does).
net::awaitable<void> linger(beast::tcp_stream& stream) {
  boost::system::error_code error;
  stream.socket().shutdown(tcp::socket::shutdown_send, error);
  stream.expires_after(std::chrono::seconds(2));
  char scratch[16384];
  while (!error) {
    co_await stream.async_read_some(net::buffer(scratch),
                                    net::redirect_error(net::use_awaitable, error));
  }
}

}  // namespace

// Only the values of the API's own parameters are written: a secret pasted into a query string
// can come under any name (?token=, ?Access_Token=, ?apikey=, ?sig=), and a route answers an
// unknown parameter with 400 only after the request is logged.
std::string loggable_query(const std::map<std::string, std::string, std::less<>>& query) {
  auto plain_word = [](std::string_view name) {
    return !name.empty() && name.size() <= 32 && std::all_of(name.begin(), name.end(), [](char c) {
      return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == '-';
    });
  };
  std::string text;
  for (const auto& [name, value] : query) {
    if (!text.empty()) text += '&';
    const auto logged = query_parameters();
    const bool known = std::find(logged.begin(), logged.end(), name) != logged.end();
    text +=
        fmt::format("{}={}", plain_word(name) ? name : "[redacted]", known ? value : "[redacted]");
  }
  return text;
}

Result<tcp::endpoint> parse_listen_address(std::string_view text) {
  auto colon = text.rfind(':');
  if (colon == std::string_view::npos || colon + 1 == text.size()) {
    return make_error(ErrorCode::kInvalidArgument,
                      "'{}' is not an address to listen on; write host:port, e.g. "
                      "127.0.0.1:8080 or [::1]:8080",
                      text);
  }
  std::string host(text.substr(0, colon));
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  if (host == "localhost") host = "127.0.0.1";
  uint16_t port = 0;
  auto digits = text.substr(colon + 1);
  auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), port);
  if (error != std::errc() || end != digits.data() + digits.size()) {
    return make_error(ErrorCode::kInvalidArgument, "'{}' is not a port (0 to 65535)", digits);
  }
  boost::system::error_code bad;
  auto address = net::ip::make_address(host, bad);
  if (bad) {
    return make_error(ErrorCode::kInvalidArgument,
                      "'{}' is not an IP address to listen on (use 127.0.0.1, 0.0.0.0, ::1, ...)",
                      host);
  }
  return tcp::endpoint(address, port);
}

HttpServer::HttpServer(net::io_context& io, Api& api, daytona::DaytonaApi* daytona,
                       Authenticator& auth, StreamHub& hub, HttpServerOptions options)
    : io_(io),
      api_(api),
      daytona_(daytona),
      auth_(auth),
      hub_(hub),
      options_(options),
      acceptor_(io),
      pool_(options.blocking_threads),
      daytona_pool_(options.daytona_threads),
      access_log_(spdlog::get("access")) {
  if (!access_log_) {
    // One JSON object a line, on stderr beside the server's other messages.
    access_log_ = spdlog::stderr_logger_mt("access");
    access_log_->set_pattern("%v");
  }
  // --log-level warn (or above) silences it with the rest.
  access_log_->set_level(spdlog::default_logger()->level());
}

HttpServer::~HttpServer() {
  join();
}

Result<tcp::endpoint> HttpServer::listen(const tcp::endpoint& endpoint) {
  boost::system::error_code error;
  acceptor_.open(endpoint.protocol(), error);
  if (!error) acceptor_.set_option(net::socket_base::reuse_address(true), error);
  if (!error) acceptor_.bind(endpoint, error);
  if (!error) acceptor_.listen(net::socket_base::max_listen_connections, error);
  if (error) {
    return make_error(error == boost::system::errc::address_in_use ? ErrorCode::kAlreadyExists
                                                                   : ErrorCode::kUnavailable,
                      "cannot listen on {}:{}: {}{}", endpoint.address().to_string(),
                      endpoint.port(), error.message(),
                      error == boost::system::errc::address_in_use
                          ? " (another program uses the port; stop it or choose another with "
                            "--listen)"
                          : "");
  }
  return acceptor_.local_endpoint();
}

void HttpServer::start() {
  net::co_spawn(io_, accept_loop(), net::detached);
}

void HttpServer::stop_accepting() {
  stopping_ = true;
  net::post(io_, [this] {
    boost::system::error_code ignored;
    acceptor_.close(ignored);
  });
}

class HttpServer::InFlight {
 public:
  explicit InFlight(std::shared_ptr<InFlightCount> counted) : counted_(std::move(counted)) {
    std::lock_guard lock(counted_->mutex);
    ++counted_->count;
  }
  ~InFlight() { release(); }
  InFlight(const InFlight&) = delete;
  InFlight& operator=(const InFlight&) = delete;
  void release() {
    if (!counted_) return;
    {
      std::lock_guard lock(counted_->mutex);
      --counted_->count;
    }
    counted_->changed.notify_all();
    counted_.reset();
  }

 private:
  std::shared_ptr<InFlightCount> counted_;
};

int HttpServer::wait_for_requests(std::chrono::milliseconds limit) {
  std::unique_lock lock(in_flight_->mutex);
  in_flight_->changed.wait_for(lock, limit, [this] { return in_flight_->count == 0; });
  return in_flight_->count;
}

void HttpServer::join() {
  pool_.join();
  daytona_pool_.join();
}

net::awaitable<void> HttpServer::accept_loop() {
  for (;;) {
    boost::system::error_code error;
    tcp::socket socket =
        co_await acceptor_.async_accept(net::redirect_error(net::use_awaitable, error));
    if (error) {
      if (!acceptor_.is_open()) co_return;
      // Out of descriptors or the like: the next connection may work.
      spdlog::warn("accepting a connection failed: {}", error.message());
      continue;
    }
    net::co_spawn(io_, session(std::move(socket)), net::detached);
  }
}

net::awaitable<void> HttpServer::session(tcp::socket socket) {
  beast::tcp_stream stream(std::move(socket));
  beast::flat_buffer buffer;
  boost::system::error_code error;

  const auto timeout = options_.write_timeout;
  // Named, not temporaries in co_await expressions: GCC 12 may destroy such a temporary twice.
  const Headers no_headers;
  const uint64_t largest = std::max(options_.max_body, options_.max_file_transfer);
  for (;;) {
    http::request_parser<http::string_body> parser;
    parser.header_limit(16 * 1024);
    // The largest body any route takes; once the header says which route, its own limit.
    parser.body_limit(largest);
    stream.expires_after(options_.read_timeout);
    co_await http::async_read_header(stream, buffer, parser,
                                     net::redirect_error(net::use_awaitable, error));
    const auto started = std::chrono::steady_clock::now();
    if (error == http::error::end_of_stream || error == beast::error::timeout ||
        error == net::error::connection_reset || error == net::error::eof) {
      break;
    }
    if (error && error != http::error::body_limit) {
      const ApiError malformed{
          400, "bad_request",
          fmt::format("the request is not valid HTTP/1.1: {}", error.message())};
      co_await write_error(stream, malformed, false, no_headers, timeout);
      break;
    }
    // The header is read. Uploads through the Daytona-compatible API may be larger, for a client
    // who signed in (no one else makes the server hold that much).
    const std::string header_method(to_std(parser.get().method_string()));
    const std::string_view full_target = to_std(parser.get().target());
    const std::string header_path(full_target.substr(0, full_target.find('?')));
    const bool upload = daytona_ && daytona::is_upload_path(header_path) &&
                        auth_.authenticate({to_std(parser.get()[http::field::authorization]),
                                            to_std(parser.get()[http::field::cookie])});
    const uint64_t limit = upload ? options_.max_file_transfer : options_.max_body;
    const ApiError too_large{
        413, "body_too_large",
        fmt::format("the body is larger than the server's limit of {} bytes ({})", limit,
                    upload ? "server.max_file_transfer" : "server.max_body")};
    if (error == http::error::body_limit || parser.content_length().value_or(0) > limit) {
      co_await write_error(stream, too_large, false, no_headers, timeout, header_method,
                           header_path);
      co_await linger(stream);
      break;
    }
    parser.body_limit(limit);  // a chunked body is counted as it comes
    if (beast::iequals(parser.get()[http::field::expect], "100-continue")) {
      http::response<http::empty_body> proceed{http::status::continue_, 11};
      co_await http::async_write(stream, proceed, net::redirect_error(net::use_awaitable, error));
      if (error) break;
    }
    // The body in pieces, each within the read timeout: a large upload over a slow link goes
    // on as long as it keeps coming.
    while (!error && !parser.is_done()) {
      stream.expires_after(options_.read_timeout);
      co_await http::async_read_some(stream, buffer, parser,
                                     net::redirect_error(net::use_awaitable, error));
    }
    if (error == http::error::body_limit) {
      co_await write_error(stream, too_large, false, no_headers, timeout, header_method,
                           header_path);
      co_await linger(stream);
      break;
    }
    if (error) break;
    Request request = parser.release();
    const bool keep_alive = request.keep_alive() && !stopping_;
    // HEAD is GET without the body.
    const bool head = request.method() == http::verb::head;
    const std::string method = head ? "GET" : std::string(request.method_string());
    const std::string target(request.target());
    const std::string path = target.substr(0, target.find('?'));
    ApiRequest api_request;
    api_request.method = method;
    api_request.path = path;
    api_request.host = std::string(request[http::field::host]);
    // The Daytona-compatible API has a router and error shape of its own.
    const bool daytona = daytona_ && daytona::is_daytona_path(path);
    std::string user = "-";
    std::string allow;  // the methods of a path asked with another
    Sent sent;

    // Everything before the handler: parse, route, who, and may they.
    auto prepare = [&]() -> ApiResult<void> {
      if (stopping_) {
        return api_error(503, "shutting_down",
                         "the server is shutting down; send the request again when it is back");
      }
      if (auto question = target.find('?'); question != std::string::npos) {
        auto list = parse_query_list(std::string_view(target).substr(question + 1));
        if (!list) return std::unexpected(list.error());
        api_request.query = query_map(*list);
        api_request.query_list = std::move(*list);
      }
      if (!daytona) {
        auto route = match_route(method, path, &allow);
        if (!route) return std::unexpected(route.error());
        api_request.route = std::move(*route);
      }
      const RequestOrigin origin{to_std(request[http::field::host]),
                                 to_std(request[http::field::origin]),
                                 to_std(request[to_beast(kCsrfHeader)])};
      if (auto checked = auth_.check_origin(origin); !checked) return checked;
      const Credentials credentials{to_std(request[http::field::authorization]),
                                    to_std(request[http::field::cookie])};
      if (!daytona && api_request.route.route->public_route) {
        // Answered to anyone; a caller who signs in anyway may be told more (/readyz).
        if (auto identity = auth_.authenticate(credentials)) {
          api_request.identity = std::move(*identity);
          user = api_request.identity.user;
        }
      } else {
        auto identity = auth_.authenticate(credentials);
        if (!identity) return std::unexpected(identity.error());
        api_request.identity = std::move(*identity);
        user = api_request.identity.user;
        if (changes_state(request.method())) {
          if (auto checked = auth_.check_change(api_request.identity, origin); !checked) {
            return checked;
          }
        }
      }
      api_request.body = std::move(request.body());
      api_request.content_type = std::string(request[http::field::content_type]);
      api_request.last_event_id = std::string(request["Last-Event-ID"]);
      return {};
    };

    if (stopping_ && method == "GET" && path == "/readyz") {
      // A probe on a connection kept from before: not ready, in the shape /readyz always has.
      const nlohmann::json not_ready = {
          {"status", "unavailable"},
          {"reason", "the server is shutting down"},
          {"checks", {{"server", "shutting down: it accepts no new connections or requests"}}}};
      sent = co_await write_json(stream, 503, not_ready, no_headers, false, timeout, head);
    } else if (auto prepared = prepare(); !prepared) {
      Headers headers;
      if (prepared.error().status == 401) {
        headers.emplace_back("WWW-Authenticate", kBearerChallenge);
      }
      if (prepared.error().status == 405) headers.emplace_back("Allow", allow);
      sent = co_await write_error(stream, prepared.error(), keep_alive, headers, timeout, method,
                                  path, head);
    } else {
      InFlight in_flight(in_flight_);
      ApiReply reply;
      if (daytona) {
        reply = co_await on(daytona_pool_, [&] { return daytona_->handle(api_request); });
      } else {
        reply = co_await on_pool([&] { return api_.handle(api_request); });
      }
      if (auto* json = std::get_if<JsonReply>(&reply)) {
        sent = co_await write_json(stream, json->status, json->body, json->headers, keep_alive,
                                   timeout, head);
      } else if (auto* file = std::get_if<FileReply>(&reply)) {
        sent = co_await send_file(stream, *file, keep_alive, head);
      } else if (auto* bytes = std::get_if<BytesReply>(&reply)) {
        sent = co_await write_bytes(stream, *bytes, keep_alive, timeout, head);
      } else if (head) {
        const nlohmann::json nothing;
        sent = co_await write_json(stream, 200, nothing, no_headers, keep_alive, timeout, head);
      } else {
        in_flight.release();  // a stream runs until its turn ends, or shutdown ends it
        sent = co_await send_events(stream, std::get<StreamReply>(reply), keep_alive);
      }
    }

    const auto elapsed =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started)
            .count();
    nlohmann::json line = {{"time", conversation::format_time(std::chrono::system_clock::now())},
                           {"method", method},
                           {"path", path},
                           {"status", sent.status},
                           {"bytes", sent.bytes},
                           {"duration_ms", std::round(elapsed * 1000) / 1000},
                           {"user", user}};
    if (!api_request.query.empty()) line["query"] = loggable_query(api_request.query);
    access_log_->info(line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
    if (!sent.keep_alive || !keep_alive) break;
  }
  stream.socket().shutdown(tcp::socket::shutdown_send, error);
}

net::awaitable<Sent> HttpServer::send_file(beast::tcp_stream& stream, const FileReply& file,
                                           bool keep_alive, bool head) {
  http::response<http::file_body> response{http::status::ok, 11};
  response.keep_alive(keep_alive);
  boost::system::error_code error;
  response.body().open(file.path.c_str(), beast::file_mode::scan, error);
  if (error) {
    const ApiError unreadable{404, "not_found", "the file cannot be read"};
    const Headers none;
    co_return co_await write_error(stream, unreadable, keep_alive, none, options_.write_timeout, {},
                                   {}, head);
  }
  response.set(http::field::content_type, file.content_type);
  for (const auto& [name, value] : file.headers)
    response.set(name, value);
  co_return co_await write_response(stream, response, options_.write_timeout, head);
}

net::awaitable<Sent> HttpServer::send_events(beast::tcp_stream& stream, const StreamReply& plan,
                                             bool keep_alive) {
  http::response<http::empty_body> head{http::status::ok, 11};
  head.keep_alive(keep_alive && !plan.follow);
  head.set(http::field::content_type, "text/event-stream; charset=utf-8");
  head.set("X-Accel-Buffering", "no");
  common_headers(head.base());
  head.chunked(true);
  http::response_serializer<http::empty_body> serializer{head};
  boost::system::error_code error;
  stream.expires_after(options_.write_timeout);
  co_await http::async_write_header(stream, serializer,
                                    net::redirect_error(net::use_awaitable, error));
  Sent sent{200, 0, head.keep_alive()};
  auto send = [&](const std::string& text) -> net::awaitable<bool> {
    stream.expires_after(options_.write_timeout);
    sent.bytes += co_await net::async_write(stream, http::make_chunk(net::buffer(text)),
                                            net::redirect_error(net::use_awaitable, error));
    co_return !error;
  };
  const std::string retry = "retry: 2000\n\n";
  const std::string keep_alive_comment = ": keep-alive\n\n";
  bool open = !error && co_await send(retry);
  EventId position = plan.after;
  auto timer = std::make_shared<net::steady_timer>(io_);
  auto watch = hub_.watch(plan.conversation_id);
  while (open) {
    auto batch = co_await on_pool([&] { return hub_.next(plan.conversation_id, position); });
    if (!batch) {
      spdlog::warn("conversation {}: reading its events failed: {}", plan.conversation_id,
                   batch.error().message);
      break;
    }
    position = batch->position;
    if (!batch->events.empty()) {
      std::string frames;
      bool ended = false;
      for (const auto& event : batch->events) {
        frames += sse_frame(event);
        // A turn's own stream ends with its "done" (a later turn read with it from the history
        // is not sent); a follower's goes on.
        ended = !plan.follow && event.type == "done" && event.turn == plan.after.turn;
        if (ended) break;
      }
      open = co_await send(frames);
      if (ended) break;
      continue;
    }
    if (hub_.closing()) break;
    timer->expires_after(options_.keep_alive);
    if (!hub_.arm(plan.conversation_id, position, timer)) continue;
    boost::system::error_code waited;
    co_await timer->async_wait(net::redirect_error(net::use_awaitable, waited));
    hub_.disarm(plan.conversation_id, timer);
    if (!waited) open = co_await send(keep_alive_comment);  // it expired: nothing new
  }
  if (open) {
    stream.expires_after(options_.write_timeout);
    co_await net::async_write(stream, http::make_chunk_last(),
                              net::redirect_error(net::use_awaitable, error));
  }
  sent.keep_alive = sent.keep_alive && open && !error;
  co_return sent;
}

}  // namespace quarry::server

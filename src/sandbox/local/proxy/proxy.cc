// quarry-proxy's server: Asio on C++20 coroutines, one thread (and the resolver's).
#include "sandbox/local/proxy/proxy.h"

#include <spdlog/spdlog.h>

#include <array>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/read_until.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http.hpp>
#include <charconv>
#include <chrono>
#include <deque>
#include <nlohmann/json.hpp>
#include <optional>

#include "common/url.h"
#include "config/allowlist.h"
#include "sandbox/local/proxy/client_hello.h"

namespace quarry::sandbox::local::proxy {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using unix_socket = net::local::stream_protocol;
using boost::system::error_code;
using namespace std::chrono_literals;

constexpr auto kHeaderTimeout = 30s;
constexpr auto kConnectTimeout = 10s;
constexpr auto kIdleTimeout = 10min;  // a tunnel with no bytes either way for this long ends
constexpr size_t kHeaderLimit = 16 * 1024;
constexpr size_t kRingSize = 64;
constexpr int kLogLinesPerMinute = 120;

struct Denial {
  uint64_t seq = 0;
  int64_t at_ms = 0;
  std::string host;
  uint16_t port = 0;
  std::string reason;
};

// Where a client asked to go.
struct Destination {
  std::string host;  // as the client wrote it
  uint16_t port = 0;
};

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// What a sandbox sent, fit for a log line and a message: anything but printable ASCII becomes
// '?' (a server name from a ClientHello, or a CONNECT's, may be any bytes; a name is ASCII).
std::string printable(std::string_view text) {
  std::string out(text.substr(0, 300));
  for (char& c : out) {
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f) c = '?';
  }
  return out;
}

// "host:port" of a CONNECT, an IPv6 address in brackets.
std::optional<Destination> parse_authority(std::string_view authority) {
  size_t colon = authority.rfind(':');
  if (colon == std::string_view::npos || colon == 0) return std::nullopt;
  std::string_view host = authority.substr(0, colon);
  std::string_view port_text = authority.substr(colon + 1);
  unsigned port = 0;
  auto [end, error] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (error != std::errc() || end != port_text.data() + port_text.size() || port == 0 ||
      port > 65535) {
    return std::nullopt;
  }
  return Destination{std::string(host), static_cast<uint16_t>(port)};
}

// Why the proxy never connects to `address`, or empty. These are the host's own and its link's:
// an allowed name that resolves to one is a way into the host, not out of it.
std::string forbidden_address(net::ip::address address) {
  if (address.is_v6() && address.to_v6().is_v4_mapped()) {
    address = net::ip::make_address_v4(net::ip::v4_mapped, address.to_v6());
  }
  if (address.is_loopback()) return "a loopback address";
  if (address.is_unspecified()) return "an unspecified address";
  if (address.is_multicast()) return "a multicast address";
  if (address.is_v4()) {
    const auto bytes = address.to_v4().to_bytes();
    if (bytes[0] == 169 && bytes[1] == 254) return "a link-local address";
    if (bytes[0] == 0) return "an address of 0.0.0.0/8";
    if (address.to_v4() == net::ip::address_v4::broadcast()) return "the broadcast address";
  } else if (address.to_v6().is_link_local()) {
    return "a link-local address";
  }
  return "";
}

}  // namespace

struct Proxy::State : std::enable_shared_from_this<State> {
  State(net::io_context& io_context, ProxyOptions proxy_options)
      : io(io_context),
        options(std::move(proxy_options)),
        clients(io, tcp::v4(), options.listen_fd),
        control(io, unix_socket(), options.control_fd),
        resolver(io) {}

  net::io_context& io;
  ProxyOptions options;
  tcp::acceptor clients;
  unix_socket::acceptor control;
  tcp::resolver resolver;
  size_t connections = 0;
  uint64_t allowed = 0;
  uint64_t denied = 0;
  uint64_t seq = 0;
  std::deque<Denial> ring;
  // Log lines are bounded per minute, so code that tries a million names cannot fill the disk.
  std::chrono::steady_clock::time_point log_window{};
  int logged = 0;
  uint64_t unlogged = 0;

  template <typename... Args>
  void log(fmt::format_string<Args...> format, Args&&... args) {
    const auto now = std::chrono::steady_clock::now();
    if (now - log_window >= 1min) {
      if (unlogged > 0) spdlog::info("{} more connections in the last minute not logged", unlogged);
      log_window = now;
      logged = 0;
      unlogged = 0;
    }
    if (logged++ < kLogLinesPerMinute) {
      spdlog::info(format, std::forward<Args>(args)...);
    } else {
      ++unlogged;
    }
  }

  void deny(const Destination& to, std::string reason) {
    ++denied;
    const std::string host = printable(to.host);
    reason = printable(reason);
    log("denied {}:{}: {}", host, to.port, reason);
    ring.push_back({++seq, now_ms(), host, to.port, std::move(reason)});
    if (ring.size() > kRingSize) ring.pop_front();
  }

  void accept() {
    net::co_spawn(io, accept_clients(shared_from_this()), net::detached);
    net::co_spawn(io, accept_control(shared_from_this()), net::detached);
  }

  static net::awaitable<void> accept_clients(std::shared_ptr<State> self) {
    for (;;) {
      error_code error;
      tcp::socket client =
          co_await self->clients.async_accept(net::redirect_error(net::use_awaitable, error));
      if (error == net::error::operation_aborted) co_return;
      if (error) {
        // EMFILE and the like: wait rather than spin.
        spdlog::warn("accept: {}", error.message());
        net::steady_timer pause(self->io, 100ms);
        co_await pause.async_wait(net::redirect_error(net::use_awaitable, error));
        continue;
      }
      if (self->connections >= self->options.max_connections) {
        self->log("refused a connection: {} are open already", self->connections);
        continue;  // closed as it goes out of scope
      }
      net::co_spawn(self->io, serve(self, std::move(client)), net::detached);
    }
  }

  // One client: its request, then a tunnel or a forwarded request.
  static net::awaitable<void> serve(std::shared_ptr<State> self, tcp::socket socket) {
    ++self->connections;
    struct Count {
      State& state;
      ~Count() { --state.connections; }
    } count{*self};

    beast::tcp_stream client(std::move(socket));
    beast::flat_buffer buffer;
    http::request_parser<http::empty_body> parser;
    parser.header_limit(kHeaderLimit);
    error_code error;
    client.expires_after(kHeaderTimeout);
    co_await http::async_read_header(client, buffer, parser,
                                     net::redirect_error(net::use_awaitable, error));
    if (error) co_return;
    auto& request = parser.get();
    const std::string_view target(request.target().data(), request.target().size());

    Destination to;
    std::string origin_target;  // for a forwarded http:// request
    const bool tunnel = request.method() == http::verb::connect;
    if (tunnel) {
      auto parsed = parse_authority(target);
      if (!parsed) {
        co_await reply(client, http::status::bad_request,
                       fmt::format("CONNECT takes host:port, not '{}'\n", target));
        co_return;
      }
      to = *parsed;
    } else {
      constexpr std::string_view kScheme = "http://";
      auto url = target.starts_with(kScheme)
                     ? parse_url(target)
                     : make_error(ErrorCode::kInvalidArgument, "not an http:// URL");
      if (!url) {
        co_await reply(client, http::status::bad_request,
                       "this is quarry's HTTP proxy: it takes CONNECT host:port and "
                       "http://host/path requests (set HTTP_PROXY and HTTPS_PROXY to it)\n");
        co_return;
      }
      to = {url->host, url->port};
      const size_t path = target.find_first_of("/?", kScheme.size());
      origin_target = path == std::string_view::npos ? "/" : std::string(target.substr(path));
      if (origin_target.front() == '?') origin_target.insert(0, "/");
    }

    auto upstream = co_await self->open(to);
    if (!upstream) {
      co_await reply(client, upstream.error().first, upstream.error().second + "\n");
      co_return;
    }

    if (tunnel) {
      http::response<http::empty_body> established{http::status::ok, request.version()};
      established.reason("Connection established");
      co_await http::async_write(client, established,
                                 net::redirect_error(net::use_awaitable, error));
      if (error) co_return;
      // A TLS client says which server it wants before anything reaches the server.
      auto checked = co_await self->check_server_name(client, buffer, to);
      if (!checked) co_return;
    } else {
      request.target(origin_target);
      request.set(http::field::host,
                  to.port == 80 ? to.host : fmt::format("{}:{}", to.host, to.port));
      request.erase(http::field::proxy_authorization);
      request.erase("Proxy-Connection");
      request.set(http::field::connection, "close");
      http::request_serializer<http::empty_body> head{request};
      upstream->expires_after(kConnectTimeout);
      co_await http::async_write_header(*upstream, head,
                                        net::redirect_error(net::use_awaitable, error));
      if (error) co_return;
    }
    // Whatever the client sent beyond its request head goes on first.
    if (buffer.size() > 0) {
      upstream->expires_after(kConnectTimeout);
      co_await net::async_write(*upstream, buffer.data(),
                                net::redirect_error(net::use_awaitable, error));
      if (error) co_return;
      buffer.consume(buffer.size());
    }
    co_await relay(self, client.release_socket(), upstream->release_socket());
  }

  // The host resolved and connected to, or the status and reason to answer with.
  net::awaitable<std::expected<beast::tcp_stream, std::pair<http::status, std::string>>> open(
      const Destination& to) {
    using Failure = std::pair<http::status, std::string>;
    auto host = canonical_host(to.host);
    if (!host) {
      const std::string reason = fmt::format(
          "{}: the sandbox may reach only names of its allowlist", host.error().message);
      deny(to, reason);
      co_return std::unexpected(Failure{http::status::forbidden, "quarry: " + reason});
    }
    if (!host_allowed(options.allow, *host)) {
      const std::string reason = fmt::format("{} is not in the sandbox's network allowlist", *host);
      deny(to, reason);
      co_return std::unexpected(
          Failure{http::status::forbidden, fmt::format("quarry: {} (sandbox.network.allow: {})",
                                                       reason, fmt::join(options.allow, ", "))});
    }
    error_code error;
    auto results = co_await resolver.async_resolve(*host, std::to_string(to.port),
                                                   net::redirect_error(net::use_awaitable, error));
    if (error) {
      log("could not resolve {}: {}", *host, error.message());
      co_return std::unexpected(
          Failure{http::status::bad_gateway,
                  fmt::format("quarry: {} does not resolve: {}", *host, error.message())});
    }
    std::vector<tcp::endpoint> endpoints;
    std::string refused;
    for (const auto& entry : results) {
      auto why = forbidden_address(entry.endpoint().address());
      if (why.empty()) {
        endpoints.push_back(entry.endpoint());
      } else if (refused.empty()) {
        refused = fmt::format("{} resolves to {}, {}", *host,
                              entry.endpoint().address().to_string(), why);
      }
    }
    if (endpoints.empty()) {
      deny(to, refused);
      co_return std::unexpected(Failure{http::status::forbidden, "quarry: " + refused});
    }
    beast::tcp_stream upstream(io);
    upstream.expires_after(kConnectTimeout);
    co_await upstream.async_connect(endpoints, net::redirect_error(net::use_awaitable, error));
    if (error) {
      log("could not connect to {}:{}: {}", *host, to.port, error.message());
      co_return std::unexpected(Failure{
          error == beast::error::timeout ? http::status::gateway_timeout
                                         : http::status::bad_gateway,
          fmt::format("quarry: could not connect to {}:{}: {}", *host, to.port, error.message())});
    }
    ++allowed;
    log("allowed {}:{}", *host, to.port);
    co_return upstream;
  }

  // Reads the start of what comes through a tunnel into `buffer`: true to go on, false when the
  // connection was refused (a TLS server name not in the allowlist, or a broken ClientHello).
  net::awaitable<bool> check_server_name(beast::tcp_stream& client, beast::flat_buffer& buffer,
                                         const Destination& to) {
    error_code error;
    for (;;) {
      auto data = buffer.data();
      auto hello =
          parse_client_hello(std::span(static_cast<const uint8_t*>(data.data()), data.size()));
      switch (hello.status) {
        case HelloStatus::kNotTls:
        case HelloStatus::kNoServerName:
          co_return true;
        case HelloStatus::kFound: {
          auto name = canonical_host(hello.server_name);
          if (name && host_allowed(options.allow, *name)) co_return true;
          deny(to,
               name ? fmt::format("the TLS server name {} is not in the sandbox's network "
                                  "allowlist",
                                  *name)
                    : fmt::format("the TLS server name is not allowed: {}", name.error().message));
          co_await tls_alert(client);
          co_return false;
        }
        case HelloStatus::kMalformed:
          deny(to, "a malformed TLS ClientHello");
          co_await tls_alert(client);
          co_return false;
        case HelloStatus::kNeedMore:
          break;
      }
      if (buffer.size() > kMaxClientHello + 1024) {
        deny(to, "a TLS ClientHello longer than 16 KiB");
        co_return false;
      }
      client.expires_after(kHeaderTimeout);
      auto room = buffer.prepare(4096);
      const size_t read =
          co_await client.async_read_some(room, net::redirect_error(net::use_awaitable, error));
      if (error) co_return false;
      buffer.commit(read);
    }
  }

  // A fatal access_denied alert, so the client's TLS library says what happened.
  static net::awaitable<void> tls_alert(beast::tcp_stream& client) {
    static constexpr std::array<uint8_t, 7> kAccessDenied = {0x15, 0x03, 0x03, 0x00,
                                                             0x02, 0x02, 0x31};
    error_code error;
    co_await net::async_write(client, net::buffer(kAccessDenied),
                              net::redirect_error(net::use_awaitable, error));
  }

  static net::awaitable<void> reply(beast::tcp_stream& client, http::status status,
                                    std::string text) {
    http::response<http::string_body> response{status, 11};
    response.set(http::field::content_type, "text/plain; charset=utf-8");
    response.set(http::field::connection, "close");
    response.body() = std::move(text);
    response.prepare_payload();
    error_code error;
    client.expires_after(kHeaderTimeout);
    co_await http::async_write(client, response, net::redirect_error(net::use_awaitable, error));
    client.socket().shutdown(tcp::socket::shutdown_send, error);
  }

  // Bytes both ways until both sides are done (each direction's end half-closes the other
  // side), either side fails, or nothing moved for kIdleTimeout.
  struct Tunnel {
    Tunnel(tcp::socket a, tcp::socket b) : client(std::move(a)), upstream(std::move(b)) {}
    tcp::socket client;
    tcp::socket upstream;
    std::chrono::steady_clock::time_point last = std::chrono::steady_clock::now();
    int open_directions = 2;
    bool failed = false;
    void close() {
      error_code ignored;
      client.close(ignored);
      upstream.close(ignored);
    }
  };

  static net::awaitable<void> pump(std::shared_ptr<Tunnel> tunnel, tcp::socket& from,
                                   tcp::socket& to) {
    std::array<char, 16 * 1024> chunk;
    error_code error;
    for (;;) {
      const size_t read = co_await from.async_read_some(
          net::buffer(chunk), net::redirect_error(net::use_awaitable, error));
      if (error) break;
      tunnel->last = std::chrono::steady_clock::now();
      co_await net::async_write(to, net::buffer(chunk.data(), read),
                                net::redirect_error(net::use_awaitable, error));
      if (error) break;
    }
    if (error != net::error::eof) tunnel->failed = true;
    error_code ignored;
    to.shutdown(tcp::socket::shutdown_send, ignored);
    if (--tunnel->open_directions == 0 || tunnel->failed) tunnel->close();
  }

  static net::awaitable<void> relay(std::shared_ptr<State> self, tcp::socket client,
                                    tcp::socket upstream) {
    auto tunnel = std::make_shared<Tunnel>(std::move(client), std::move(upstream));
    net::co_spawn(self->io, pump(tunnel, tunnel->client, tunnel->upstream), net::detached);
    net::co_spawn(self->io, pump(tunnel, tunnel->upstream, tunnel->client), net::detached);
    net::steady_timer watch(self->io);
    while (tunnel->open_directions > 0 && !tunnel->failed) {
      watch.expires_after(1s);
      error_code error;
      co_await watch.async_wait(net::redirect_error(net::use_awaitable, error));
      if (std::chrono::steady_clock::now() - tunnel->last > kIdleTimeout) tunnel->close();
    }
  }

  static net::awaitable<void> accept_control(std::shared_ptr<State> self) {
    for (;;) {
      error_code error;
      unix_socket::socket host =
          co_await self->control.async_accept(net::redirect_error(net::use_awaitable, error));
      if (error == net::error::operation_aborted) co_return;
      if (error) continue;
      net::co_spawn(self->io, answer(self, std::move(host)), net::detached);
    }
  }

  static net::awaitable<void> answer(std::shared_ptr<State> self, unix_socket::socket host) {
    std::string line;
    error_code error;
    net::steady_timer deadline(self->io, 2s);
    deadline.async_wait([&host](error_code cancelled) {
      if (!cancelled) host.close();
    });
    co_await net::async_read_until(host, net::dynamic_buffer(line, 256), '\n',
                                   net::redirect_error(net::use_awaitable, error));
    if (error) co_return;
    auto question = nlohmann::json::parse(line, nullptr, false);
    // The denials after `since`, the first `max` of them: what the host keeps of a command's.
    uint64_t since = 0;
    uint64_t max = kRingSize;
    if (question.is_object() && question.value("since", nlohmann::json()).is_number_unsigned()) {
      since = question["since"].get<uint64_t>();
    }
    if (question.is_object() && question.value("max", nlohmann::json()).is_number_unsigned()) {
      max = question["max"].get<uint64_t>();
    }
    nlohmann::json denials = nlohmann::json::array();
    for (const auto& denial : self->ring) {
      if (denial.seq <= since) continue;
      if (denials.size() >= max) break;
      denials.push_back({{"seq", denial.seq},
                         {"at_ms", denial.at_ms},
                         {"host", denial.host},
                         {"port", denial.port},
                         {"reason", denial.reason}});
    }
    const std::string answer = nlohmann::json{{"allowed", self->allowed},
                                              {"denied", self->denied},
                                              {"seq", self->seq},
                                              {"denials", std::move(denials)}}
                                   .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) +
                               "\n";
    co_await net::async_write(host, net::buffer(answer),
                              net::redirect_error(net::use_awaitable, error));
    deadline.cancel();
  }
};

Proxy::Proxy(net::io_context& io, ProxyOptions options)
    : state_(std::make_shared<State>(io, std::move(options))) {}

Proxy::~Proxy() = default;

void Proxy::start() {
  state_->accept();
}

}  // namespace quarry::sandbox::local::proxy

#include "common/http_client.h"

#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <cctype>
#include <limits>
#include <mutex>
#include <optional>

namespace quarry {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using boost::system::error_code;
using SteadyTime = std::chrono::steady_clock::time_point;

constexpr char kUserAgent[] = "quarry/0.1";

// Boost's messages start with a capital ("Connection refused"); ours continue a sentence.
std::string describe(const error_code& error) {
  std::string text = error.message();
  if (text.size() > 1 && std::isupper(static_cast<unsigned char>(text[0])) &&
      std::islower(static_cast<unsigned char>(text[1]))) {
    text[0] = static_cast<char>(std::tolower(static_cast<unsigned char>(text[0])));
  }
  return text;
}

bool is_http_error(const error_code& error) {
  return &error.category() == &http::make_error_code(http::error::need_buffer).category();
}

bool is_ip_address(const std::string& host) {
  error_code error;
  net::ip::make_address(host, error);
  return !error;
}

}  // namespace

struct HttpClient::State {
  HttpClientOptions options;
  net::ssl::context tls{net::ssl::context::tls_client};
  // The system's CA store is loaded at the first https request, not at create: parsing its
  // hundreds of certificates takes tens of milliseconds that a client of plain http (a quarry
  // on loopback, say) never needs.
  std::once_flag system_roots;
  std::optional<Error> system_roots_error;
};

namespace {

// One request on one connection. Every operation is asynchronous on a private io_context that
// this thread runs until the operation is done, so a deadline or the cancel fd can interrupt
// any of them by closing the socket.
class Exchange {
 public:
  Exchange(const HttpClientOptions& options, net::ssl::context& tls, const HttpRequest& request)
      : options_(options), tls_context_(tls), request_(request) {
    if (request.max_body_bytes > 0) options_.max_body_bytes = request.max_body_bytes;
    if (request.timeout.count() > 0) options_.timeout = request.timeout;
    const auto start = std::chrono::steady_clock::now();
    connect_limit_ = std::min(options_.connect_timeout, options_.timeout);
    deadline_ = start + options_.timeout;
    connect_deadline_ = start + connect_limit_;
  }

  Result<HttpResponse> run(const BodyHandler& on_body, int cancel_fd) {
    for (const auto& header : request_.headers) {
      if (header.value.find_first_of("\r\n") != std::string::npos ||
          header.name.find_first_of("\r\n: ") != std::string::npos) {
        return make_error(ErrorCode::kInvalidArgument,
                          "the HTTP header '{}' has a line break or a bad name", header.name);
      }
    }
    if (cancel_fd >= 0) RETURN_IF_ERROR(watch_cancel(cancel_fd));
    RETURN_IF_ERROR(connect());
    if (tls_) return converse(*tls_, on_body);
    return converse(socket_, on_body);
  }

 private:
  enum class Interrupt { kNone, kTimeout, kCancelled };

  std::string where() const { return request_.url.to_string(); }

  Result<void> watch_cancel(int cancel_fd) {
    int fd = ::dup(cancel_fd);
    if (fd < 0) return errno_error("dup(cancel fd {})", cancel_fd);
    error_code error;
    cancel_watch_.emplace(io_);
    cancel_watch_->assign(fd, error);
    if (error) {
      ::close(fd);
      return make_error(ErrorCode::kInternal, "cannot watch the cancel fd {}: {}", cancel_fd,
                        describe(error));
    }
    cancel_watch_->async_wait(net::posix::stream_descriptor::wait_read, [this](error_code error) {
      if (!error) interrupt(Interrupt::kCancelled);
    });
    return {};
  }

  void interrupt(Interrupt why) {
    if (interrupted_ != Interrupt::kNone) return;
    interrupted_ = why;
    error_code ignored;
    resolver_.cancel();
    socket_.close(ignored);
  }

  // Runs handlers until `done`. At `deadline`, or when the cancel fd fires, closes the
  // connection; the pending operation then ends with an error and sets `done`.
  void wait(const bool& done, SteadyTime deadline) {
    while (!done) {
      if (io_.stopped()) io_.restart();
      if (interrupted_ != Interrupt::kNone) {
        io_.run_one();
      } else if (io_.run_one_until(deadline) == 0 && !done &&
                 std::chrono::steady_clock::now() >= deadline) {
        interrupt(Interrupt::kTimeout);
      }
    }
  }

  // Starts an asynchronous operation with a completion handler, runs it to its end or until
  // `deadline`, and returns its error (an interrupted one ends with an error too).
  template <typename Start>
  error_code await(SteadyTime deadline, Start&& start) {
    bool done = false;
    error_code error;
    start([&](error_code e, auto&&...) {
      error = e;
      done = true;
    });
    wait(done, deadline);
    return error;
  }

  // The error for an interrupted operation, if it was interrupted: a timeout is `timeout_code`
  // with the message `describe_timeout()` gives.
  template <typename Describe>
  std::optional<Error> interruption(ErrorCode timeout_code, Describe&& describe_timeout) const {
    if (interrupted_ == Interrupt::kCancelled) return Error{ErrorCode::kCancelled, "cancelled"};
    if (interrupted_ == Interrupt::kTimeout) return Error{timeout_code, describe_timeout()};
    return std::nullopt;
  }

  // A connection step that ran out of connect_timeout.
  std::optional<Error> connect_interruption(std::string_view what) const {
    return interruption(ErrorCode::kUnavailable, [&] {
      return fmt::format("cannot reach {}: {} within {}", where(), what,
                         format_duration(connect_limit_));
    });
  }

  Result<void> connect() {
    const Url& url = request_.url;
    tcp::resolver::results_type endpoints;
    auto error = await(connect_deadline_, [&](auto done) {
      resolver_.async_resolve(url.host, std::to_string(url.port),
                              [&, done](error_code e, tcp::resolver::results_type results) {
                                endpoints = std::move(results);
                                done(e);
                              });
    });
    if (auto stop = connect_interruption(fmt::format("the name {} was not resolved", url.host))) {
      return std::unexpected(*stop);
    }
    if (error) {
      return make_error(ErrorCode::kUnavailable, "cannot reach {}: cannot resolve the name {} ({})",
                        where(), url.host, describe(error));
    }

    error = await(connect_deadline_,
                  [&](auto done) { net::async_connect(socket_, endpoints, std::move(done)); });
    if (auto stop = connect_interruption("no connection")) return std::unexpected(*stop);
    if (error) {
      return make_error(ErrorCode::kUnavailable, "cannot reach {}: {}", where(), describe(error));
    }
    error_code ignored;
    socket_.set_option(tcp::no_delay(true), ignored);
    if (!url.tls()) return {};

    tls_.emplace(socket_, tls_context_);
    SSL* ssl = tls_->native_handle();
    if (is_ip_address(url.host)) {
      // Certificates name IP addresses in their own SAN entries; SNI never carries one.
      X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), url.host.c_str());
    } else {
      SSL_set_tlsext_host_name(ssl, url.host.c_str());
      SSL_set1_host(ssl, url.host.c_str());
    }
    tls_->set_verify_mode(net::ssl::verify_peer);
    error = await(connect_deadline_, [&](auto done) {
      tls_->async_handshake(net::ssl::stream_base::client, std::move(done));
    });
    if (auto stop = connect_interruption("no TLS handshake")) return std::unexpected(*stop);
    if (error) {
      const long verify = SSL_get_verify_result(ssl);
      if (verify != X509_V_OK) {
        return make_error(ErrorCode::kFailedPrecondition,
                          "cannot reach {} securely: its TLS certificate was not accepted ({}); "
                          "trusted are {}",
                          where(), X509_verify_cert_error_string(verify),
                          options_.ca_file.empty()
                              ? std::string("the system's CA certificates")
                              : fmt::format("only the CAs in {}", options_.ca_file));
      }
      return make_error(ErrorCode::kUnavailable, "cannot reach {}: the TLS handshake failed ({})",
                        where(), describe(error));
    }
    return {};
  }

  Error io_failure(const error_code& error, std::string_view while_doing) const {
    if (auto stop = interruption(ErrorCode::kDeadlineExceeded, [&] {
          return fmt::format("{}: no complete answer within {}", where(),
                             format_duration(options_.timeout));
        })) {
      return *stop;
    }
    if (error == http::error::end_of_stream) {
      return Error{ErrorCode::kUnavailable,
                   fmt::format("{} closed the connection while {}", where(), while_doing)};
    }
    if (is_http_error(error) && error != http::error::partial_message) {
      return Error{
          ErrorCode::kInternal,
          fmt::format("{} sent a response that is not valid HTTP ({})", where(), describe(error))};
    }
    return Error{ErrorCode::kUnavailable, fmt::format("the connection to {} broke while {}: {}",
                                                      where(), while_doing, describe(error))};
  }

  template <typename Stream>
  Result<HttpResponse> converse(Stream& stream, const BodyHandler& on_body) {
    http::request<http::string_body> request;
    request.version(11);
    request.method_string(request_.method);
    request.target(request_.target.empty() ? request_.url.target("") : request_.target);
    for (const auto& header : request_.headers)
      request.insert(header.name, header.value);
    // The caller's own Host or User-Agent, if it gave one, goes instead of these.
    if (request.find(http::field::host) == request.end()) {
      request.set(http::field::host, request_.url.authority());
    }
    if (request.find(http::field::user_agent) == request.end()) {
      request.set(http::field::user_agent, kUserAgent);
    }
    request.keep_alive(false);  // one request per connection
    request.body() = request_.body;
    request.prepare_payload();

    auto error =
        await(deadline_, [&](auto done) { http::async_write(stream, request, std::move(done)); });
    if (error || interrupted_ != Interrupt::kNone) {
      return std::unexpected(io_failure(error, "sending the request"));
    }

    beast::flat_buffer buffer;
    http::response_parser<http::buffer_body> parser;
    // Streamed bodies have no natural size. (Not boost::none: Boost 1.74 then refuses every
    // body with a Content-Length.)
    parser.body_limit(std::numeric_limits<std::uint64_t>::max());
    parser.skip(request_.method == "HEAD");  // its Content-Length describes a body never sent
    error = await(deadline_, [&](auto done) {
      http::async_read_header(stream, buffer, parser, std::move(done));
    });
    if (error || interrupted_ != Interrupt::kNone) {
      return std::unexpected(io_failure(error, "waiting for the answer"));
    }
    HttpResponse response;
    response.status = static_cast<int>(parser.get().result_int());
    for (const auto& field : parser.get()) {
      const auto name = field.name_string();
      const auto value = field.value();
      response.headers.push_back(
          {std::string(name.data(), name.size()), std::string(value.data(), value.size())});
    }

    std::array<char, 16 * 1024> chunk;
    while (!parser.is_done()) {
      parser.get().body().data = chunk.data();
      parser.get().body().size = chunk.size();
      error = await(deadline_, [&](auto done) {
        http::async_read_some(stream, buffer, parser, std::move(done));
      });
      if (error == http::error::need_buffer) error = {};
      if (error == net::ssl::error::stream_truncated && parser.need_eof()) {
        // A server that ends the body by closing may skip TLS's close_notify.
        error = {};
        parser.put_eof(error);
      }
      if (error || interrupted_ != Interrupt::kNone) {
        return std::unexpected(io_failure(error, "reading the answer"));
      }
      const size_t size = chunk.size() - parser.get().body().size;
      if (size == 0) continue;
      std::string_view piece(chunk.data(), size);
      if (on_body) {
        RETURN_IF_ERROR(on_body(response, piece));
      } else if (response.body.size() + size > options_.max_body_bytes) {
        return make_error(ErrorCode::kResourceExhausted, "{} sent an answer larger than {}",
                          where(), format_size(options_.max_body_bytes));
      } else {
        response.body.append(piece);
      }
    }
    return response;
  }

  HttpClientOptions options_;  // the client's, with the request's own limits
  net::ssl::context& tls_context_;
  const HttpRequest& request_;
  Duration connect_limit_;
  SteadyTime deadline_;
  SteadyTime connect_deadline_;
  net::io_context io_;
  tcp::resolver resolver_{io_};
  tcp::socket socket_{io_};
  std::optional<net::ssl::stream<tcp::socket&>> tls_;
  std::optional<net::posix::stream_descriptor> cancel_watch_;
  Interrupt interrupted_ = Interrupt::kNone;
};

}  // namespace

std::string_view HttpResponse::header(std::string_view name) const {
  for (const auto& header : headers) {
    if (beast::iequals(header.name, beast::string_view(name.data(), name.size()))) {
      return header.value;
    }
  }
  return {};
}

Result<HttpClient> HttpClient::create(HttpClientOptions options) {
  auto state = std::make_unique<State>();
  state->options = std::move(options);
  SSL_CTX_set_min_proto_version(state->tls.native_handle(), TLS1_2_VERSION);
  error_code error;
  if (!state->options.ca_file.empty()) {
    // A file named is read now, so a bad one fails at start and not at the first request.
    state->tls.load_verify_file(state->options.ca_file, error);
    if (error) {
      return make_error(ErrorCode::kFailedPrecondition,
                        "cannot load CA certificates from {}: {} (it must be a readable PEM file)",
                        state->options.ca_file, describe(error));
    }
  }
  return HttpClient(std::move(state));
}

HttpClient::HttpClient(std::unique_ptr<State> state) : state_(std::move(state)) {}
HttpClient::HttpClient(HttpClient&&) noexcept = default;
HttpClient& HttpClient::operator=(HttpClient&&) noexcept = default;
HttpClient::~HttpClient() = default;

const HttpClientOptions& HttpClient::options() const {
  return state_->options;
}

Result<HttpResponse> HttpClient::send(const HttpRequest& request, const BodyHandler& on_body,
                                      int cancel_fd) const {
  if (request.url.tls() && state_->options.ca_file.empty()) {
    std::call_once(state_->system_roots, [&state = *state_] {
      error_code error;
      state.tls.set_default_verify_paths(error);
      if (error) {
        state.system_roots_error =
            Error{ErrorCode::kFailedPrecondition,
                  fmt::format("cannot load the system's CA certificates: {}", describe(error))};
      }
    });
    if (state_->system_roots_error) return std::unexpected(*state_->system_roots_error);
  }
  Exchange exchange(state_->options, state_->tls, request);
  return exchange.run(on_body, cancel_fd);
}

}  // namespace quarry

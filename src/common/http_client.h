// A small blocking HTTP/1.1 client over http and https (Boost.Beast, OpenSSL): one request per
// connection, a connect and a whole-request deadline, cancellation through a file descriptor,
// and the response body handed over piece by piece as it arrives (for Server-Sent Events).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.h"
#include "common/units.h"
#include "common/url.h"

namespace quarry {

struct HttpHeader {
  std::string name;
  std::string value;
};

struct HttpRequest {
  std::string method = "GET";
  Url url;
  std::string target;  // e.g. url.target("/chat/completions")
  // Host, User-Agent and Content-Length are added (unless given here); give Content-Type and
  // the rest here.
  std::vector<HttpHeader> headers;
  std::string body;
  // This request's own limits instead of the client's (HttpClientOptions): zero for theirs.
  Duration timeout{};
  uint64_t max_body_bytes = 0;
};

struct HttpResponse {
  int status = 0;
  std::vector<HttpHeader> headers;
  std::string body;  // empty when the body went to a BodyHandler

  // The first header of that name (case-insensitive), or "".
  std::string_view header(std::string_view name) const;
};

struct HttpClientOptions {
  Duration connect_timeout = std::chrono::seconds(10);  // resolve + TCP connect + TLS handshake
  Duration timeout = std::chrono::seconds(60);  // the whole exchange, to the body's last byte
  // A PEM file of CA certificates to trust for https; empty: the system's store.
  std::string ca_file;
  // A body kept in HttpResponse::body longer than this is an error (kResourceExhausted).
  uint64_t max_body_bytes = 64 * kMiB;
};

// Receives the body as it arrives, with the status and headers already read. An error stops
// the exchange and becomes its result.
using BodyHandler = std::function<Result<void>(const HttpResponse& head, std::string_view piece)>;

// Errors say what failed and where, with codes callers can act on:
//   kUnavailable         the server could not be reached or the connection broke (may retry):
//                        "cannot reach http://127.0.0.1:9/: connection refused"
//   kDeadlineExceeded    the whole-request timeout expired after the connection was made
//   kFailedPrecondition  the server's TLS certificate was not accepted (do not retry)
//   kCancelled           the cancel fd became readable
//   kInternal            the server broke the HTTP protocol
// An HTTP error status is not an error here: it is in the response.
class HttpClient {
 public:
  // Loads the CA file (if any) once; fails if it cannot be read.
  static Result<HttpClient> create(HttpClientOptions options);
  HttpClient(HttpClient&&) noexcept;
  HttpClient& operator=(HttpClient&&) noexcept;
  ~HttpClient();

  // Sends `request` on a new connection and reads the response. With `on_body` the body goes
  // there piece by piece (HttpResponse::body stays empty); without, it is collected. When
  // `cancel_fd` (>= 0) becomes readable the exchange stops with kCancelled.
  Result<HttpResponse> send(const HttpRequest& request, const BodyHandler& on_body = {},
                            int cancel_fd = -1) const;

  const HttpClientOptions& options() const;

 private:
  struct State;
  explicit HttpClient(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace quarry

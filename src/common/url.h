// http and https URLs as quarry's HTTP client takes them: scheme, host, port, path prefix.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/error.h"

namespace quarry {

struct Url {
  std::string scheme;  // "http" or "https", lower case
  std::string host;    // lower case; an IPv6 address without its brackets
  uint16_t port = 0;   // the scheme's default when the URL names none
  std::string path;    // "" or "/v1": no trailing '/'
  std::string query;   // after '?', without it; kept for gateways that need one

  bool tls() const { return scheme == "https"; }
  // "host" or "host:port" when the port is not the scheme's default (the Host header).
  std::string authority() const;
  // The URL written out again ("https://api.example.com/v1"), without the query.
  std::string to_string() const;
  // The request target of `path` below this URL's path: "/v1" + "/chat/completions", and the
  // query. `path` starts with '/'.
  std::string target(std::string_view path) const;
};

// Parses "http[s]://host[:port][/path][?query]". Refuses credentials in the URL (keys belong in
// the environment), fragments, and other schemes, saying which part is wrong.
Result<Url> parse_url(std::string_view text);

// `text` percent-encoded for a query value or a path segment: every byte but A-Z a-z 0-9 - . _ ~.
std::string percent_encode(std::string_view text);

// True for "localhost", 127.0.0.0/8 and ::1: a server on this machine.
bool is_loopback_host(std::string_view host);

}  // namespace quarry

#include "common/url.h"

#include <arpa/inet.h>
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>

#include "common/text.h"

namespace quarry {
namespace {

bool valid_host_name(std::string_view host) {
  return !host.empty() && std::all_of(host.begin(), host.end(), [](unsigned char c) {
    return std::isalnum(c) || c == '-' || c == '.' || c == '_';
  });
}

bool is_ipv6(const std::string& host) {
  in6_addr address;
  // inet_pton reads up to the first NUL: "::1\0junk" must not pass as ::1.
  return host.find('\0') == std::string::npos && ::inet_pton(AF_INET6, host.c_str(), &address) == 1;
}

// What a request line cannot carry as it is: white space, control bytes, and characters that
// must be percent-encoded. Path and query go into "POST <target> HTTP/1.1" verbatim.
bool needs_encoding(std::string_view text) {
  return std::any_of(text.begin(), text.end(), [](unsigned char c) {
    return c <= ' ' || c == 0x7f || c == '"' || c == '<' || c == '>' || c == '\\';
  });
}

// `text` as a message may show it: user and password before the host's '@' become "***", so
// that a refused URL does not put a password in a terminal or a log.
std::string without_credentials(std::string_view text) {
  auto scheme_end = text.find("://");
  const size_t start = scheme_end == std::string_view::npos ? 0 : scheme_end + 3;
  const size_t end = std::min(text.find_first_of("/?#", start), text.size());
  const size_t at = text.substr(start, end - start).rfind('@');
  if (at == std::string_view::npos) return std::string(text);
  return fmt::format("{}***{}", text.substr(0, start), text.substr(start + at));
}

}  // namespace

std::string Url::authority() const {
  const bool default_port = (scheme == "https" && port == 443) || (scheme == "http" && port == 80);
  std::string name = host.find(':') != std::string::npos ? fmt::format("[{}]", host) : host;
  return default_port ? name : fmt::format("{}:{}", name, port);
}

std::string Url::to_string() const {
  return fmt::format("{}://{}{}", scheme, authority(), path);
}

std::string Url::target(std::string_view below) const {
  std::string out = path + std::string(below);
  if (out.empty()) out = "/";
  if (!query.empty()) out += "?" + query;
  return out;
}

std::string percent_encode(std::string_view text) {
  std::string out;
  for (unsigned char c : text) {
    if (std::isalnum(c) || c == '-' || c == '.' || c == '_' || c == '~') {
      out += static_cast<char>(c);
    } else {
      out += fmt::format("%{:02X}", c);
    }
  }
  return out;
}

Result<Url> parse_url(std::string_view text) {
  auto bad = [&](std::string_view why) {
    return make_error(ErrorCode::kInvalidArgument, "'{}' is not a usable URL: {}",
                      without_credentials(text), why);
  };
  Url url;
  auto scheme_end = text.find("://");
  if (scheme_end == std::string_view::npos) {
    return bad("it must start with http:// or https://");
  }
  url.scheme = ascii_lower(text.substr(0, scheme_end));
  if (url.scheme != "http" && url.scheme != "https") {
    return bad(fmt::format("the scheme '{}' is not http or https", url.scheme));
  }
  std::string_view rest = text.substr(scheme_end + 3);
  if (rest.find('#') != std::string_view::npos)
    return bad("a fragment ('#...') has no meaning here");
  auto authority_end = rest.find_first_of("/?");
  std::string_view authority = rest.substr(0, authority_end);
  std::string_view after =
      authority_end == std::string_view::npos ? std::string_view() : rest.substr(authority_end);
  if (authority.find('@') != std::string_view::npos) {
    return bad("it carries credentials; give the API key through the environment instead");
  }

  std::string_view port_text;
  if (authority.starts_with('[')) {
    auto close = authority.find(']');
    if (close == std::string_view::npos) return bad("an IPv6 address misses its ']'");
    url.host = ascii_lower(authority.substr(1, close - 1));
    if (!is_ipv6(url.host)) return bad(fmt::format("'{}' is not an IPv6 address", url.host));
    std::string_view tail = authority.substr(close + 1);
    if (!tail.empty()) {
      if (!tail.starts_with(':')) return bad("unexpected text after the IPv6 address");
      port_text = tail.substr(1);
      if (port_text.empty()) return bad("the port after ':' is empty");
    }
  } else {
    auto colon = authority.find(':');
    url.host = ascii_lower(authority.substr(0, colon));
    if (colon != std::string_view::npos) {
      port_text = authority.substr(colon + 1);
      if (port_text.empty()) return bad("the port after ':' is empty");
    }
    if (url.host.empty()) return bad("it has no host");
    if (!valid_host_name(url.host)) return bad(fmt::format("'{}' is not a host name", url.host));
  }

  url.port = url.tls() ? 443 : 80;
  if (!port_text.empty()) {
    unsigned value = 0;
    auto [end, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), value);
    if (ec != std::errc() || end != port_text.data() + port_text.size() || value == 0 ||
        value > 65535) {
      return bad(fmt::format("'{}' is not a port (1 to 65535)", port_text));
    }
    url.port = static_cast<uint16_t>(value);
  }

  auto query_start = after.find('?');
  if (query_start != std::string_view::npos) {
    url.query = std::string(after.substr(query_start + 1));
    after = after.substr(0, query_start);
  }
  if (needs_encoding(after)) {
    return bad("the path has spaces or characters that must be percent-encoded");
  }
  if (needs_encoding(url.query)) {
    return bad("the query has spaces or characters that must be percent-encoded");
  }
  url.path = std::string(after);
  while (!url.path.empty() && url.path.back() == '/')
    url.path.pop_back();
  return url;
}

bool is_loopback_host(std::string_view host) {
  std::string name = ascii_lower(host);
  if (name == "localhost" || name.ends_with(".localhost")) return true;
  in_addr v4;
  if (::inet_pton(AF_INET, name.c_str(), &v4) == 1) {
    return (ntohl(v4.s_addr) >> 24) == 127;
  }
  in6_addr v6;
  if (::inet_pton(AF_INET6, name.c_str(), &v6) == 1) {
    return IN6_IS_ADDR_LOOPBACK(&v6);
  }
  return false;
}

}  // namespace quarry

#include "common/url.h"

#include <gtest/gtest.h>

namespace quarry {
namespace {

TEST(Url, ParsesSchemeHostPortAndPathPrefix) {
  struct Case {
    const char* text;
    const char* scheme;
    const char* host;
    uint16_t port;
    const char* path;
    const char* query;
  } cases[] = {
      {"https://api.openai.com/v1", "https", "api.openai.com", 443, "/v1", ""},
      {"http://127.0.0.1:8080/v1/", "http", "127.0.0.1", 8080, "/v1", ""},
      {"HTTP://LocalHost:11434", "http", "localhost", 11434, "", ""},
      {"http://[::1]:9000/api/v1", "http", "::1", 9000, "/api/v1", ""},
      {"https://gw.example/openai/deployments/d?api-version=2024-06-01", "https", "gw.example", 443,
       "/openai/deployments/d", "api-version=2024-06-01"},
      {"http://model_host", "http", "model_host", 80, "", ""},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.text);
    auto url = parse_url(c.text);
    ASSERT_TRUE(url) << url.error().message;
    EXPECT_EQ(url->scheme, c.scheme);
    EXPECT_EQ(url->host, c.host);
    EXPECT_EQ(url->port, c.port);
    EXPECT_EQ(url->path, c.path);
    EXPECT_EQ(url->query, c.query);
  }
}

TEST(Url, BuildsTargetsAuthorityAndText) {
  auto url = parse_url("https://api.openai.com/v1/");
  ASSERT_TRUE(url);
  EXPECT_EQ(url->target("/chat/completions"), "/v1/chat/completions");
  EXPECT_EQ(url->authority(), "api.openai.com");
  EXPECT_EQ(url->to_string(), "https://api.openai.com/v1");
  EXPECT_TRUE(url->tls());

  auto local = parse_url("http://[::1]:9000?key=1");
  ASSERT_TRUE(local);
  EXPECT_EQ(local->target("/models"), "/models?key=1");
  EXPECT_EQ(local->target(""), "/?key=1");
  EXPECT_EQ(local->authority(), "[::1]:9000");
  EXPECT_EQ(local->to_string(), "http://[::1]:9000");
  EXPECT_FALSE(local->tls());
}

TEST(Url, RejectsWhatItCannotUseSayingWhy) {
  struct Case {
    std::string_view text;
    const char* expected;
  } cases[] = {
      {"api.openai.com/v1", "must start with http:// or https://"},
      {"ftp://host/x", "the scheme 'ftp' is not http or https"},
      {"https://user:key@host/v1", "carries credentials"},
      {"http://host:0", "'0' is not a port"},
      {"http://host:65536", "'65536' is not a port"},
      {"http://host:80x", "'80x' is not a port"},
      {"http://host:/v1", "the port after ':' is empty"},
      {"http:///v1", "it has no host"},
      {"http://ho st/v1", "'ho st' is not a host name"},
      {"http://[::1/v1", "misses its ']'"},
      {"http://[nope]:1", "'nope' is not an IPv6 address"},
      {"http://host/v1#frag", "fragment"},
      {"http://host/a b", "must be percent-encoded"},
      // Found by fuzz/url_fuzzer: the query went into the request line unchecked, and a NUL
      // cut the IPv6 address inet_pton saw.
      {"https://gw.example/v1?api-version=1\r\nX-Injected: 1", "the query has spaces"},
      {"https://gw.example/v1?a=\tb", "the query has spaces"},
      {std::string_view("http://[::1\0junk]:8080/v1", 25), "is not an IPv6 address"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.text);
    auto url = parse_url(c.text);
    ASSERT_FALSE(url);
    EXPECT_EQ(url.error().code, ErrorCode::kInvalidArgument);
    EXPECT_NE(url.error().message.find(c.expected), std::string::npos) << url.error().message;
  }
}

// A refused URL is shown to the user and logged: its password must not be.
TEST(Url, RefusesWithoutRepeatingAPassword) {
  struct Case {
    const char* text;
    const char* shown;
  } cases[] = {
      {"https://user:hunter2@host/v1",
       "'https://***@host/v1' is not a usable URL: it carries credentials"},
      {"http://user:hunter2@host:8080?a=1", "'http://***@host:8080?a=1'"},
      {"ftp://user:hunter2@host/x", "'ftp://***@host/x' is not a usable URL: the scheme"},
      {"http://user:hunter2@host/v1#frag", "'http://***@host/v1#frag'"},
      {"user:hunter2@host/v1", "'***@host/v1' is not a usable URL: it must start with http://"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.text);
    auto url = parse_url(c.text);
    ASSERT_FALSE(url);
    EXPECT_EQ(url.error().message.find("hunter2"), std::string::npos) << url.error().message;
    EXPECT_NE(url.error().message.find(c.shown), std::string::npos) << url.error().message;
  }
}

TEST(Url, KnowsLoopbackHosts) {
  for (const char* host :
       {"localhost", "LOCALHOST", "model.localhost", "127.0.0.1", "127.1.2.3", "::1"}) {
    EXPECT_TRUE(is_loopback_host(host)) << host;
  }
  for (const char* host :
       {"api.openai.com", "10.0.0.5", "128.0.0.1", "::2", "localhost.evil.com", "0.0.0.0"}) {
    EXPECT_FALSE(is_loopback_host(host)) << host;
  }
}

}  // namespace
}  // namespace quarry

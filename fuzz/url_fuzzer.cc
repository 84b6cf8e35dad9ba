// Fuzzes parse_url (model.base_url, from the user's config.yml) and is_loopback_host. Besides
// crashes it checks what callers rely on: an accepted URL writes out to itself again, and the
// request target it makes is safe on an HTTP request line.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "check.h"
#include "common/url.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  (void)quarry::is_loopback_host(text);
  auto url = quarry::parse_url(text);
  if (!url) return 0;
  check(url->scheme == "http" || url->scheme == "https", "a scheme other than http(s)");
  check(!url->host.empty() && url->port != 0, "no host or port 0");
  // The Host header and the target go verbatim into the request: no white space or control
  // bytes in either.
  for (const unsigned char c : url->authority())
    check(c > ' ' && c != 0x7f, "a host with white space or a control byte");
  // The target goes verbatim into "POST <target> HTTP/1.1": no white space or control bytes.
  for (const unsigned char c : url->target("/chat/completions"))
    check(c > ' ' && c != 0x7f, "a request target with white space or a control byte");
  const std::string again =
      url->query.empty() ? url->to_string() : url->to_string() + "?" + url->query;
  auto reparsed = quarry::parse_url(again);
  check(reparsed.has_value(), "the URL written out again does not parse");
  check(reparsed->scheme == url->scheme && reparsed->host == url->host &&
            reparsed->port == url->port && reparsed->path == url->path &&
            reparsed->query == url->query,
        "the URL written out again parses differently");
  (void)quarry::is_loopback_host(url->host);
  return 0;
}

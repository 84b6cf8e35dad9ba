// Fuzzes what a sandbox sends its network proxy: the first bytes of a tunnel (a TLS
// ClientHello's server name) and the host names it asks for. Besides crashes it checks what
// the proxy relies on: a name found is non-empty and within the message, a prefix of an input
// is never judged differently from "read more" or the same verdict, and a host name let
// through is canonical and matched by the allowlist it was checked against.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "check.h"
#include "config/allowlist.h"
#include "sandbox/local/proxy/client_hello.h"

using quarry::sandbox::local::proxy::HelloStatus;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const uint8_t> bytes(data, size);
  const auto hello = quarry::sandbox::local::proxy::parse_client_hello(bytes);
  if (hello.status == HelloStatus::kFound) {
    check(!hello.server_name.empty() && hello.server_name.size() < size,
          "a server name out of nowhere");
    // The proxy checks the name as a host: whatever it is, that must not crash.
    auto host = quarry::canonical_host(hello.server_name);
    if (host) {
      check(quarry::host_allowed({*host}, *host), "a canonical host its own entry does not allow");
    }
  }
  if (size > 0) {
    const auto shorter = quarry::sandbox::local::proxy::parse_client_hello(bytes.first(size - 1));
    check(shorter.status == HelloStatus::kNeedMore || shorter.status == hello.status ||
              hello.status == HelloStatus::kMalformed,
          "a prefix judged otherwise than the whole");
  }
  const std::string text(reinterpret_cast<const char*>(data), size);
  if (auto entry = quarry::parse_allow_entry(text)) {
    check(*quarry::parse_allow_entry(*entry) == *entry, "an entry not canonical after parsing");
    check(quarry::first_not_covered({*entry}, {*entry}) == std::nullopt,
          "an entry that does not cover itself");
  }
  return 0;
}

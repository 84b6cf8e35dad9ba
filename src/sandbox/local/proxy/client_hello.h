// The server name (SNI) a TLS client asks for, read from the first bytes of its connection: the
// proxy checks it against the allowlist before any byte reaches the server, so a tunnel opened
// to an allowed name cannot carry a TLS session to another one on the same address.
#pragma once

#include <cstdint>
#include <span>
#include <string>

namespace quarry::sandbox::local::proxy {

enum class HelloStatus {
  kNeedMore,      // the bytes so far are the start of a ClientHello: read more
  kNotTls,        // not a TLS handshake (plain bytes through the tunnel)
  kMalformed,     // claims to be a TLS handshake but does not parse
  kNoServerName,  // a whole ClientHello without a server_name extension
  kFound,         // server_name holds the host name asked for
};

struct ClientHello {
  HelloStatus status = HelloStatus::kNeedMore;
  std::string server_name;
};

// The largest ClientHello read (handshake message bytes); a longer one is kMalformed.
constexpr size_t kMaxClientHello = 16 * 1024;

// Reads the TLS records at the start of `bytes` (RFC 8446 5.1, 4.1.2; RFC 6066 3): the
// handshake message may span several records.
ClientHello parse_client_hello(std::span<const uint8_t> bytes);

}  // namespace quarry::sandbox::local::proxy

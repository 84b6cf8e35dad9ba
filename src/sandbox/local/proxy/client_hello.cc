// The server name of a TLS ClientHello.
#include "sandbox/local/proxy/client_hello.h"

#include <optional>
#include <vector>

namespace quarry::sandbox::local::proxy {
namespace {

constexpr uint8_t kHandshakeRecord = 22;
constexpr uint8_t kClientHelloMessage = 1;
constexpr uint16_t kServerNameExtension = 0;
constexpr uint8_t kHostName = 0;

// Big-endian reads over a span that fail (nullopt) instead of running past its end.
class Reader {
 public:
  explicit Reader(std::span<const uint8_t> bytes) : bytes_(bytes) {}

  std::optional<uint32_t> number(size_t width) {
    if (bytes_.size() < width) return std::nullopt;
    uint32_t value = 0;
    for (size_t i = 0; i < width; ++i)
      value = (value << 8) | bytes_[i];
    bytes_ = bytes_.subspan(width);
    return value;
  }
  std::optional<std::span<const uint8_t>> take(size_t size) {
    if (bytes_.size() < size) return std::nullopt;
    auto taken = bytes_.first(size);
    bytes_ = bytes_.subspan(size);
    return taken;
  }
  // A field prefixed by its length in `width` bytes.
  std::optional<Reader> vector(size_t width) {
    auto size = number(width);
    if (!size) return std::nullopt;
    auto body = take(*size);
    if (!body) return std::nullopt;
    return Reader(*body);
  }
  bool skip_vector(size_t width) { return vector(width).has_value(); }
  bool empty() const { return bytes_.empty(); }
  std::span<const uint8_t> rest() const { return bytes_; }

 private:
  std::span<const uint8_t> bytes_;
};

ClientHello status(HelloStatus status) {
  return {status, {}};
}

// The server_name extension's body: a list of names, of which the host_name one counts.
ClientHello server_name(Reader extension) {
  auto list = extension.vector(2);
  if (!list || !extension.empty()) return status(HelloStatus::kMalformed);
  while (!list->empty()) {
    auto type = list->number(1);
    auto name = list->vector(2);
    if (!type || !name) return status(HelloStatus::kMalformed);
    if (*type != kHostName) continue;
    const auto bytes = name->rest();
    if (bytes.empty()) return status(HelloStatus::kMalformed);
    return {HelloStatus::kFound, std::string(bytes.begin(), bytes.end())};
  }
  return status(HelloStatus::kMalformed);
}

ClientHello parse_message(std::span<const uint8_t> message) {
  Reader hello(message);
  if (!hello.take(2) ||         // legacy_version
      !hello.take(32) ||        // random
      !hello.skip_vector(1) ||  // legacy_session_id
      !hello.skip_vector(2) ||  // cipher_suites
      !hello.skip_vector(1)) {  // legacy_compression_methods
    return status(HelloStatus::kMalformed);
  }
  if (hello.empty()) return status(HelloStatus::kNoServerName);  // no extensions at all
  auto extensions = hello.vector(2);
  if (!extensions || !hello.empty()) return status(HelloStatus::kMalformed);
  while (!extensions->empty()) {
    auto type = extensions->number(2);
    auto body = extensions->vector(2);
    if (!type || !body) return status(HelloStatus::kMalformed);
    if (*type == kServerNameExtension) return server_name(*body);
  }
  return status(HelloStatus::kNoServerName);
}

}  // namespace

ClientHello parse_client_hello(std::span<const uint8_t> bytes) {
  // The handshake bytes of the leading records, joined.
  std::vector<uint8_t> handshake;
  Reader records(bytes);
  bool first = true;
  while (!records.empty()) {
    auto type = records.number(1);
    if (!type) break;
    if (*type != kHandshakeRecord) {
      return status(first ? HelloStatus::kNotTls : HelloStatus::kMalformed);
    }
    auto version = records.number(2);
    if (!version) break;
    // Every TLS version's records say 3.x (3.1 for TLS 1.0 and up; 3.0 from old clients).
    if ((*version >> 8) != 3) return status(first ? HelloStatus::kNotTls : HelloStatus::kMalformed);
    first = false;
    auto length = records.number(2);
    if (!length) break;
    if (*length == 0 || *length > (1u << 14)) return status(HelloStatus::kMalformed);
    auto fragment = records.take(*length);
    if (!fragment) {
      // The rest of this record has not arrived; what did may already hold the whole name,
      // but the message is only judged whole.
      break;
    }
    handshake.insert(handshake.end(), fragment->begin(), fragment->end());
    if (handshake.size() >= 4) {
      if (handshake[0] != kClientHelloMessage) return status(HelloStatus::kMalformed);
      const size_t size = (size_t{handshake[1]} << 16) | (size_t{handshake[2]} << 8) | handshake[3];
      if (size > kMaxClientHello) return status(HelloStatus::kMalformed);
      if (handshake.size() >= 4 + size) {
        return parse_message(std::span(handshake).subspan(4, size));
      }
    }
  }
  return status(HelloStatus::kNeedMore);
}

}  // namespace quarry::sandbox::local::proxy

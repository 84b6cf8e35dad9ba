#include "common/random_id.h"

#include <fmt/format.h>
#include <openssl/rand.h>

#include <stdexcept>

#include "common/hex.h"

namespace quarry {

std::string random_id() {
  return fmt::format("{:012x}", random_bits() & 0xffffffffffffULL);
}

std::string random_secret() {
  unsigned char bytes[32];
  if (RAND_bytes(bytes, sizeof bytes) != 1) {
    // OpenSSL could not seed its generator: never hand out a guessable secret.
    throw std::runtime_error("OpenSSL's random generator failed");
  }
  return to_hex(bytes);
}

}  // namespace quarry

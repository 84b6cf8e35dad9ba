#include "common/random_id.h"

#include <fmt/format.h>
#include <openssl/rand.h>

#include <cstdint>
#include <random>
#include <stdexcept>

#include "common/hex.h"

namespace quarry {

std::string random_id() {
  std::random_device random;
  uint64_t bits = (static_cast<uint64_t>(random()) << 32) | random();
  return fmt::format("{:012x}", bits & 0xffffffffffffULL);
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

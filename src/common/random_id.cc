#include "common/random_id.h"

#include <fmt/format.h>
#include <sys/random.h>

#include <cerrno>
#include <stdexcept>

#include "common/hex.h"

namespace quarry {
namespace {

// Up to 256 bytes never come back short once the kernel's generator is seeded (early boot
// aside, where getrandom blocks until it is); EINTR is the only error to expect.
void fill_random(void* bytes, size_t size) {
  while (::getrandom(bytes, size, 0) != static_cast<ssize_t>(size)) {
    if (errno != EINTR) throw std::runtime_error(fmt::format("getrandom failed: {}", errno));
  }
}

}  // namespace

uint64_t random_bits() {
  uint64_t bits = 0;
  fill_random(&bits, sizeof bits);
  return bits;
}

std::string random_id() {
  return fmt::format("{:012x}", random_bits() & 0xffffffffffffULL);
}

std::string random_secret() {
  unsigned char bytes[32];
  fill_random(bytes, sizeof bytes);
  return to_hex(bytes);
}

}  // namespace quarry

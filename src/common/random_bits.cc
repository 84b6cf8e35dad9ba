// random_bits() apart from random_id.cc, so that what links only it (quarry-init, through the
// file utilities) does not link OpenSSL's generator too.
#include <sys/random.h>

#include <cerrno>
#include <stdexcept>

#include "common/random_id.h"

namespace quarry {

uint64_t random_bits() {
  uint64_t bits = 0;
  // Up to 256 bytes never come back short once the generator is seeded (early boot aside,
  // where it blocks until it is); EINTR is the only error to expect.
  while (::getrandom(&bits, sizeof bits, 0) != sizeof bits) {
    if (errno != EINTR) throw std::runtime_error("getrandom failed");
  }
  return bits;
}

}  // namespace quarry

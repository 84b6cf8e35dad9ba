#include "common/random_id.h"

#include <fmt/format.h>

#include <cstdint>
#include <random>

namespace quarry {

std::string random_id() {
  std::random_device random;
  uint64_t bits = (static_cast<uint64_t>(random()) << 32) | random();
  return fmt::format("{:012x}", bits & 0xffffffffffffULL);
}

}  // namespace quarry

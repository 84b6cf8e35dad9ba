// Random identifiers: short ones (12 lowercase hex digits, 48 bits, from the kernel's
// generator) for sandboxes, conversations and server runs; secrets (256 bits from OpenSSL's
// generator, as 64 hex digits) for API tokens and sessions.
#pragma once

#include <cstdint>
#include <string>

namespace quarry {

// 64 bits from getrandom(2): for names and choices that must not collide or repeat, not for
// secrets. (std::random_device costs ~20 us to construct in a VM: it runs cpuid, which traps.)
uint64_t random_bits();

std::string random_id();
std::string random_secret();

}  // namespace quarry

// Random identifiers, all from the kernel's generator (getrandom(2)): short ones (12 lowercase
// hex digits, 48 bits) for sandboxes, conversations and server runs; secrets (256 bits, as 64 hex
// digits) for API tokens and sessions. Not OpenSSL's generator: it seeds itself from the same
// source, and linking it brought its providers' tables, 16,000 relocations at every start of
// quarry, into the command line.
#pragma once

#include <cstdint>
#include <string>

namespace quarry {

// 64 bits: for names and choices that must not collide or repeat; secrets are longer.
// (std::random_device costs ~20 us to construct in a VM: it runs cpuid, which traps.)
uint64_t random_bits();

std::string random_id();
std::string random_secret();

}  // namespace quarry

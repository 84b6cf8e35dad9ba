// Random identifiers: short ones (12 lowercase hex digits, 48 bits, from the system's random
// device) for sandboxes, conversations and server runs; secrets (256 bits from OpenSSL's
// generator, as 64 hex digits) for API tokens and sessions.
#pragma once

#include <string>

namespace quarry {

std::string random_id();
std::string random_secret();

}  // namespace quarry

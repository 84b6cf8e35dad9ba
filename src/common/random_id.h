// Short random identifiers: 12 lowercase hex digits (48 bits) from the system's random device,
// for sandboxes, conversations and server runs.
#pragma once

#include <string>

namespace quarry {

std::string random_id();

}  // namespace quarry

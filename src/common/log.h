// Logging setup: spdlog to stderr, one line per event.
#pragma once

#include <spdlog/spdlog.h>

#include <string_view>

#include "common/error.h"

namespace quarry {

// Level names: trace, debug, info, warn, error, off.
Result<void> setup_logging(std::string_view level);

}  // namespace quarry

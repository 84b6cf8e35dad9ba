// Connecting to a unix stream socket by its path.
#pragma once

#include <filesystem>

#include "common/error.h"
#include "common/unique_fd.h"

namespace quarry {

// kInvalidArgument when the path is too long for a socket address (the message says to use a
// shorter --state-dir); kUnavailable with the reason alone ("Connection refused") when nothing
// listens there.
Result<UniqueFd> connect_unix(const std::filesystem::path& socket_path);

}  // namespace quarry

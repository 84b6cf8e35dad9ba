// Where quarry keeps its state (sandboxes; later the database and history) and its cache
// (images, wheels): flag, then environment, then a default that depends on who runs it.
#pragma once

#include <filesystem>
#include <optional>

namespace quarry {

// --state-dir, else $QUARRY_STATE_DIR, else /var/lib/quarry as root, else
// $XDG_STATE_HOME/quarry or ~/.local/state/quarry.
std::filesystem::path resolve_state_dir(const std::optional<std::filesystem::path>& flag);

// --cache-dir, else $QUARRY_CACHE_DIR, else /var/cache/quarry as root, else
// $XDG_CACHE_HOME/quarry or ~/.cache/quarry.
std::filesystem::path resolve_cache_dir(const std::optional<std::filesystem::path>& flag);

}  // namespace quarry

#include "config/paths.h"

#include <unistd.h>

#include <cstdlib>

namespace quarry {
namespace {

std::filesystem::path resolve(const std::optional<std::filesystem::path>& flag,
                              const char* env_name, const char* root_default, const char* xdg_name,
                              const char* home_suffix) {
  std::filesystem::path chosen;
  if (flag) {
    chosen = *flag;
  } else if (const char* env = std::getenv(env_name); env && *env) {
    chosen = env;
  } else if (::geteuid() == 0) {
    chosen = root_default;
  } else if (const char* xdg = std::getenv(xdg_name); xdg && *xdg) {
    chosen = std::filesystem::path(xdg) / "quarry";
  } else {
    const char* home = std::getenv("HOME");
    chosen = std::filesystem::path(home ? home : "/tmp") / home_suffix / "quarry";
  }
  // Relative to the working directory; as given if that is gone (what opens it then says so).
  std::error_code error;
  auto absolute = std::filesystem::absolute(chosen, error);
  return (error ? chosen : absolute).lexically_normal();
}

}  // namespace

std::filesystem::path resolve_state_dir(const std::optional<std::filesystem::path>& flag) {
  return resolve(flag, "QUARRY_STATE_DIR", "/var/lib/quarry", "XDG_STATE_HOME", ".local/state");
}

std::filesystem::path resolve_cache_dir(const std::optional<std::filesystem::path>& flag) {
  return resolve(flag, "QUARRY_CACHE_DIR", "/var/cache/quarry", "XDG_CACHE_HOME", ".cache");
}

}  // namespace quarry

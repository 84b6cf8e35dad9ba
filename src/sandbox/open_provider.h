// The provider sandbox.provider names: the local one (sandbox/local) or Daytona
// (sandbox/daytona), for what runs on any provider (quarry serve, quarry ask).
#pragma once

#include <filesystem>
#include <memory>

#include "config/config.h"
#include "sandbox/provider.h"

namespace quarry::sandbox {

struct ProviderPaths {
  std::filesystem::path state_dir;
  std::filesystem::path cache_dir;
};

Result<std::unique_ptr<SandboxProvider>> open_provider(const Config& config,
                                                       const ProviderPaths& paths);

}  // namespace quarry::sandbox

#include "sandbox/open_provider.h"

#include "sandbox/daytona/daytona_provider.h"
#include "sandbox/local/local_provider.h"

namespace quarry::sandbox {

Result<std::unique_ptr<SandboxProvider>> open_provider(const Config& config,
                                                       const ProviderPaths& paths) {
  if (config.sandbox.provider == "daytona") {
    ASSIGN_OR_RETURN(auto provider, daytona::DaytonaProvider::open(config.sandbox));
    return std::unique_ptr<SandboxProvider>(std::move(provider));
  }
  ASSIGN_OR_RETURN(
      auto provider,
      local::LocalProvider::open(
          config.sandbox, {paths.state_dir, paths.cache_dir, {}, config.capacity.overcommit, {}}));
  return std::unique_ptr<SandboxProvider>(std::move(provider));
}

}  // namespace quarry::sandbox

#include "sandbox/open_provider.h"

#include "sandbox/accounts.h"
#include "sandbox/daytona/daytona_provider.h"
#include "sandbox/local/local_provider.h"

namespace quarry::sandbox {

Result<std::unique_ptr<SandboxProvider>> open_provider(const Config& config,
                                                       const ProviderPaths& paths) {
  if (config.sandbox.provider == "daytona" && !config.sandbox.daytona.accounts.empty()) {
    std::vector<ProviderAccounts::Account> accounts;
    const auto& listed = config.sandbox.daytona.accounts;
    for (size_t i = 0; i < listed.size(); ++i) {
      ASSIGN_OR_RETURN(auto key, daytona::api_key_from(
                                     listed[i].api_key_env,
                                     fmt::format("sandbox.daytona.accounts[{}].api_key_env", i),
                                     listed[i].name));
      ASSIGN_OR_RETURN(auto provider,
                       with_context(daytona::DaytonaProvider::open(config.sandbox, std::move(key)),
                                    fmt::format("account {}", listed[i].name)));
      accounts.push_back({listed[i].name, std::move(provider)});
    }
    return std::unique_ptr<SandboxProvider>(
        std::make_unique<ProviderAccounts>(std::move(accounts)));
  }
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

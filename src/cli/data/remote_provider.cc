// The remote providers for Context::provider (sandbox.provider: daytona), linked here and not
// in quarry, which hands such commands to this executable.
#include "cli/data/data_room.h"
#include "sandbox/open_provider.h"

namespace quarry::cli {

Result<std::unique_ptr<sandbox::SandboxProvider>> DataRoom::remote_provider(Context& context) {
  ASSIGN_OR_RETURN(const Config* config, context.config());
  return sandbox::open_provider(*config, {context.state_dir(), context.cache_dir()});
}

}  // namespace quarry::cli

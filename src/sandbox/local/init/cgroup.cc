// The sandbox's cgroup namespace: /proc/self/cgroup inside shows paths below the sandbox's
// own cgroup, never the host's layout.
#include <sched.h>

#include "sandbox/local/init/steps.h"

namespace quarry::sandbox::local::init {

Result<void> enter_cgroup_namespace() {
  if (::unshare(CLONE_NEWCGROUP) != 0) return errno_error("unshare(CLONE_NEWCGROUP)");
  return {};
}

}  // namespace quarry::sandbox::local::init

// The OOM killer and init: when a sandbox runs out of memory the kernel picks a process of its
// cgroup to kill, and that must be the command's, never init (whose death ends the sandbox and
// turns "out of memory" into "the sandbox stopped"). Commands start at oom_score_adj 1000, the
// first choice, which needs no privilege (and makes them the first choice in a host-wide OOM
// too, before quarry or PostgreSQL). init asks for -1000 as well, which takes CAP_SYS_RESOURCE:
// a host that withholds it from root still has the commands' 1000.
#include <sys/prctl.h>

#include "common/file_util.h"
#include "sandbox/local/init/steps.h"

namespace quarry::sandbox::local::init {

Result<void> shield_from_oom_killer() {
  auto shielded = write_control_file("/proc/self/oom_score_adj", "-1000");
  if (!shielded && shielded.error().code == ErrorCode::kPermissionDenied) return {};
  return shielded;
}

Result<void> offer_to_oom_killer() {
  // A child of init is not dumpable (as init is), so its /proc files belong to the host's root
  // and it cannot write its own score; it is about to switch users and exec, which set that
  // again, so it may be dumpable for this.
  if (::prctl(PR_SET_DUMPABLE, 1, 0, 0, 0) != 0) return errno_error("prctl(SET_DUMPABLE)");
  return write_control_file("/proc/self/oom_score_adj", "1000");
}

}  // namespace quarry::sandbox::local::init

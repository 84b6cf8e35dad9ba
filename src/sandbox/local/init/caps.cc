// Capabilities of init: only setuid, setgid and kill survive, which is what starting and
// stopping commands as the sandbox user takes. Commands lose even those when they switch to
// that user, and the empty bounding set means no program can gain any back.
#include <linux/capability.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "sandbox/local/init/steps.h"

namespace quarry::sandbox::local::init {

Result<void> drop_privileges() {
  for (int cap = 0; cap <= CAP_LAST_CAP; ++cap) {
    if (::prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 && errno != EINVAL) {
      return errno_error("prctl(PR_CAPBSET_DROP, {})", cap);
    }
  }
  if (::prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0) {
    return errno_error("prctl(PR_CAP_AMBIENT_CLEAR_ALL)");
  }
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2] = {};
  const uint32_t kept = (1u << CAP_SETUID) | (1u << CAP_SETGID) | (1u << CAP_KILL);
  data[0].effective = kept;
  data[0].permitted = kept;
  if (::syscall(SYS_capset, &header, data) != 0) return errno_error("capset");
  if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return errno_error("prctl(NO_NEW_PRIVS)");
  // Not dumpable: commands (same uid inside) cannot open init's /proc files or ptrace it.
  if (::prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0) return errno_error("prctl(SET_DUMPABLE)");
  return {};
}

bool drop_all_capabilities() {
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct none[2] = {};
  return ::syscall(SYS_capset, &header, none) == 0;
}

}  // namespace quarry::sandbox::local::init

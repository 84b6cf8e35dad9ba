// Loads the seccomp filter the host built (see sandbox/local/seccomp_filter.h).
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>

#include "sandbox/local/init/steps.h"

namespace quarry::sandbox::local::init {

Result<void> load_seccomp_filter(const std::vector<uint8_t>& program) {
  if (program.empty() || program.size() % sizeof(sock_filter) != 0) {
    return make_error(ErrorCode::kInternal, "the seccomp filter has a bad size ({} bytes)",
                      program.size());
  }
  sock_fprog fprog{static_cast<unsigned short>(program.size() / sizeof(sock_filter)),
                   reinterpret_cast<sock_filter*>(const_cast<uint8_t*>(program.data()))};
  if (::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &fprog, 0, 0) != 0) {
    return errno_error("prctl(PR_SET_SECCOMP)");
  }
  return {};
}

}  // namespace quarry::sandbox::local::init

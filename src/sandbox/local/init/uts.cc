// The sandbox's own hostname, in its UTS namespace.
#include <unistd.h>

#include "sandbox/local/init/steps.h"

namespace quarry::sandbox::local::init {

Result<void> set_hostname(const std::string& hostname) {
  if (::sethostname(hostname.data(), hostname.size()) != 0) {
    return errno_error("sethostname('{}')", hostname);
  }
  return {};
}

}  // namespace quarry::sandbox::local::init

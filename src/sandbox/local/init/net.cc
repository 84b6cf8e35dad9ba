// Networking inside the sandbox: a private network namespace with loopback only.
#include <net/if.h>
#include <netinet/in.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

#include <cstring>

#include "sandbox/local/init/steps.h"

namespace quarry::sandbox::local::init {

Result<void> bring_up_loopback() {
  UniqueFd sock(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!sock) return errno_error("socket(AF_INET) for loopback setup");
  ifreq request{};
  std::strncpy(request.ifr_name, "lo", IFNAMSIZ - 1);
  if (::ioctl(sock.get(), SIOCGIFFLAGS, &request) != 0) return errno_error("SIOCGIFFLAGS(lo)");
  request.ifr_flags |= IFF_UP | IFF_RUNNING;
  if (::ioctl(sock.get(), SIOCSIFFLAGS, &request) != 0) return errno_error("SIOCSIFFLAGS(lo)");
  return {};
}

}  // namespace quarry::sandbox::local::init

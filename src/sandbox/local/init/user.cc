// The sandbox's user namespace: root inside is an unprivileged id range outside.
#include <grp.h>
#include <sched.h>
#include <unistd.h>

#include "sandbox/local/init/steps.h"

namespace quarry::sandbox::local::init {

Result<void> enter_user_namespace(int setup_channel) {
  if (::unshare(CLONE_NEWUSER) != 0) return errno_error("unshare(CLONE_NEWUSER)");
  // Only a process in the parent namespace may write a map that is not just our own id.
  RETURN_IF_ERROR(protocol::send(setup_channel, {{"type", "userns"}}));
  ASSIGN_OR_RETURN(auto reply, protocol::receive(setup_channel));
  if (reply.body.value("type", "") != "maps_written") {
    return make_error(ErrorCode::kInternal, "expected maps_written from the host, got {}",
                      reply.body.dump());
  }
  if (::setresgid(0, 0, 0) != 0) return errno_error("setresgid(0)");
  if (::setresuid(0, 0, 0) != 0) return errno_error("setresuid(0)");
  if (::setgroups(0, nullptr) != 0) return errno_error("setgroups([])");
  return {};
}

}  // namespace quarry::sandbox::local::init

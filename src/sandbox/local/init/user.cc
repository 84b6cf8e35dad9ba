// The sandbox's user namespace: root inside is an unprivileged id range outside.
#include <grp.h>
#include <sched.h>
#include <unistd.h>

#include <string_view>

#include "common/file_util.h"
#include "sandbox/local/init/steps.h"

namespace quarry::sandbox::local::init {
namespace {

// Per-user-namespace limits (/proc/sys/user) that matter to the host. The kernel charges what
// a namespace's users make against that namespace's limits and then against its owner's in the
// parent, the host: so the namespace is made by the sandbox's own host uid, not host root (whose
// inotify instances a sandbox could otherwise use up), and these are zero inside. Analysis code
// needs none of them; a nested user namespace is refused as bubblewrap's --disable-userns does.
constexpr std::string_view kZeroLimits[] = {
    "max_inotify_instances", "max_inotify_watches", "max_fanotify_groups",
    "max_fanotify_marks",    "max_user_namespaces",
};

}  // namespace

Result<void> enter_user_namespace(const protocol::Setup& setup, int setup_channel) {
  // The namespace's owner is whoever makes it: the sandbox's root id on the host.
  if (::setresgid(setup.host_id_base, setup.host_id_base, setup.host_id_base) != 0) {
    return errno_error("setresgid({})", setup.host_id_base);
  }
  if (::setresuid(setup.host_id_base, setup.host_id_base, setup.host_id_base) != 0) {
    return errno_error("setresuid({})", setup.host_id_base);
  }
  if (::unshare(CLONE_NEWUSER) != 0) return errno_error("unshare(CLONE_NEWUSER)");
  // Only a process in the parent namespace may write a map that is not just our own id.
  RETURN_IF_ERROR(protocol::send(setup_channel, {{"type", "userns"}}));
  ASSIGN_OR_RETURN(auto reply, protocol::receive(setup_channel));
  if (protocol::message_type(reply.body) != "maps_written") {
    return make_error(ErrorCode::kInternal, "expected maps_written from the host, got {}",
                      reply.body.dump());
  }
  if (::setresgid(0, 0, 0) != 0) return errno_error("setresgid(0)");
  if (::setresuid(0, 0, 0) != 0) return errno_error("setresuid(0)");
  if (::setgroups(0, nullptr) != 0) return errno_error("setgroups([])");
  for (std::string_view name : kZeroLimits) {
    auto set = write_control_file(fmt::format("/proc/sys/user/{}", name), "0");
    // A kernel built without inotify or fanotify has no such limit to set.
    if (!set && set.error().code != ErrorCode::kNotFound) return set;
  }
  return {};
}

}  // namespace quarry::sandbox::local::init

// quarry-init: PID 1 of a sandbox. It receives its setup from the host on fd 3, builds the
// sandbox around itself step by step, reports ready, then starts commands for the host and
// reaps every process that ends inside.
#include <signal.h>
#include <unistd.h>

#include "sandbox/local/init/steps.h"

namespace init = quarry::sandbox::local::init;
namespace protocol = quarry::sandbox::local::protocol;
using quarry::Result;
using quarry::UniqueFd;

namespace {

Result<UniqueFd> contain(const protocol::Setup& setup, const std::vector<UniqueFd>& layer_trees,
                         int channel) {
  RETURN_IF_ERROR(init::shield_from_oom_killer());
  RETURN_IF_ERROR(init::enter_cgroup_namespace());
  RETURN_IF_ERROR(init::mount_root_filesystem(setup, layer_trees));
  RETURN_IF_ERROR(init::make_user_directories(setup));
  ASSIGN_OR_RETURN(UniqueFd listener, init::listen_for_host(setup.control_socket));
  RETURN_IF_ERROR(init::set_hostname(setup.hostname));
  RETURN_IF_ERROR(init::bring_up_loopback());
  RETURN_IF_ERROR(init::pivot_into_root(setup.root_dir));
  RETURN_IF_ERROR(init::enter_user_namespace(setup, channel));
  RETURN_IF_ERROR(init::drop_privileges());
  RETURN_IF_ERROR(init::load_seccomp_filter(setup.seccomp_filter));
  return listener;
}

}  // namespace

int main() {
  // Signals reach PID 1 only from the host (the kernel drops the rest); SIGCHLD is read
  // through a signalfd in serve(), everything else stays blocked.
  sigset_t all;
  sigfillset(&all);
  sigprocmask(SIG_BLOCK, &all, nullptr);

  const int channel = protocol::kSetupFd;
  auto message = protocol::receive(channel);
  if (!message) return 2;
  auto setup = protocol::setup_from_json(message->body);
  if (!setup) {
    (void)protocol::send(channel, {{"type", "error"}, {"message", setup.error().message}});
    return 2;
  }
  // One tree per frozen layer, then the image's.
  if (message->fds.size() != setup->frozen_dirs.size() + 1) {
    (void)protocol::send(
        channel, {{"type", "error"},
                  {"message", fmt::format("the setup came with {} layer trees "
                                          "for {} frozen layers and the image",
                                          message->fds.size(), setup->frozen_dirs.size())}});
    return 2;
  }
  auto listener = contain(*setup, message->fds, channel);
  message->fds.clear();
  if (!listener) {
    (void)protocol::send(channel, {{"type", "error"}, {"message", listener.error().message}});
    return 1;
  }
  if (!protocol::send(channel, {{"type", "ready"}})) return 1;
  ::close(channel);
  init::serve(std::move(*listener), *setup);
}

// The steps quarry-init takes to turn itself into a sandbox, one file per kernel mechanism.
// main.cc runs them in order; each says exactly which call failed.
#pragma once

#include <cstdint>
#include <vector>

#include "common/error.h"
#include "common/unique_fd.h"
#include "sandbox/local/protocol.h"

namespace quarry::sandbox::local::init {

// cgroup.cc: a cgroup namespace rooted at the sandbox's cgroup, where the host has put us.
Result<void> enter_cgroup_namespace();

// oom.cc: a command is the OOM killer's first choice (1000, set before it starts), init never
// (-1000, where the host grants root CAP_SYS_RESOURCE).
Result<void> shield_from_oom_killer();
Result<void> offer_to_oom_killer();

// mounts.cc: overlay root (the image and the frozen layers above it, as the idmapped trees the
// host sent, frozen layers top first and the image last, below; the writable layer above),
// /proc, a minimal /dev.
Result<void> mount_root_filesystem(const protocol::Setup& setup,
                                   const std::vector<UniqueFd>& layer_trees);
// mounts.cc: the sandbox user's home and the configured directories, owned by that user.
Result<void> make_user_directories(const protocol::Setup& setup);
// mounts.cc: makes the new root '/' and detaches the host's filesystem.
Result<void> pivot_into_root(const std::string& root_dir);

// net.cc: the network namespace starts with loopback down; bring it up, and nothing else.
Result<void> bring_up_loopback();
// uts.cc
Result<void> set_hostname(const std::string& hostname);

// user.cc: a user namespace, created last so that every mount and namespace above stays owned
// by the host and cannot be changed from inside; made by the sandbox's host root id, so what it
// uses is charged there, with inotify, fanotify and nested user namespaces limited to zero
// inside. The host writes the id maps while we wait.
Result<void> enter_user_namespace(const protocol::Setup& setup, int setup_channel);

// caps.cc: keeps only what init needs to start commands as the sandbox user (setuid, setgid,
// kill), drops the rest and the bounding set, sets no_new_privs and makes init undumpable.
Result<void> drop_privileges();
// caps.cc: in a command's process, drops even those (for a command that stays root); false with
// errno set when the kernel refuses.
bool drop_all_capabilities();

// seccomp.cc: loads the host-built filter; every command inherits it.
Result<void> load_seccomp_filter(const std::vector<uint8_t>& program);

// server.cc: listens on the host-visible control socket (call before pivot_into_root).
Result<UniqueFd> listen_for_host(const std::string& socket_path);
// server.cc: serves exec requests until killed. Never returns.
[[noreturn]] void serve(UniqueFd listener, const protocol::Setup& setup);

}  // namespace quarry::sandbox::local::init

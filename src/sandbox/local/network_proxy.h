// The host's side of a sandbox's network proxy (quarry-proxy, proxy/proxy.h): started when a
// sandbox with `network.mode: allowlist` is created, asked after each command what it refused.
//
//   <state>/sandboxes/<id>/proxy.sock   its control socket
//   <state>/sandboxes/<id>/proxy.log    what it allowed and refused
//   <root>/quarry/<id>/proxy            its cgroup: the sandbox's limits, killed with it
#pragma once

#include <sys/types.h>

#include <filesystem>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/unique_fd.h"
#include "sandbox/provider.h"

namespace quarry::sandbox::local {

// Where a sandbox's programs find it: HTTP_PROXY and HTTPS_PROXY.
inline constexpr std::string_view kProxyUrl = "http://127.0.0.1:3128";

struct ProxyLaunch {
  std::filesystem::path binary;  // quarry-proxy
  pid_t init_pid = 0;            // the sandbox's init: its network namespace
  std::vector<UniqueFd> cgroup_procs;
  std::filesystem::path control_socket;
  std::filesystem::path log;
  std::vector<std::string> allow;
};

// Starts the proxy and waits until it listens (a few milliseconds), or says why it did not.
Result<void> start_network_proxy(ProxyLaunch launch);

// What the proxy counted: connections allowed and refused since the sandbox started, the
// number of the newest refusal, and the refusals after `since` that it still keeps.
struct NetworkActivity {
  uint64_t allowed = 0;
  uint64_t denied = 0;
  uint64_t seq = 0;
  std::vector<NetworkDenial> denials;
};

Result<NetworkActivity> network_activity(const std::filesystem::path& control_socket,
                                         uint64_t since);

// What a command's connections met: the refusals between `before` (asked as it started) and
// now, into `result` (denied_connections, denials).
void add_network_denials(const std::filesystem::path& control_socket, const NetworkActivity& before,
                         ExecResult& result);

}  // namespace quarry::sandbox::local

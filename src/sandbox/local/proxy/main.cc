// quarry-proxy: the network of one sandbox with `network.mode: allowlist` (see proxy.h).
//
// Started by the local provider when it creates the sandbox, with the sandbox's network
// namespace and the cgroup.procs files of its `proxy` cgroup open. In this order it joins that
// cgroup (so the sandbox pays for its own network and the proxy dies with it), listens on
// 127.0.0.1:3128 inside the sandbox's namespace and on its control socket, drops to nobody,
// leaves its parent (the sandbox outlives whoever created it) and says "ready" on --ready.
#include <fcntl.h>
#include <grp.h>
#include <netinet/in.h>
#include <sched.h>
#include <spdlog/spdlog.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <boost/asio/io_context.hpp>
#include <cstring>

#include "common/error.h"
#include "common/unique_fd.h"
#include "config/allowlist.h"
#include "sandbox/local/proxy/proxy.h"

namespace {

using namespace quarry;

constexpr uid_t kNobody = 65534;
constexpr uint16_t kProxyPort = 3128;

Result<void> join_cgroup(const std::vector<int>& procs_fds) {
  for (int fd : procs_fds) {
    if (::write(fd, "0", 1) != 1) return errno_error("joining the sandbox's proxy cgroup");
    ::close(fd);
  }
  return {};
}

// A TCP socket listening on the sandbox's loopback: made inside its network namespace, it
// stays there when this thread goes back to the host's.
Result<UniqueFd> listen_in(int netns_fd) {
  UniqueFd host_ns(::open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC));
  if (!host_ns) return errno_error("open /proc/self/ns/net");
  if (::setns(netns_fd, CLONE_NEWNET) != 0) return errno_error("setns into the sandbox's network");
  UniqueFd listener(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  const int saved = errno;
  if (::setns(host_ns.get(), CLONE_NEWNET) != 0) return errno_error("setns back to the host's");
  if (!listener) {
    errno = saved;
    return errno_error("socket(AF_INET) in the sandbox's network");
  }
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(kProxyPort);
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::bind(listener.get(), reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
    return errno_error("bind 127.0.0.1:{} in the sandbox", kProxyPort);
  }
  if (::listen(listener.get(), 128) != 0) return errno_error("listen");
  return listener;
}

Result<UniqueFd> listen_control(const std::string& path) {
  UniqueFd listener(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!listener) return errno_error("socket(AF_UNIX)");
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (path.size() >= sizeof address.sun_path) {
    return make_error(ErrorCode::kInvalidArgument, "control socket path '{}' is too long", path);
  }
  std::memcpy(address.sun_path, path.c_str(), path.size() + 1);
  ::unlink(path.c_str());
  const mode_t old_mask = ::umask(077);
  const int bound = ::bind(listener.get(), reinterpret_cast<sockaddr*>(&address), sizeof address);
  ::umask(old_mask);
  if (bound != 0) return errno_error("bind '{}'", path);
  if (::listen(listener.get(), 16) != 0) return errno_error("listen '{}'", path);
  return listener;
}

Result<void> drop_privileges() {
  // Commands of the sandbox run at 1000, so the OOM killer takes them before the proxy.
  if (int fd = ::open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC); fd >= 0) {
    (void)!::write(fd, "-500", 4);
    ::close(fd);
  }
  if (::setgroups(0, nullptr) != 0) return errno_error("setgroups");
  if (::setresgid(kNobody, kNobody, kNobody) != 0) return errno_error("setresgid(nobody)");
  if (::setresuid(kNobody, kNobody, kNobody) != 0) return errno_error("setresuid(nobody)");
  if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return errno_error("PR_SET_NO_NEW_PRIVS");
  // No other process of nobody's may ptrace it or read its memory.
  if (::prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0) return errno_error("PR_SET_DUMPABLE");
  return {};
}

int fail(const Error& error) {
  spdlog::error("{}", error.message);
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "quarry-proxy: one sandbox's HTTP proxy to its network allowlist (started by quarry)"};
  int netns_fd = -1;
  int ready_fd = -1;
  std::vector<int> procs_fds;
  std::string control_path;
  std::vector<std::string> allow;
  app.add_option("--netns", netns_fd, "descriptor of the sandbox's network namespace")->required();
  app.add_option("--cgroup-procs", procs_fds, "descriptors of the proxy cgroup's cgroup.procs");
  app.add_option("--control", control_path, "path of the control socket")->required();
  app.add_option("--ready", ready_fd, "descriptor to write \"ready\" to")->required();
  app.add_option("--allow", allow, "a domain of the allowlist")->required();
  CLI11_PARSE(app, argc, argv);
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %l %v");

  quarry::sandbox::local::proxy::ProxyOptions options;
  for (const auto& entry : allow) {
    auto canonical = parse_allow_entry(entry);
    if (!canonical) return fail(canonical.error());
    options.allow.push_back(*canonical);
  }
  if (auto joined = join_cgroup(procs_fds); !joined) return fail(joined.error());
  auto listener = listen_in(netns_fd);
  if (!listener) return fail(listener.error());
  ::close(netns_fd);
  auto control = listen_control(control_path);
  if (!control) return fail(control.error());
  if (auto dropped = drop_privileges(); !dropped) return fail(dropped.error());

  // The creator waits for this process to exit; the child carries on without a parent.
  const pid_t child = ::fork();
  if (child < 0) return fail(errno_error("fork").error());
  if (child > 0) _exit(0);
  ::setsid();

  boost::asio::io_context io(1);
  options.listen_fd = listener->release();
  options.control_fd = control->release();
  quarry::sandbox::local::proxy::Proxy proxy(io, std::move(options));
  proxy.start();
  spdlog::info("listening on 127.0.0.1:{} of the sandbox; allowed: {}", kProxyPort,
               fmt::join(allow, ", "));
  if (::write(ready_fd, "ready\n", 6) != 6) return fail(errno_error("write ready").error());
  ::close(ready_fd);
  io.run();
  return 0;
}

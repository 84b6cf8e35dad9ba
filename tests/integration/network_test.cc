// network.mode allowlist: a sandbox reaches the names of its allowlist through quarry-proxy and
// nothing else. The far side is a test host in a network namespace this test makes (a veth pair
// on 10.213.N.0/30), with an HTTP and HTTPS server and a package index; the names point to it
// through an /etc/hosts of the test's own, bind-mounted in a private mount namespace of the
// quarry command that creates the sandbox (its proxy lives on in that namespace). Nothing
// outside this machine is addressed, and that the sandbox has no route is read from its routing
// table.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "child_process.h"
#include "sandbox/metering.h"
#include "sandbox_environment.h"

namespace quarry::testing {
namespace {

// Runs a shell command on the host; its output, or a failure of the test.
std::string host_command(const std::string& command) {
  std::string output;
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (!pipe) {
    ADD_FAILURE() << "popen " << command;
    return "";
  }
  char buffer[4096];
  while (size_t n = std::fread(buffer, 1, sizeof buffer, pipe))
    output.append(buffer, n);
  const int status = ::pclose(pipe);
  EXPECT_EQ(status, 0) << command << ": " << output;
  return output;
}

// Whether `pid` is a live process (not gone, not a zombie).
bool running(pid_t pid) {
  std::ifstream stat(fmt::format("/proc/{}/stat", pid));
  std::string text;
  if (!std::getline(stat, text)) return false;
  const size_t end = text.rfind(')');
  return end != std::string::npos && end + 2 < text.size() && text[end + 2] != 'Z';
}

class TestHost {
 public:
  TestHost()
      : index_(20 + ::getpid() % 200),
        netns_(fmt::format("quarry-test-{}", ::getpid())),
        veth_(fmt::format("qt{}", ::getpid() % 10000000)),
        dir_(SandboxEnvironment::get().state_dir() / fmt::format("test-host-{}", ::getpid())) {
    std::filesystem::create_directories(dir_);
    host_command(fmt::format("ip netns add {}", netns_));
    host_command(fmt::format("ip link add {}h type veth peer name {}s", veth_, veth_));
    host_command(fmt::format("ip link set {}s netns {}", veth_, netns_));
    host_command(fmt::format("ip addr add {}/30 dev {}h && ip link set {}h up", host_address(),
                             veth_, veth_));
    host_command(fmt::format(
        "ip -n {0} addr add {1}/30 dev {2}s && ip -n {0} link set {2}s up && ip -n {0} link set "
        "lo up",
        netns_, address(), veth_));
    server_ = std::make_unique<ChildProcess>(
        std::vector<std::string>{
            "/usr/sbin/ip", "netns", "exec", netns_, "python3",
            std::string(QUARRY_SOURCE_DIR) + "/tests/integration/network_test_host.py",
            dir_.string()},
        dir_ / "server.log");
    ready_ = server_->line_with("ready", std::chrono::seconds(30)).has_value();
    std::ofstream hosts(hosts_file());
    hosts << "127.0.0.1 localhost\n"
          << address()
          << " allowed.quarry.test denied.quarry.test a.wild.quarry.test wild.quarry.test\n";
  }
  ~TestHost() {
    server_.reset();
    ::system(fmt::format("ip netns del {} 2>/dev/null; ip link del {}h 2>/dev/null", netns_, veth_)
                 .c_str());
  }

  bool ready() const { return ready_; }
  std::string address() const { return fmt::format("10.213.{}.2", index_); }
  std::string host_address() const { return fmt::format("10.213.{}.1", index_); }
  std::filesystem::path hosts_file() const { return dir_ / "hosts"; }
  const std::filesystem::path& dir() const { return dir_; }

 private:
  int index_;
  std::string netns_;
  std::string veth_;
  std::filesystem::path dir_;
  std::unique_ptr<ChildProcess> server_;
  bool ready_ = false;
};

class Network : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { host_ = new TestHost(); }
  static void TearDownTestSuite() {
    delete host_;
    host_ = nullptr;
  }

  void SetUp() override {
    ASSERT_TRUE(host_->ready()) << "the test host did not start";
    // The sandboxes' volume is mounted by the first sandbox's creator, in its mount namespace:
    // here, not in the private one of the `quarry sandbox create` below.
    static bool mounted = [] {
      ScopedSandbox mounts_the_volume;
      return true;
    }();
    (void)mounted;
  }
  void TearDown() override {
    for (const auto& id : sandboxes_)
      (void)SandboxEnvironment::get().provider().destroy(id);
  }

  // A sandbox with `allow` created by `quarry sandbox create`, as a user would, in a mount
  // namespace where the test host's names resolve.
  std::string create(const std::vector<std::string>& allow) {
    auto& environment = SandboxEnvironment::get();
    const auto config = host_->dir() / fmt::format("config-{}.yml", sandboxes_.size());
    std::ofstream(config) << "sandbox:\n  network:\n    mode: allowlist\n    allow: ["
                          << fmt::format("\"{}\"", fmt::join(allow, "\", \"")) << "]\n";
    ChildProcess create(
        {"/usr/bin/unshare", "--mount", "--propagation", "private", "/bin/sh", "-c",
         "mount --bind \"$0\" /etc/hosts && exec \"$@\"", host_->hosts_file().string(),
         environment.quarry_binary().string(), "--config", config.string(), "--state-dir",
         environment.state_dir().string(), "sandbox", "create"},
        host_->dir() / "create.log");
    auto id = create.line();
    std::ifstream log(host_->dir() / "create.log");
    EXPECT_EQ(create.wait(), 0) << std::string(std::istreambuf_iterator<char>(log), {});
    if (!id) {
      ADD_FAILURE() << "quarry sandbox create printed no id";
      return "";
    }
    sandboxes_.push_back(*id);
    return *id;
  }

  static sandbox::ExecResult python_in(const std::string& id, const std::string& code) {
    sandbox::ExecRequest request;
    request.argv = {"python3", "-c", code};
    request.env = {{"PIP_DISABLE_PIP_VERSION_CHECK", "1"}};
    request.timeout = std::chrono::seconds(120);
    auto result = SandboxEnvironment::get().provider().exec(id, request);
    EXPECT_TRUE(result) << result.error().message;
    return result ? *result : sandbox::ExecResult{};
  }

  static TestHost* host_;
  std::vector<std::string> sandboxes_;
};

TestHost* Network::host_ = nullptr;

// Fetches each URL through the proxy the environment names; prints "ok BODY" or "error WHY".
constexpr std::string_view kFetch = R"py(
import ssl, sys, urllib.request
context = ssl.create_default_context()
context.check_hostname = False
context.verify_mode = ssl.CERT_NONE
for url in sys.argv[1:]:
    try:
        body = urllib.request.urlopen(url, timeout=20, context=context).read().decode().strip()
        print("ok", url, body)
    except Exception as error:
        detail = error.read().decode().strip() if hasattr(error, "read") else ""
        print("error", url, error, detail)
)py";

std::string fetch(const std::string& id, const std::vector<std::string>& urls,
                  sandbox::ExecResult* exec = nullptr) {
  sandbox::ExecRequest request;
  request.argv = {"python3", "-c", std::string(kFetch), "fetch"};
  request.argv.insert(request.argv.end(), urls.begin(), urls.end());
  request.timeout = std::chrono::seconds(60);
  auto result = SandboxEnvironment::get().provider().exec(id, request);
  EXPECT_TRUE(result) << result.error().message;
  if (!result) return "";
  EXPECT_EQ(result->exit_code, 0) << result->stderr_text;
  if (exec) *exec = *result;
  return result->stdout_text;
}

TEST_F(Network, AnAllowedNameIsReachedOverHttpAndHttps) {
  const auto id = create({"allowed.quarry.test"});
  ASSERT_FALSE(id.empty());
  sandbox::ExecResult exec;
  const auto out =
      fetch(id, {"http://allowed.quarry.test:8080/hello", "https://allowed.quarry.test:8443/hello"},
            &exec);
  EXPECT_NE(out.find("ok http://allowed.quarry.test:8080/hello hello from the test host"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("ok https://allowed.quarry.test:8443/hello hello from the test host"),
            std::string::npos)
      << out;
  EXPECT_EQ(exec.denied_connections, 0u);
}

TEST_F(Network, ADeniedNameAndAnAddressAreRefusedAndToldWithTheExec) {
  const auto id = create({"allowed.quarry.test", "*.wild.quarry.test"});
  ASSERT_FALSE(id.empty());
  sandbox::ExecResult exec;
  const auto out =
      fetch(id,
            {"http://denied.quarry.test:8080/hello",
             fmt::format("http://{}:8080/hello", host_->address()),
             "https://wild.quarry.test:8443/hello", "https://a.wild.quarry.test:8443/hello"},
            &exec);
  EXPECT_NE(out.find("error http://denied.quarry.test:8080/hello HTTP Error 403: Forbidden "
                     "quarry: denied.quarry.test is not in the sandbox's network allowlist"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("is an IP address, not a name"), std::string::npos) << out;
  // A wildcard lets names below it through, not the name itself.
  EXPECT_NE(out.find("error https://wild.quarry.test:8443/hello"), std::string::npos) << out;
  EXPECT_NE(out.find("ok https://a.wild.quarry.test:8443/hello hello from the test host"),
            std::string::npos)
      << out;

  ASSERT_EQ(exec.denied_connections, 3u);
  ASSERT_EQ(exec.denials.size(), 3u);
  EXPECT_EQ(exec.denials[0].host, "denied.quarry.test");
  EXPECT_EQ(exec.denials[0].port, 8080);
  EXPECT_EQ(exec.denials[1].host, host_->address());
  EXPECT_EQ(exec.denials[2].host, "wild.quarry.test");
  EXPECT_EQ(exec.denials[2].port, 8443);
  const auto message = sandbox::network_message(exec);
  ASSERT_TRUE(message);
  EXPECT_NE(message->find("Network: 3 connections refused by the sandbox's allowlist"),
            std::string::npos)
      << *message;

  // The next command starts from nothing refused.
  sandbox::ExecResult next;
  fetch(id, {"http://allowed.quarry.test:8080/hello"}, &next);
  EXPECT_EQ(next.denied_connections, 0u);
  EXPECT_TRUE(next.denials.empty());

  // The sandbox's counts, as `quarry sandbox ls` shows them.
  auto& environment = SandboxEnvironment::get();
  ChildProcess ls({environment.quarry_binary().string(), "--state-dir",
                   environment.state_dir().string(), "sandbox", "ls", "--json"});
  const auto listed = nlohmann::json::parse(ls.rest(), nullptr, false);
  ASSERT_EQ(ls.wait(), 0);
  ASSERT_TRUE(listed.is_array()) << listed.dump();
  bool seen = false;
  for (const auto& sandbox : listed) {
    if (sandbox["id"] != id) continue;
    seen = true;
    EXPECT_EQ(sandbox["network"]["mode"], "allowlist");
    EXPECT_EQ(sandbox["network"]["denied"], 3) << sandbox.dump();
    EXPECT_EQ(sandbox["network"]["allowed"], 2) << sandbox.dump();
  }
  EXPECT_TRUE(seen) << listed.dump();
}

// Code in the sandbox chooses what it asks the proxy for: neither long names of any bytes nor
// many of them keep its refusals from being told with the command.
TEST_F(Network, AnyNumberOfRefusalsOfAnyBytesIsToldWithTheExec) {
  const auto id = create({"allowed.quarry.test"});
  ASSERT_FALSE(id.empty());
  sandbox::ExecRequest request;
  request.argv = {"python3", "-c", R"py(
import socket
for _ in range(40):
    with socket.create_connection(("127.0.0.1", 3128)) as proxy:
        proxy.sendall(b"CONNECT " + b"\xff" * 300 + b":443 HTTP/1.1\r\n\r\n")
        proxy.recv(4096)
print("asked")
)py"};
  request.timeout = std::chrono::seconds(60);
  auto exec = SandboxEnvironment::get().provider().exec(id, request);
  ASSERT_TRUE(exec) << exec.error().message;
  ASSERT_EQ(exec->stdout_text, "asked\n") << exec->stderr_text;
  EXPECT_EQ(exec->denied_connections, 40u);
  ASSERT_EQ(exec->denials.size(), sandbox::kMaxDenialsKept);
  for (const auto& denial : exec->denials) {
    EXPECT_EQ(denial.host, std::string(300, '?'));
    EXPECT_EQ(denial.port, 443);
  }
}

TEST_F(Network, ATlsServerNameOutsideTheAllowlistIsRefusedInsideAnAllowedTunnel) {
  const auto id = create({"allowed.quarry.test"});
  ASSERT_FALSE(id.empty());
  // CONNECT to an allowed name, then a ClientHello for another name on the same address.
  const auto exec = python_in(id, R"py(
import socket, ssl
raw = socket.create_connection(("127.0.0.1", 3128))
raw.sendall(b"CONNECT allowed.quarry.test:8443 HTTP/1.1\r\nHost: allowed.quarry.test:8443\r\n\r\n")
print(raw.recv(1024).split(b"\r\n")[0].decode())
context = ssl.create_default_context()
context.check_hostname = False
context.verify_mode = ssl.CERT_NONE
try:
    context.wrap_socket(raw, server_hostname="denied.quarry.test")
    print("handshake done")
except ssl.SSLError as error:
    print("refused:", error.reason)
)py");
  EXPECT_NE(exec.stdout_text.find("HTTP/1.1 200 Connection established"), std::string::npos)
      << exec.stdout_text << exec.stderr_text;
  EXPECT_NE(exec.stdout_text.find("refused: TLSV1_ALERT_ACCESS_DENIED"), std::string::npos)
      << exec.stdout_text << exec.stderr_text;
  ASSERT_EQ(exec.denied_connections, 1u);
  EXPECT_NE(exec.denials[0].reason.find("the TLS server name denied.quarry.test"),
            std::string::npos)
      << exec.denials[0].reason;
}

TEST_F(Network, TheSandboxHasNoRouteNoDnsAndNoWayAroundTheProxy) {
  const auto id = create({"allowed.quarry.test"});
  ASSERT_FALSE(id.empty());
  const auto exec = python_in(id, fmt::format(R"py(
import errno, socket
routes = [line.split()[:2] for line in open("/proc/net/route").read().splitlines()[1:]]
print("ipv4 routes:", routes)
v6 = [line.split()[-1] for line in open("/proc/net/ipv6_route").read().splitlines()]
print("ipv6 route devices:", sorted(set(v6)))
print("interfaces:", sorted(name for _, name in socket.if_nameindex()))
try:
    socket.create_connection(("{0}", 8080), timeout=5)
    print("direct: connected")
except OSError as error:
    print("direct:", errno.errorcode.get(error.errno, error.errno))
try:
    socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"x", ("{0}", 53))
    print("udp: sent")
except OSError as error:
    print("udp:", errno.errorcode.get(error.errno, error.errno))
try:
    print("dns:", socket.getaddrinfo("allowed.quarry.test", 8080))
except socket.gaierror as error:
    print("dns: failed", error)
)py",
                                              host_->address()));
  const auto& out = exec.stdout_text;
  EXPECT_NE(out.find("ipv4 routes: []"), std::string::npos) << out << exec.stderr_text;
  EXPECT_NE(out.find("ipv6 route devices: ['lo']"), std::string::npos) << out;
  EXPECT_NE(out.find("interfaces: ['lo']"), std::string::npos) << out;
  EXPECT_NE(out.find("direct: ENETUNREACH"), std::string::npos) << out;
  EXPECT_NE(out.find("udp: ENETUNREACH"), std::string::npos) << out;
  EXPECT_NE(out.find("dns: failed"), std::string::npos) << out;
}

TEST_F(Network, PipInstallsFromAnAllowedIndexAndNotFromAnother) {
  const auto id = create({"allowed.quarry.test"});
  ASSERT_FALSE(id.empty());
  auto pip = [&](const std::string& index, const std::string& target) {
    return python_in(id, fmt::format(R"py(
import subprocess, sys
done = subprocess.run([sys.executable, "-m", "pip", "install", "--no-cache-dir", "--target",
                       "{1}", "--index-url", "http://{0}:8080/simple", "--trusted-host", "{0}",
                       "--retries", "0", "--timeout", "20", "quarry-probe"],
                      capture_output=True, text=True)
print("pip exit", done.returncode)
print(done.stdout[-2000:], done.stderr[-2000:])
sys.path.insert(0, "{1}")
try:
    import quarry_probe
    print("imported:", quarry_probe.VALUE)
except ImportError as error:
    print("not imported:", error)
)py",
                                     index, target));
  };
  const auto allowed = pip("allowed.quarry.test", "/home/sandbox/from-allowed");
  EXPECT_NE(allowed.stdout_text.find("pip exit 0"), std::string::npos) << allowed.stdout_text;
  EXPECT_NE(allowed.stdout_text.find("imported: probe from the test index"), std::string::npos)
      << allowed.stdout_text;
  EXPECT_EQ(allowed.denied_connections, 0u);

  const auto denied = pip("denied.quarry.test", "/home/sandbox/from-denied");
  EXPECT_EQ(denied.stdout_text.find("pip exit 0"), std::string::npos) << denied.stdout_text;
  EXPECT_NE(denied.stdout_text.find("not imported"), std::string::npos) << denied.stdout_text;
  EXPECT_GE(denied.denied_connections, 1u);
  ASSERT_FALSE(denied.denials.empty());
  EXPECT_EQ(denied.denials[0].host, "denied.quarry.test");
}

TEST_F(Network, TheProxyRunsAsNobodyInTheSandboxAndGoesWithIt) {
  const auto id = create({"allowed.quarry.test"});
  ASSERT_FALSE(id.empty());
  std::vector<pid_t> proxies;
  for (pid_t pid : host_processes_of(id)) {
    std::ifstream comm(fmt::format("/proc/{}/comm", pid));
    std::string name;
    std::getline(comm, name);
    if (name == "quarry-proxy") proxies.push_back(pid);
  }
  ASSERT_EQ(proxies.size(), 1u);
  std::ifstream status(fmt::format("/proc/{}/status", proxies[0]));
  std::string line;
  std::string uid;
  while (std::getline(status, line)) {
    if (line.starts_with("Uid:")) uid = line;
  }
  EXPECT_EQ(uid, "Uid:\t65534\t65534\t65534\t65534") << uid;

  ASSERT_TRUE(SandboxEnvironment::get().provider().destroy(id));
  sandboxes_.clear();
  EXPECT_FALSE(running(proxies[0])) << "the proxy outlived its sandbox";
}

}  // namespace
}  // namespace quarry::testing

// What code inside a sandbox can and cannot do: real sandboxes, real kernel.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <thread>

#include "common/file_util.h"
#include "common/units.h"
#include "sandbox_environment.h"

namespace quarry::testing {
namespace {

TEST(Isolation, PythonRunsWithTheAnalysisPackages) {
  ScopedSandbox sandbox;
  auto result = python(sandbox.id(),
                       "import polars, duckdb, pyarrow, matplotlib, pandas, numpy, plotly\n"
                       "print('hello from', polars.__name__, duckdb.__name__, pyarrow.__name__,"
                       " matplotlib.__name__)");
  ASSERT_TRUE(result) << result.error().message;
  EXPECT_EQ(result->exit_code, 0) << result->stderr_text;
  EXPECT_EQ(result->stdout_text, "hello from polars duckdb pyarrow matplotlib\n");
  EXPECT_EQ(result->stderr_text, "");  // no warnings (e.g. an unwritable matplotlib cache)
}

TEST(Isolation, RunsAsAnUnprivilegedUserWithNoCapabilities) {
  ScopedSandbox sandbox;
  auto result =
      run(sandbox.id(), {"sh", "-c",
                         "id -u; id -g; grep -E '^Cap(Prm|Eff|Bnd)' /proc/self/status; "
                         "grep NoNewPrivs /proc/self/status; grep Seccomp: /proc/self/status"});
  ASSERT_TRUE(result) << result.error().message;
  EXPECT_EQ(result->stdout_text,
            "1000\n1000\nCapPrm:\t0000000000000000\nCapEff:\t0000000000000000\n"
            "CapBnd:\t0000000000000000\nNoNewPrivs:\t1\nSeccomp:\t2\n");
}

TEST(Isolation, OnlyItsOwnProcessesAreVisible) {
  ScopedSandbox sandbox;
  auto result = run(sandbox.id(), {"sh", "-c", "ls /proc | grep -c '^[0-9]'; cat /proc/1/comm"});
  ASSERT_TRUE(result) << result.error().message;
  // init, sh, and the ls/grep/cat of this pipeline: a handful, never the host's hundreds.
  EXPECT_LT(std::stoi(result->stdout_text), 6) << result->stdout_text;
  EXPECT_NE(result->stdout_text.find("quarry-init"), std::string::npos);
}

TEST(Isolation, HostLoopbackIsUnreachable) {
  // A server on the host's loopback, which a sandbox must not reach.
  int server = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(server, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
  ASSERT_EQ(::listen(server, 4), 0);
  socklen_t length = sizeof address;
  ::getsockname(server, reinterpret_cast<sockaddr*>(&address), &length);
  const int port = ntohs(address.sin_port);

  ScopedSandbox sandbox;
  auto result = python(sandbox.id(), fmt::format(R"(
import socket
try:
    socket.create_connection(("127.0.0.1", {}), timeout=3)
    print("connected")
except OSError as error:
    print("refused", type(error).__name__)
for host in ("1.1.1.1", "10.0.0.1"):
    try:
        socket.create_connection((host, 80), timeout=3)
        print("connected", host)
    except OSError as error:
        print("unreachable", host)
)",
                                                 port));
  ::close(server);
  ASSERT_TRUE(result) << result.error().message;
  EXPECT_EQ(result->stdout_text,
            "refused ConnectionRefusedError\nunreachable 1.1.1.1\nunreachable 10.0.0.1\n")
      << result->stderr_text;
}

TEST(Isolation, HostFilesAreInvisible) {
  const std::string marker = fmt::format("/root/quarry-marker-{}", ::getpid());
  std::ofstream(marker) << "host secret";
  auto host_shadow = read_file("/etc/shadow");
  ScopedSandbox sandbox;
  auto result = run(sandbox.id(), {"sh", "-c",
                                   fmt::format("cat {} /etc/shadow; ls /work; ls /root; "
                                               "cat /etc/hostname 2>/dev/null; echo done",
                                               marker)});
  std::filesystem::remove(marker);
  ASSERT_TRUE(result) << result.error().message;
  // Only the image's own hostname file is there, not the host's.
  EXPECT_EQ(result->stdout_text, "sandbox\ndone\n") << "stdout: " << result->stdout_text;
  EXPECT_EQ(result->stdout_text.find("host secret"), std::string::npos);
  if (host_shadow) {
    EXPECT_EQ(result->stdout_text.find(host_shadow->substr(0, host_shadow->find('\n'))),
              std::string::npos);
  }
  EXPECT_NE(result->stderr_text.find("/etc/shadow: Permission denied"), std::string::npos)
      << result->stderr_text;
  EXPECT_NE(result->stderr_text.find("cannot access '/work'"), std::string::npos)
      << result->stderr_text;
}

TEST(Isolation, NoHostEnvironmentVariableGetsIn) {
  ::setenv("QUARRY_TEST_HOST_SECRET", "s3cr3t-value", 1);
  ScopedSandbox sandbox;
  auto result = run(sandbox.id(), {"env"});
  ::unsetenv("QUARRY_TEST_HOST_SECRET");
  ASSERT_TRUE(result) << result.error().message;
  EXPECT_EQ(result->stdout_text.find("s3cr3t-value"), std::string::npos);
  EXPECT_EQ(result->stdout_text.find("QUARRY_TEST_HOST_SECRET"), std::string::npos);
  // And init itself was started with an empty environment.
  auto init_env = run(sandbox.id(), {"sh", "-c", "wc -c < /proc/1/environ"});
  ASSERT_TRUE(init_env);
  EXPECT_NE(init_env->exit_code, 0);  // not even readable: init is not dumpable
}

TEST(Isolation, RefusedSyscallsFailCleanly) {
  ScopedSandbox sandbox;
  auto result = python(sandbox.id(), R"(
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
for name, call in [("unshare", lambda: libc.unshare(0x10000000)),
                   ("mount", lambda: libc.mount(b"none", b"/tmp", b"tmpfs", 0, None)),
                   ("ptrace", lambda: libc.ptrace(0, 0, None, None))]:
    rc = call()
    print(name, rc, os.strerror(ctypes.get_errno()))
)");
  ASSERT_TRUE(result) << result.error().message;
  EXPECT_EQ(result->stdout_text,
            "unshare -1 Operation not permitted\nmount -1 Operation not permitted\n"
            "ptrace -1 Operation not permitted\n")
      << result->stderr_text;
}

TEST(Isolation, DataAndOutputDirectoriesAreWritable) {
  ScopedSandbox sandbox;
  const auto& config = SandboxEnvironment::get().config().sandbox;
  auto result = run(sandbox.id(), {"sh", "-c",
                                   fmt::format("touch {0}/a {1}/b /tmp/c && ls {0} {1} && "
                                               "! touch /usr/x 2>/dev/null && echo ok",
                                               config.data_dir, config.output_dir)});
  ASSERT_TRUE(result) << result.error().message;
  EXPECT_EQ(result->exit_code, 0) << result->stderr_text;
  EXPECT_NE(result->stdout_text.find("ok"), std::string::npos);
}

TEST(Isolation, FillingTheDiskFailsCleanlyAndLeavesTheHostAlone) {
  auto spec = ScopedSandbox::default_spec();
  spec.resources.disk_bytes = 64 * kMiB;
  ScopedSandbox sandbox(spec);
  struct statvfs before {};
  ::statvfs("/", &before);
  auto result = run(sandbox.id(),
                    {"sh", "-c", "dd if=/dev/zero of=/tmp/fill bs=1M count=1000 2>&1; echo rc=$?"});
  ASSERT_TRUE(result) << result.error().message;
  EXPECT_NE(result->stdout_text.find("Disk quota exceeded"), std::string::npos)
      << result->stdout_text;
  EXPECT_EQ(result->stdout_text.find("rc=0"), std::string::npos);
  // The host's disk lost at most what the sandbox may use.
  struct statvfs after {};
  ::statvfs("/", &after);
  const double used = (static_cast<double>(before.f_bavail) - static_cast<double>(after.f_bavail)) *
                      static_cast<double>(before.f_frsize);
  EXPECT_LT(used, 80.0 * kMiB);
  // The sandbox recovers once it frees space.
  auto again =
      run(sandbox.id(), {"sh", "-c", "rm /tmp/fill && echo fine > /tmp/small && cat /tmp/small"});
  ASSERT_TRUE(again);
  EXPECT_EQ(again->stdout_text, "fine\n");
}

}  // namespace
}  // namespace quarry::testing

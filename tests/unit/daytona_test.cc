// The Daytona provider's pure parts: the Sandbox object as quarry reads it, the probe's report,
// and Daytona's error bodies.
#include <gtest/gtest.h>

#include "sandbox/daytona/daytona_client.h"
#include "sandbox/daytona/daytona_provider.h"

namespace quarry::sandbox::daytona {
namespace {

TEST(Daytona, ASandboxObjectGivesLabelsResourcesStateAndNetwork) {
  const auto sandbox = nlohmann::json::parse(R"({
    "id": "4f1d", "organizationId": "o", "name": "n", "user": "daytona", "env": {},
    "labels": {"quarry.conversation": "c1", "team": "data"}, "public": false,
    "networkBlockAll": false, "domainAllowList": "pypi.org,*.pythonhosted.org", "target": "eu",
    "cpu": 2, "gpu": 0, "memory": 4, "disk": 10, "state": "started",
    "createdAt": "2026-12-01T19:11:06.123Z", "toolboxProxyUrl": "http://127.0.0.1:1/toolbox"})");
  const SandboxInfo info = info_from(sandbox);
  EXPECT_EQ(info.id, "4f1d");
  EXPECT_EQ(info.labels.at("quarry.conversation"), "c1");
  EXPECT_EQ(info.resources.cpus, 2.0);
  EXPECT_EQ(info.resources.memory_bytes, 4 * kGiB);
  EXPECT_EQ(info.resources.disk_bytes, 10 * kGiB);
  EXPECT_EQ(info.state, SandboxState::kRunning);
  EXPECT_EQ(std::chrono::system_clock::to_time_t(info.created_at), 1796152266);
  EXPECT_EQ(info.network.mode, NetworkMode::kAllowlist);
  EXPECT_EQ(info.network.allow, (std::vector<std::string>{"pypi.org", "*.pythonhosted.org"}));

  auto stopped = sandbox;
  stopped["state"] = "stopped";
  stopped["networkBlockAll"] = true;
  EXPECT_EQ(info_from(stopped).state, SandboxState::kStopped);
  EXPECT_EQ(info_from(stopped).network.mode, NetworkMode::kNone);
}

TEST(Daytona, TheProbesReportIsTheCommandsOutputStatusAndMetering) {
  const std::string output =
      "a warning the sandbox's Python printed\n\x1equarry-probe "
      R"({"stdout": "out\n", "stderr": "err\n", "truncated": false, "exit_code": 137,
          "signal": 9, "timed_out": false, "run_ms": 812.5, "cpu_ms": 790.25,
          "peak_memory_bytes": 1073741824, "memory_limit_bytes": 1073741824, "oom": true})"
      "\n";
  auto report = parse_probe_report(output);
  ASSERT_TRUE(report) << report.error().message;
  EXPECT_EQ(report->stdout_text, "out\n");
  EXPECT_EQ(report->stderr_text, "err\n");
  EXPECT_EQ(report->exit_code, 137);
  EXPECT_EQ(report->signal, 9);
  EXPECT_DOUBLE_EQ(report->run_ms, 812.5);
  EXPECT_DOUBLE_EQ(report->cpu_ms, 790.25);
  EXPECT_EQ(report->peak_memory_bytes, kGiB);
  EXPECT_TRUE(report->oom);

  auto missing = parse_probe_report("sh: 1: python3: not found\n");
  ASSERT_FALSE(missing);
  EXPECT_NE(missing.error().message.find("does the sandbox have python3?"), std::string::npos);
  EXPECT_NE(missing.error().message.find("python3: not found"), std::string::npos);
}

TEST(Daytona, ErrorBodiesBecomeOneLine) {
  EXPECT_EQ(
      error_message(400, R"({"statusCode":400,"error":"Bad Request",)"
                         R"("message":"Cannot specify Sandbox resources when using a snapshot"})"),
      "Cannot specify Sandbox resources when using a snapshot");
  EXPECT_EQ(
      error_message(400, R"({"message":["cpu must be an integer","memory must be positive"]})"),
      "cpu must be an integer; memory must be positive");
  EXPECT_EQ(error_message(502, ""), "HTTP 502 with an empty body");
  EXPECT_EQ(error_message(503, "<html>\nbusy</html>"), "<html> busy</html>");
}

}  // namespace
}  // namespace quarry::sandbox::daytona

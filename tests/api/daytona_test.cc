// The Daytona-compatible API (docs/daytona.md) through a real `quarry serve` process: Daytona's
// official Python SDK, unmodified (tests/api/daytona/sdk_scenarios.py, in the venv scripts/setup
// makes from tests/api/daytona-requirements.txt), and raw HTTP for what the SDK hides: the error
// shapes, who owns a sandbox, the capacity limits and the end of a server's sandboxes.
#include <gtest/gtest.h>
#include <signal.h>

#include <fstream>
#include <sstream>

#include "api_environment.h"
#include "child_process.h"
#include "common/sha256.h"
#include "sandbox_environment.h"

namespace quarry::testing {
namespace {

const std::filesystem::path kSource = QUARRY_SOURCE_DIR;

// The SDK's venv: <cache>/daytona-venv-<16 hex digits of the requirements' SHA-256>.
std::filesystem::path sdk_python() {
  std::ifstream file(kSource / "tests/api/daytona-requirements.txt", std::ios::binary);
  std::stringstream requirements;
  requirements << file.rdbuf();
  const std::string hash = sha256_hex(requirements.str()).substr(0, 16);
  return SandboxEnvironment::get().cache_dir() / ("daytona-venv-" + hash) / "bin/python";
}

// Runs one scenario of sdk_scenarios.py as `user` (and `other` for the second user's token);
// returns what it printed, with its exit status in `status`.
std::string run_sdk(const QuarryServer& server, const std::string& scenario, int* status,
                    const std::string& user = "alice", const std::string& other = "bob") {
  const auto python = sdk_python();
  if (!std::filesystem::exists(python)) {
    *status = -1;
    return python.string() + " is missing: run scripts/setup, which makes the SDK's venv";
  }
  const auto log = results_dir() / ("daytona-" + scenario + ".log");
  ChildProcess sdk(
      {"/usr/bin/env", "DAYTONA_API_URL=" + server.url() + "/daytona/api",
       "DAYTONA_API_KEY=" + server.token(user), "QUARRY_OTHER_KEY=" + server.token(other),
       python.string(), (kSource / "tests/api/daytona/sdk_scenarios.py").string(), scenario},
      log);
  std::string output = sdk.rest();
  *status = sdk.wait();
  std::ifstream errors(log);
  std::stringstream text;
  text << errors.rdbuf();
  return output + text.str();
}

class DaytonaSdk : public ::testing::TestWithParam<std::string> {};

TEST_P(DaytonaSdk, TheOfficialSdkRunsUnmodified) {
  QuarryServer server({.tokens = true});
  ASSERT_TRUE(server.started());
  int status = 0;
  const std::string output = run_sdk(server, GetParam(), &status);
  EXPECT_EQ(status, 0) << output;
  EXPECT_NE(output.find("\npassed"), std::string::npos) << output;
}

INSTANTIATE_TEST_SUITE_P(Daytona, DaytonaSdk,
                         ::testing::Values("lifecycle", "files", "owners", "refusals"),
                         [](const auto& info) { return info.param; });

// The keys of a JSON object, sorted.
std::vector<std::string> keys(const nlohmann::json& object) {
  std::vector<std::string> names;
  for (const auto& [key, value] : object.items())
    names.push_back(key);
  return names;
}

TEST(DaytonaApi, ErrorsHaveDaytonasShapes) {
  QuarryServer server({.tokens = true});
  ASSERT_TRUE(server.started());
  ApiClient api(server.url());
  api.use_token(server.token("alice"));

  // The main API: {path, timestamp, statusCode, error, message}.
  const std::vector<std::string> main_shape = {"error", "message", "path", "statusCode",
                                               "timestamp"};
  auto missing = api.get("/daytona/api/sandbox/no-such-sandbox");
  EXPECT_EQ(missing.status, 404);
  EXPECT_EQ(keys(missing.json), main_shape) << missing.body;
  EXPECT_EQ(missing.json["statusCode"], 404);
  EXPECT_EQ(missing.json["error"], "Not Found");
  EXPECT_EQ(missing.json["path"], "/daytona/api/sandbox/no-such-sandbox");

  auto resources = api.post("/daytona/api/sandbox", {{"cpu", 2}});
  EXPECT_EQ(resources.status, 400);
  EXPECT_EQ(resources.json["message"], "Cannot specify Sandbox resources when using a snapshot");
  EXPECT_EQ(resources.json["error"], "Bad Request");
  auto both =
      api.post("/daytona/api/sandbox",
               {{"snapshot", "s"}, {"buildInfo", {{"dockerfileContent", "FROM quarry\n"}}}});
  EXPECT_EQ(both.json["message"], "Cannot specify a snapshot when using a build info entry");
  auto unsupported = api.post("/daytona/api/sandbox", {{"gpu", 1}, {"buildInfo", nullptr}});
  EXPECT_EQ(unsupported.status, 400) << unsupported.body;
  auto typed = api.post("/daytona/api/sandbox", {{"labels", {{"a", 1}}}});
  EXPECT_EQ(typed.status, 400);
  EXPECT_EQ(typed.json["message"], "labels.a must be a string");
  auto flag = api.post("/daytona/api/sandbox", {{"networkBlockAll", "yes"}});
  EXPECT_EQ(flag.status, 400) << flag.body;
  EXPECT_EQ(flag.json["message"], "networkBlockAll must be a boolean value");
  auto dockerfile = api.post("/daytona/api/sandbox", {{"buildInfo", {{"dockerfileContent", 1}}}});
  EXPECT_EQ(dockerfile.status, 400) << dockerfile.body;
  EXPECT_EQ(dockerfile.json["message"], "buildInfo.dockerfileContent must be a string");
  // Socket.IO is not served: the SDK watches a sandbox's state by polling instead.
  auto socket = api.get("/daytona/api/socket.io/?EIO=4&transport=websocket");
  EXPECT_EQ(socket.status, 404);
  EXPECT_EQ(keys(socket.json), main_shape);

  ApiClient anonymous(server.url());
  auto unsigned_in = anonymous.get("/daytona/api/sandbox");
  EXPECT_EQ(unsigned_in.status, 401);
  EXPECT_EQ(keys(unsigned_in.json), main_shape) << unsigned_in.body;

  // The toolbox: {statusCode, message, code, timestamp, path, method}; its 408 on a timeout.
  auto created = api.post("/daytona/api/sandbox", nlohmann::json::object());
  ASSERT_EQ(created.status, 200) << created.body;
  const std::string id = created.json["id"];
  const std::string execute = "/daytona/toolbox/" + id + "/process/execute";
  auto timeout = api.post(execute, {{"command", "sleep 30"}, {"timeout", 1}});
  EXPECT_EQ(timeout.status, 408);
  EXPECT_EQ(keys(timeout.json), (std::vector<std::string>{"code", "message", "method", "path",
                                                          "statusCode", "timestamp"}))
      << timeout.body;
  EXPECT_EQ(timeout.json["code"], "REQUEST_TIMEOUT");
  EXPECT_EQ(timeout.json["message"], "command execution timeout");
  EXPECT_EQ(timeout.json["statusCode"], 408);
  EXPECT_EQ(timeout.json["method"], "POST");
  EXPECT_EQ(timeout.json["path"], execute);
  auto empty = api.post(execute, {{"command", " "}});
  EXPECT_EQ(empty.status, 400);
  EXPECT_EQ(empty.json["code"], "BAD_REQUEST");
  auto too_long = api.post(execute, {{"command", "true"}, {"timeout", 100000}});
  EXPECT_EQ(too_long.status, 400);
  EXPECT_NE(too_long.json["message"].get<std::string>().find("sandbox.exec_timeout"),
            std::string::npos);
  auto no_file = api.get("/daytona/toolbox/" + id + "/files/download?path=missing.txt");
  EXPECT_EQ(no_file.status, 404);
  EXPECT_EQ(no_file.json["code"], "FILE_NOT_FOUND");
  EXPECT_EQ(no_file.json["source"], "DAYTONA_DAEMON");
  auto ran = api.post(execute, {{"command", "echo $0; exit 7"}});
  EXPECT_EQ(ran.status, 200);
  EXPECT_EQ(ran.json["exitCode"], 7);
  EXPECT_EQ(ran.json["result"], "bash\n");
  EXPECT_TRUE(ran.json["quarry"].contains("peak_memory_bytes")) << ran.body;
  EXPECT_EQ(api.del("/daytona/api/sandbox/" + id).json["state"], "destroyed");
}

TEST(DaytonaApi, ASandboxIsItsCreatorsAndCountsAgainstTheLimits) {
  QuarryServer server({.tokens = true, .capacity_config = "  max_per_user: 1\n"});
  ASSERT_TRUE(server.started());
  ApiClient alice(server.url()), bob(server.url());
  alice.use_token(server.token("alice"));
  bob.use_token(server.token("bob"));

  auto created =
      alice.post("/daytona/api/sandbox", {{"name", "analysis"}, {"labels", {{"team", "a"}}}});
  ASSERT_EQ(created.status, 200) << created.body;
  const std::string id = created.json["id"];
  EXPECT_EQ(created.json["organizationId"], server.user("alice"));
  EXPECT_EQ(alice.get("/daytona/api/sandbox/analysis").json["id"], id);  // by name too

  // Bob knows the id: it is as unknown to him as a missing one, for every route.
  for (const auto& [method, path] : std::vector<std::pair<std::string, std::string>>{
           {"GET", "/daytona/api/sandbox/" + id},
           {"DELETE", "/daytona/api/sandbox/" + id},
           {"GET", "/daytona/api/sandbox/analysis"},
           {"POST", "/daytona/api/sandbox/" + id + "/autostop/0"},
           {"GET", "/daytona/toolbox/" + id + "/files?path=."},
       }) {
    SCOPED_TRACE(method + " " + path);
    auto response = bob.send(method, path, "");
    EXPECT_EQ(response.status, 404) << response.body;
  }
  auto bobs_run = bob.post("/daytona/toolbox/" + id + "/process/execute", {{"command", "true"}});
  EXPECT_EQ(bobs_run.status, 404);
  EXPECT_TRUE(bob.get("/daytona/api/sandbox").json["items"].empty());
  EXPECT_EQ(alice.get("/daytona/api/sandbox").json["items"].size(), 1u);

  // Names are per user: Bob may have one called the same.
  auto bobs = bob.post("/daytona/api/sandbox", {{"name", "analysis"}});
  EXPECT_EQ(bobs.status, 200) << bobs.body;
  // One sandbox per user (capacity.max_per_user), counted like a conversation's.
  auto second = alice.post("/daytona/api/sandbox", nlohmann::json::object());
  EXPECT_EQ(second.status, 429) << second.body;
  EXPECT_NE(second.json["message"].get<std::string>().find("capacity.max_per_user"),
            std::string::npos);
  EXPECT_FALSE(second.header("Retry-After").empty());
  EXPECT_EQ(alice.get("/api/v1/sandboxes").json["capacity"]["sandboxes"]["busy"], 2)
      << alice.get("/api/v1/sandboxes").body;

  // Normal shutdown destroys them, as it does every other sandbox of the server.
  EXPECT_EQ(server.stop(SIGTERM), 0);
  EXPECT_NE(server.log().find("destroyed 2 sandboxes of the Daytona-compatible API"),
            std::string::npos)
      << server.log();
  auto left =
      SandboxEnvironment::get().provider().find({{"quarry.daytona.owner", server.user("alice")}});
  ASSERT_TRUE(left);
  EXPECT_TRUE(left->empty());
}

TEST(DaytonaApi, LargeUploadsNeedASignedInClient) {
  QuarryServer server({.tokens = true,
                       .server_config = "  max_body: 64KiB\n"
                                        "  max_file_transfer: 4MiB\n"});
  ASSERT_TRUE(server.started());
  ApiClient api(server.url());
  api.use_token(server.token("alice"));
  auto created = api.post("/daytona/api/sandbox", nlohmann::json::object());
  ASSERT_EQ(created.status, 200) << created.body;
  const std::string upload =
      "/daytona/toolbox/" + created.json["id"].get<std::string>() + "/files/bulk-upload";
  auto body = [](size_t size) {
    return "--b\r\nContent-Disposition: form-data; name=\"files[0].path\"\r\n\r\nbig.bin\r\n"
           "--b\r\nContent-Disposition: form-data; name=\"files[0].file\"; filename=\"big.bin\"\r\n"
           "Content-Type: application/octet-stream\r\n\r\n" +
           std::string(size, 'x') + "\r\n--b--\r\n";
  };
  const std::vector<HttpHeader> multipart = {{"Content-Type", "multipart/form-data; boundary=b"}};
  auto written = api.send("POST", upload, body(1 << 20), multipart);
  EXPECT_EQ(written.status, 200) << written.body;
  EXPECT_EQ(written.json["files"][0]["bytes"], 1 << 20);
  auto too_large = api.send("POST", upload, body(5 << 20), multipart);
  EXPECT_EQ(too_large.status, 413);
  EXPECT_NE(too_large.body.find("server.max_file_transfer"), std::string::npos);
  // Without a token the limit is server.max_body's.
  ApiClient anonymous(server.url());
  auto refused = anonymous.send("POST", upload, body(1 << 20), multipart);
  EXPECT_EQ(refused.status, 413);
  EXPECT_NE(refused.body.find("server.max_body"), std::string::npos);
}

}  // namespace
}  // namespace quarry::testing

#include "sandbox/local/protocol.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <thread>

namespace quarry::sandbox::local::protocol {
namespace {

struct SocketPair {
  SocketPair() {
    int fds[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
    a.reset(fds[0]);
    b.reset(fds[1]);
  }
  UniqueFd a, b;
};

TEST(Protocol, RoundTripsBodyAndDescriptors) {
  SocketPair pair;
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  UniqueFd read_end(pipe_fds[0]), write_end(pipe_fds[1]);
  nlohmann::json body = {{"type", "exec"}, {"argv", {"python3", "-c", "print('hé')"}}};
  int fds[] = {write_end.get()};
  ASSERT_TRUE(send(pair.a.get(), body, fds));
  auto message = receive(pair.b.get());
  ASSERT_TRUE(message) << message.error().message;
  EXPECT_EQ(message->body, body);
  ASSERT_EQ(message->fds.size(), 1u);
  // The received descriptor is the same pipe: what we write to it comes out of read_end.
  ASSERT_EQ(::write(message->fds[0].get(), "x", 1), 1);
  char c = 0;
  ASSERT_EQ(::read(read_end.get(), &c, 1), 1);
  EXPECT_EQ(c, 'x');
  EXPECT_TRUE(::fcntl(message->fds[0].get(), F_GETFD) & FD_CLOEXEC);
}

TEST(Protocol, CarriesLargeMessagesInOrder) {
  SocketPair pair;
  std::string big(1 << 20, 'q');
  std::thread writer([&] {
    for (int i = 0; i < 3; ++i)
      ASSERT_TRUE(send(pair.a.get(), {{"i", i}, {"data", big}}));
  });
  for (int i = 0; i < 3; ++i) {
    auto message = receive(pair.b.get());
    ASSERT_TRUE(message) << message.error().message;
    EXPECT_EQ(message->body["i"], i);
    EXPECT_EQ(message->body["data"].get<std::string>().size(), big.size());
  }
  writer.join();
}

TEST(Protocol, RefusesOversizedFrames) {
  SocketPair pair;
  std::string huge(kMaxFrameBytes + 1, 'x');
  auto sent = send(pair.a.get(), {{"data", huge}});
  ASSERT_FALSE(sent);
  EXPECT_EQ(sent.error().code, ErrorCode::kInvalidArgument);
}

TEST(Protocol, ClosedPeerIsUnavailable) {
  SocketPair pair;
  pair.a.reset();
  auto message = receive(pair.b.get());
  ASSERT_FALSE(message);
  EXPECT_EQ(message.error().code, ErrorCode::kUnavailable);
}

// A peer that sends a frame's length and part of its body, then nothing: the host gives up at
// its deadline instead of waiting forever.
TEST(Protocol, APartialFrameEndsAtTheDeadline) {
  SocketPair pair;
  const uint32_t length = 100;
  ASSERT_EQ(::write(pair.a.get(), &length, sizeof length), 4);
  ASSERT_EQ(::write(pair.a.get(), "{\"type\":", 8), 8);
  const auto start = std::chrono::steady_clock::now();
  auto message = receive(pair.b.get(), start + std::chrono::milliseconds(200));
  ASSERT_FALSE(message);
  EXPECT_EQ(message.error().code, ErrorCode::kDeadlineExceeded);
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(200));
  // Also when not even the whole length came.
  SocketPair other;
  ASSERT_EQ(::write(other.a.get(), &length, 2), 2);
  message =
      receive(other.b.get(), std::chrono::steady_clock::now() + std::chrono::milliseconds(50));
  ASSERT_FALSE(message);
  EXPECT_EQ(message.error().code, ErrorCode::kDeadlineExceeded);
}

TEST(Protocol, RepliesAreCheckedFieldByField) {
  auto exit = parse_reply({{"type", "exit"}, {"status", 256}, {"run_ns", 1500}});
  ASSERT_TRUE(exit) << exit.error().message;
  EXPECT_EQ(exit->status, 256);
  EXPECT_EQ(exit->run_ns, 1500);
  auto error = parse_reply({{"type", "error"}, {"message", "fork failed"}});
  ASSERT_TRUE(error);
  EXPECT_EQ(error->message, "fork failed");
  EXPECT_TRUE(parse_reply({{"type", "ready"}}));
  // Shapes that made nlohmann::json throw past every handler, and values out of range.
  for (const auto& bad : {
           nlohmann::json::array({1, 2}),
           nlohmann::json("exit"),
           nlohmann::json{{"type", 7}},
           nlohmann::json{{"type", "exit"}, {"status", "0"}, {"run_ns", 1}},
           nlohmann::json{{"type", "exit"}, {"status", 0}, {"run_ns", -1}},
           nlohmann::json{{"type", "exit"}, {"status", 1 << 20}, {"run_ns", 1}},
           nlohmann::json{{"type", "exit"}, {"status", 0.5}, {"run_ns", 1}},
           nlohmann::json{{"type", "exit"}, {"run_ns", 1}},
           nlohmann::json{{"type", "error"}, {"message", {{"nested", true}}}},
           nlohmann::json{{"type", "surprise"}},
       }) {
    SCOPED_TRACE(bad.dump());
    auto reply = parse_reply(bad);
    ASSERT_FALSE(reply);
    EXPECT_EQ(reply.error().code, ErrorCode::kInternal);
    EXPECT_NE(reply.error().message.find("quarry-init sent a malformed message"),
              std::string::npos);
  }
}

TEST(Protocol, SetupSurvivesTheTrip) {
  protocol::Setup setup;
  setup.root_dir = "/state/sandboxes/abc/root";
  setup.directories = {"/home/sandbox/data", "/home/sandbox/outputs"};
  setup.seccomp_filter = {1, 2, 3, 255};
  setup.host_id_base = 1u << 30;
  auto back = setup_from_json(to_json(setup));
  ASSERT_TRUE(back) << back.error().message;
  EXPECT_EQ(back->root_dir, setup.root_dir);
  EXPECT_EQ(back->directories, setup.directories);
  EXPECT_EQ(back->seccomp_filter, setup.seccomp_filter);
  EXPECT_EQ(back->host_id_base, setup.host_id_base);
  EXPECT_TRUE(back->frozen_dirs.empty());
  EXPECT_FALSE(setup_from_json({{"type", "setup"}}));

  // A sandbox started from a snapshot has its frozen layers above the image, top first.
  setup.frozen_dirs = {"/state/sandboxes/snapshots/b/layer/upper",
                       "/state/sandboxes/snapshots/a/layer/upper"};
  back = setup_from_json(to_json(setup));
  ASSERT_TRUE(back) << back.error().message;
  EXPECT_EQ(back->frozen_dirs, setup.frozen_dirs);
  auto body = to_json(setup);
  body["frozen_dirs"] = std::vector<std::string>(kMaxFds, "/layer");
  EXPECT_FALSE(setup_from_json(body)) << "more layers than descriptors a message can carry";
  body["frozen_dirs"] = "/layer";
  EXPECT_FALSE(setup_from_json(body));
}

// Found with fuzz/protocol_fuzzer's harness: json's get<uint32_t>() converts a float out of
// range with undefined behaviour (UBSan: "1e+300 is outside the range of representable values
// of type 'unsigned int'"), and wraps an integer out of range (-1 became 4294967295).
TEST(Protocol, NumbersMustBeWholeAndInRange) {
  using nlohmann::json;
  const json setup = to_json(protocol::Setup{});
  for (const auto& [key, value] : std::vector<std::pair<std::string, json>>{
           {"user_id", 1e300},
           {"user_id", -1},
           {"group_id", 4294967296},
           {"host_id_base", 0.5},
           {"max_processes", "256"},
           {"seccomp_filter", {1, 2}},
           {"seccomp_filter", "abc"},
           {"seccomp_filter", "0g"},
           {"seccomp_filter", "0A"},
           {"seccomp_filter", 5},
           {"cgroup_mounts", json::object()},
       }) {
    SCOPED_TRACE(key + " = " + value.dump());
    json body = setup;
    body[key] = value;
    auto refused = setup_from_json(body);
    ASSERT_FALSE(refused);
    EXPECT_EQ(refused.error().code, ErrorCode::kInternal);
  }
}

// A body of any shape is read without an exception: json::value() threw on an exec request
// that was not an object, and init (PID 1, and with it the sandbox) would have died of it.
TEST(Protocol, ReadsExecRequestsOfAnyShape) {
  using nlohmann::json;
  for (const json& body : {json::array({1}), json(7), json(nullptr), json{{"type", 3}}}) {
    SCOPED_TRACE(body.dump());
    EXPECT_EQ(message_type(body), "");
    EXPECT_FALSE(exec_request_from_json(body));
  }
  EXPECT_EQ(message_type({{"type", "maps_written"}}), "maps_written");
}

TEST(Protocol, ExecRequestsSurviveTheTripAndMalformedOnesAreRefused) {
  using nlohmann::json;
  ExecRequest request{.argv = {"python3", "-c", "print(1)"}, .env = {"PATH=/usr/bin"}};
  auto back = exec_request_from_json(to_json(request));
  ASSERT_TRUE(back) << back.error().message;
  EXPECT_EQ(back->argv, request.argv);
  EXPECT_EQ(back->env, request.env);
  EXPECT_FALSE(back->cwd);
  request.cwd = "/home/sandbox/work";
  back = exec_request_from_json(to_json(request));
  ASSERT_TRUE(back) << back.error().message;
  EXPECT_EQ(back->cwd, request.cwd);
  EXPECT_FALSE(back->has_stdin);
  // A command that keeps running (the Python kernel) gets a descriptor for its stdin.
  request.has_stdin = true;
  back = exec_request_from_json(to_json(request));
  ASSERT_TRUE(back) << back.error().message;
  EXPECT_TRUE(back->has_stdin);
  EXPECT_FALSE(exec_request_from_json(
      json{{"type", "exec"}, {"argv", {"true"}}, {"env", json::array()}, {"stdin", "yes"}}));
  // A package install of the host's runs as the sandbox's root; nothing else does.
  EXPECT_FALSE(back->as_root);
  request.as_root = true;
  back = exec_request_from_json(to_json(request));
  ASSERT_TRUE(back) << back.error().message;
  EXPECT_TRUE(back->as_root);
  EXPECT_FALSE(exec_request_from_json(
      json{{"type", "exec"}, {"argv", {"true"}}, {"env", json::array()}, {"root", 1}}));

  for (const json& body : {
           json{{"type", "exec"}, {"argv", json::array()}, {"env", json::array()}},
           json{{"type", "exec"}, {"argv", {"ls", 1}}, {"env", json::array()}},
           json{{"type", "exec"}, {"argv", "ls"}, {"env", json::array()}},
           json{{"type", "exec"}, {"argv", {"ls"}}},
           json{{"type", "exec"}, {"argv", {"ls"}}, {"env", json::array()}, {"cwd", 5}},
       }) {
    SCOPED_TRACE(body.dump());
    auto refused = exec_request_from_json(body);
    ASSERT_FALSE(refused);
    EXPECT_NE(refused.error().message.find("malformed exec request"), std::string::npos);
  }
}

}  // namespace
}  // namespace quarry::sandbox::local::protocol

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
  EXPECT_FALSE(setup_from_json({{"type", "setup"}}));
}

}  // namespace
}  // namespace quarry::sandbox::local::protocol

// Many clients watching at once: 500 streams held open, idle, while turns still complete, and
// each watcher gets the turns of the conversation it follows.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "api_environment.h"
#include "common/unique_fd.h"
#include "common/url.h"

namespace quarry::testing {
namespace {

// A raw connection that sent one GET of a stream and collects what comes back.
struct Watcher {
  UniqueFd socket;
  std::string received;
};

UniqueFd connect_to(const Url& url) {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(url.port);
  ::inet_pton(AF_INET, url.host.c_str(), &address.sin_addr);
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) return {};
  return fd;
}

// Reads what is there on every watcher until `done` holds for all, or `timeout` passes.
void read_until(std::vector<Watcher>& watchers, const std::function<bool(const Watcher&)>& done,
                std::chrono::seconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    std::vector<pollfd> polls;
    std::vector<Watcher*> waiting;
    for (auto& watcher : watchers) {
      if (done(watcher)) continue;
      polls.push_back({watcher.socket.get(), POLLIN, 0});
      waiting.push_back(&watcher);
    }
    if (polls.empty()) return;
    if (::poll(polls.data(), polls.size(), 200) <= 0) continue;
    for (size_t i = 0; i < polls.size(); ++i) {
      if (!(polls[i].revents & (POLLIN | POLLHUP))) continue;
      char buffer[16384];
      const ssize_t n = ::read(polls[i].fd, buffer, sizeof buffer);
      if (n > 0) waiting[i]->received.append(buffer, static_cast<size_t>(n));
    }
  }
}

TEST(IdleStreams, FiveHundredWatchersWhileTurnsComplete) {
  constexpr int kWatchers = 500;
  rlimit files{};
  ::getrlimit(RLIMIT_NOFILE, &files);
  files.rlim_cur = std::min<rlim_t>(files.rlim_max, 4096);
  ::setrlimit(RLIMIT_NOFILE, &files);

  QuarryServer server;
  ASSERT_TRUE(server.started());
  ApiClient api(server.url());
  const auto watched = api.create_conversation("watched by many");
  const auto other = api.create_conversation("busy elsewhere");
  const Url url = *parse_url(server.url());

  std::vector<Watcher> watchers(kWatchers);
  for (auto& watcher : watchers) {
    watcher.socket = connect_to(url);
    ASSERT_TRUE(watcher.socket) << "connecting watcher " << (&watcher - watchers.data());
    const std::string request =
        fmt::format("GET /api/v1/conversations/{}/events HTTP/1.1\r\nHost: 127.0.0.1:{}\r\n\r\n",
                    watched, url.port);
    ASSERT_EQ(::write(watcher.socket.get(), request.data(), request.size()),
              static_cast<ssize_t>(request.size()));
  }
  // Every one is answered and held open.
  read_until(
      watchers, [](const Watcher& w) { return w.received.find("retry:") != std::string::npos; },
      std::chrono::seconds(60));
  for (const auto& watcher : watchers) {
    ASSERT_TRUE(watcher.received.starts_with("HTTP/1.1 200 OK\r\n")) << watcher.received;
  }

  // Turns still run and complete, in the other conversation and in the watched one.
  auto elsewhere = api.cell(other, "python", "print(sum(range(10)))");
  ASSERT_FALSE(elsewhere.events.empty());
  EXPECT_EQ(elsewhere.events.back().data["status"], "completed");
  auto watched_turn = api.cell(watched, "sql_query", "SELECT 'seen by all' AS note");
  ASSERT_FALSE(watched_turn.events.empty());
  EXPECT_EQ(watched_turn.events.back().data["status"], "completed");

  // And every watcher gets that turn, to its end.
  auto saw_done = [](const Watcher& w) {
    return w.received.find("event: done") != std::string::npos;
  };
  read_until(watchers, saw_done, std::chrono::seconds(60));
  int complete = 0;
  for (const auto& watcher : watchers) {
    complete += saw_done(watcher) && watcher.received.find("seen by all") != std::string::npos;
  }
  EXPECT_EQ(complete, kWatchers);
  EXPECT_EQ(server.stop(SIGTERM), 0);
}

}  // namespace
}  // namespace quarry::testing

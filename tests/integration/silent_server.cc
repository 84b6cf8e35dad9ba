#include "silent_server.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

namespace quarry::testing {

SilentServer::SilentServer() : listener_(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) {
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof address;
  EXPECT_EQ(::bind(listener_.get(), reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
  EXPECT_EQ(::listen(listener_.get(), 16), 0);
  EXPECT_EQ(::getsockname(listener_.get(), reinterpret_cast<sockaddr*>(&address), &length), 0);
  port_ = ntohs(address.sin_port);
}

std::string SilentServer::url(const std::string& path) const {
  return fmt::format("http://127.0.0.1:{}{}", port_, path);
}

UniqueFd SilentServer::accept(std::chrono::milliseconds timeout) {
  pollfd pending{listener_.get(), POLLIN, 0};
  if (::poll(&pending, 1, static_cast<int>(timeout.count())) != 1) return UniqueFd();
  return UniqueFd(::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
}

bool SilentServer::closed_within(const UniqueFd& connection, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    pollfd readable{connection.get(), POLLIN, 0};
    if (left.count() <= 0 || ::poll(&readable, 1, static_cast<int>(left.count())) != 1) {
      return false;
    }
    char buffer[4096];
    if (::read(connection.get(), buffer, sizeof buffer) <= 0) return true;
  }
}

}  // namespace quarry::testing

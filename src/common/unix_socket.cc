// Connecting to a unix stream socket by its path.
#include "common/unix_socket.h"

#include <sys/socket.h>
#include <sys/un.h>

#include <cstring>

namespace quarry {

Result<UniqueFd> connect_unix(const std::filesystem::path& socket_path) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  const std::string path = socket_path.string();
  if (path.size() >= sizeof address.sun_path) {
    return make_error(ErrorCode::kInvalidArgument,
                      "the state directory path is too long for a unix socket ('{}'); use a "
                      "shorter --state-dir",
                      path);
  }
  std::memcpy(address.sun_path, path.c_str(), path.size() + 1);
  UniqueFd sock(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!sock) return errno_error("socket(AF_UNIX)");
  if (::connect(sock.get(), reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
    return make_error(ErrorCode::kUnavailable, "{}", strerrordesc_np(errno));
  }
  return sock;
}

}  // namespace quarry

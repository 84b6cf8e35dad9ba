#include "sandbox/local/protocol.h"

#include <sys/socket.h>

#include <cstring>

namespace quarry::sandbox::local::protocol {
namespace {

Result<void> read_exact(int socket, char* data, size_t size) {
  while (size > 0) {
    ssize_t n = ::recv(socket, data, size, MSG_WAITALL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno_error("recv");
    }
    if (n == 0) return make_error(ErrorCode::kUnavailable, "the peer closed the connection");
    data += n;
    size -= static_cast<size_t>(n);
  }
  return {};
}

}  // namespace

Result<void> send(int socket, const nlohmann::json& body, std::span<const int> fds) {
  if (fds.size() > kMaxFds) {
    return make_error(ErrorCode::kInternal, "too many file descriptors ({}) for one message",
                      fds.size());
  }
  std::string payload = body.dump();
  if (payload.size() > kMaxFrameBytes) {
    return make_error(ErrorCode::kInvalidArgument,
                      "message of {} bytes is over the {} byte limit (is the command line very "
                      "long? write the code to a file instead)",
                      payload.size(), kMaxFrameBytes);
  }
  uint32_t length = static_cast<uint32_t>(payload.size());
  std::string frame(reinterpret_cast<const char*>(&length), sizeof length);
  frame += payload;

  size_t sent = 0;
  bool fds_sent = fds.empty();
  while (sent < frame.size()) {
    iovec iov{frame.data() + sent, frame.size() - sent};
    msghdr header{};
    header.msg_iov = &iov;
    header.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFds)];
    if (!fds_sent) {
      header.msg_control = control;
      header.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
      cmsghdr* cmsg = CMSG_FIRSTHDR(&header);
      cmsg->cmsg_level = SOL_SOCKET;
      cmsg->cmsg_type = SCM_RIGHTS;
      cmsg->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
      std::memcpy(CMSG_DATA(cmsg), fds.data(), sizeof(int) * fds.size());
    }
    ssize_t n = ::sendmsg(socket, &header, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno_error("sendmsg");
    }
    fds_sent = true;
    sent += static_cast<size_t>(n);
  }
  return {};
}

Result<Message> receive(int socket) {
  Message message;
  uint32_t length = 0;
  // The header carries the descriptors, so it is read with recvmsg.
  {
    iovec iov{&length, sizeof length};
    msghdr header{};
    header.msg_iov = &iov;
    header.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFds)];
    header.msg_control = control;
    header.msg_controllen = sizeof control;
    ssize_t n;
    do {
      n = ::recvmsg(socket, &header, MSG_CMSG_CLOEXEC);
    } while (n < 0 && errno == EINTR);
    if (n < 0) return errno_error("recvmsg");
    if (n == 0) return make_error(ErrorCode::kUnavailable, "the peer closed the connection");
    for (cmsghdr* cmsg = CMSG_FIRSTHDR(&header); cmsg; cmsg = CMSG_NXTHDR(&header, cmsg)) {
      if (cmsg->cmsg_level != SOL_SOCKET || cmsg->cmsg_type != SCM_RIGHTS) continue;
      size_t count = (cmsg->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int fd;
        std::memcpy(&fd, CMSG_DATA(cmsg) + i * sizeof(int), sizeof fd);
        message.fds.emplace_back(fd);
      }
    }
    if (header.msg_flags & MSG_CTRUNC) {
      return make_error(ErrorCode::kInternal, "a message carried more than {} descriptors",
                        kMaxFds);
    }
    if (static_cast<size_t>(n) < sizeof length) {
      RETURN_IF_ERROR(read_exact(socket, reinterpret_cast<char*>(&length) + n,
                                 sizeof length - static_cast<size_t>(n)));
    }
  }
  if (length > kMaxFrameBytes) {
    return make_error(ErrorCode::kInternal, "a message of {} bytes is over the limit", length);
  }
  std::string payload(length, '\0');
  RETURN_IF_ERROR(read_exact(socket, payload.data(), payload.size()));
  message.body = nlohmann::json::parse(payload, nullptr, /*allow_exceptions=*/false);
  if (message.body.is_discarded()) {
    return make_error(ErrorCode::kInternal, "a message was not valid JSON");
  }
  return message;
}

nlohmann::json to_json(const Setup& setup) {
  nlohmann::json cgroup_mounts = nlohmann::json::array();
  for (const auto& mount : setup.cgroup_mounts) {
    cgroup_mounts.push_back({{"type", mount.type},
                             {"options", mount.options},
                             {"target", mount.target},
                             {"aliases", mount.aliases}});
  }
  return {
      {"type", "setup"},
      {"root_dir", setup.root_dir},
      {"lower_dir", setup.lower_dir},
      {"upper_dir", setup.upper_dir},
      {"work_dir", setup.work_dir},
      {"control_socket", setup.control_socket},
      {"hostname", setup.hostname},
      {"user_id", setup.user_id},
      {"group_id", setup.group_id},
      {"host_id_base", setup.host_id_base},
      {"home", setup.home},
      {"directories", setup.directories},
      {"seccomp_filter", setup.seccomp_filter},
      {"max_processes", setup.max_processes},
      {"cgroup_mounts", cgroup_mounts},
  };
}

Result<Setup> setup_from_json(const nlohmann::json& body) {
  try {
    Setup setup;
    body.at("root_dir").get_to(setup.root_dir);
    body.at("lower_dir").get_to(setup.lower_dir);
    body.at("upper_dir").get_to(setup.upper_dir);
    body.at("work_dir").get_to(setup.work_dir);
    body.at("control_socket").get_to(setup.control_socket);
    body.at("hostname").get_to(setup.hostname);
    body.at("user_id").get_to(setup.user_id);
    body.at("group_id").get_to(setup.group_id);
    body.at("host_id_base").get_to(setup.host_id_base);
    body.at("home").get_to(setup.home);
    body.at("directories").get_to(setup.directories);
    body.at("seccomp_filter").get_to(setup.seccomp_filter);
    body.at("max_processes").get_to(setup.max_processes);
    for (const auto& mount : body.at("cgroup_mounts")) {
      setup.cgroup_mounts.push_back(
          {mount.at("type"), mount.at("options"), mount.at("target"), mount.at("aliases")});
    }
    return setup;
  } catch (const nlohmann::json::exception& error) {
    return make_error(ErrorCode::kInternal, "bad setup message: {}", error.what());
  }
}

}  // namespace quarry::sandbox::local::protocol

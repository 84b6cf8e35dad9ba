#include "sandbox/local/protocol.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <utility>

#include "common/hex.h"

namespace quarry::sandbox::local::protocol {
namespace {

// Waits until `socket` is readable or `deadline` passes.
Result<void> wait_readable(int socket, Deadline deadline) {
  if (deadline == kNoDeadline) return {};
  while (true) {
    const auto left =
        std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    pollfd poll_fd{socket, POLLIN, 0};
    int ready = ::poll(&poll_fd, 1, static_cast<int>(std::max<int64_t>(left.count(), 0)));
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0) return errno_error("poll");
    if (ready == 0) {
      return make_error(ErrorCode::kDeadlineExceeded,
                        "quarry-init did not send a whole message in time");
    }
    return {};
  }
}

Result<void> read_exact(int socket, char* data, size_t size, Deadline deadline) {
  while (size > 0) {
    RETURN_IF_ERROR(wait_readable(socket, deadline));
    ssize_t n = ::recv(socket, data, size, deadline == kNoDeadline ? MSG_WAITALL : MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return errno_error("recv");
    }
    if (n == 0) return make_error(ErrorCode::kUnavailable, "the peer closed the connection");
    data += n;
    size -= static_cast<size_t>(n);
  }
  return {};
}

// A whole number of type T. json's get<T>() would also take a float, converting it with
// undefined behaviour when it is out of T's range, and would wrap an integer that is: both
// are refused here.
template <typename T>
Result<T> whole_number(const nlohmann::json& value, std::string_view what) {
  if (value.is_number_unsigned() && std::in_range<T>(value.get<uint64_t>())) {
    return static_cast<T>(value.get<uint64_t>());
  }
  if (value.is_number_integer() && std::in_range<T>(value.get<int64_t>())) {
    return static_cast<T>(value.get<int64_t>());
  }
  return make_error(ErrorCode::kInternal, "{} is {}, not a whole number from {} to {}", what,
                    value.is_number() ? value.dump() : value.type_name(),
                    std::numeric_limits<T>::min(), std::numeric_limits<T>::max());
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

Result<Message> receive(int socket, Deadline deadline) {
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
    RETURN_IF_ERROR(wait_readable(socket, deadline));
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
                                 sizeof length - static_cast<size_t>(n), deadline));
    }
  }
  if (length > kMaxFrameBytes) {
    return make_error(ErrorCode::kInternal, "a message of {} bytes is over the limit", length);
  }
  std::string payload(length, '\0');
  RETURN_IF_ERROR(read_exact(socket, payload.data(), payload.size(), deadline));
  message.body = nlohmann::json::parse(payload, nullptr, /*allow_exceptions=*/false);
  if (message.body.is_discarded()) {
    return make_error(ErrorCode::kInternal, "a message was not valid JSON");
  }
  return message;
}

std::string message_type(const nlohmann::json& body) {
  if (!body.is_object()) return "";
  auto type = body.find("type");
  return type != body.end() && type->is_string() ? type->get<std::string>() : "";
}

nlohmann::json to_json(const ExecRequest& request) {
  nlohmann::json body = {{"type", "exec"}, {"argv", request.argv}, {"env", request.env}};
  if (request.cwd) body["cwd"] = *request.cwd;
  if (request.has_stdin) body["stdin"] = true;
  if (request.as_root) body["root"] = true;
  return body;
}

Result<ExecRequest> exec_request_from_json(const nlohmann::json& body) {
  if (message_type(body) != "exec") {
    return make_error(ErrorCode::kInvalidArgument, "malformed exec request: not an exec message");
  }
  try {
    ExecRequest request;
    body.at("argv").get_to(request.argv);
    body.at("env").get_to(request.env);
    if (auto cwd = body.find("cwd"); cwd != body.end()) request.cwd = cwd->get<std::string>();
    if (auto input = body.find("stdin"); input != body.end())
      request.has_stdin = input->get<bool>();
    if (auto root = body.find("root"); root != body.end()) request.as_root = root->get<bool>();
    if (request.argv.empty()) {
      return make_error(ErrorCode::kInvalidArgument, "malformed exec request: argv is empty");
    }
    return request;
  } catch (const nlohmann::json::exception& error) {
    return make_error(ErrorCode::kInvalidArgument, "malformed exec request: {}", error.what());
  }
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
      {"frozen_dirs", setup.frozen_dirs},
      {"upper_dir", setup.upper_dir},
      {"work_dir", setup.work_dir},
      {"control_socket", setup.control_socket},
      {"hostname", setup.hostname},
      {"user_id", setup.user_id},
      {"group_id", setup.group_id},
      {"host_id_base", setup.host_id_base},
      {"home", setup.home},
      {"directories", setup.directories},
      // One hex string: as a list of numbers it took more than half a millisecond to write
      // and read back, at every sandbox start.
      {"seccomp_filter", to_hex(setup.seccomp_filter)},
      {"max_processes", setup.max_processes},
      {"cgroup_mounts", cgroup_mounts},
  };
}

Result<Setup> setup_from_json(const nlohmann::json& body) {
  try {
    Setup setup;
    body.at("root_dir").get_to(setup.root_dir);
    body.at("lower_dir").get_to(setup.lower_dir);
    // Absent in a setup without frozen layers.
    if (auto frozen = body.find("frozen_dirs"); frozen != body.end()) {
      if (!frozen->is_array() || frozen->size() >= kMaxFds) {
        return make_error(ErrorCode::kInternal,
                          "bad setup message: frozen_dirs must be a list of at most {} paths",
                          kMaxFds - 1);
      }
      frozen->get_to(setup.frozen_dirs);
    }
    body.at("upper_dir").get_to(setup.upper_dir);
    body.at("work_dir").get_to(setup.work_dir);
    body.at("control_socket").get_to(setup.control_socket);
    body.at("hostname").get_to(setup.hostname);
    ASSIGN_OR_RETURN(setup.user_id,
                     whole_number<uint32_t>(body.at("user_id"), "setup message: user_id"));
    ASSIGN_OR_RETURN(setup.group_id,
                     whole_number<uint32_t>(body.at("group_id"), "setup message: group_id"));
    ASSIGN_OR_RETURN(setup.host_id_base, whole_number<uint32_t>(body.at("host_id_base"),
                                                                "setup message: host_id_base"));
    body.at("home").get_to(setup.home);
    body.at("directories").get_to(setup.directories);
    // Iterating a json that is not an array would visit the value itself.
    if (!body.at("cgroup_mounts").is_array()) {
      return make_error(ErrorCode::kInternal, "bad setup message: cgroup_mounts must be a list");
    }
    auto filter = from_hex(body.at("seccomp_filter").get<std::string>());
    if (!filter) {
      return make_error(ErrorCode::kInternal,
                        "bad setup message: seccomp_filter must be lowercase hex digits in pairs");
    }
    setup.seccomp_filter = std::move(*filter);
    ASSIGN_OR_RETURN(setup.max_processes, whole_number<uint32_t>(body.at("max_processes"),
                                                                 "setup message: max_processes"));
    for (const auto& mount : body.at("cgroup_mounts")) {
      setup.cgroup_mounts.push_back(
          {mount.at("type"), mount.at("options"), mount.at("target"), mount.at("aliases")});
    }
    return setup;
  } catch (const nlohmann::json::exception& error) {
    return make_error(ErrorCode::kInternal, "bad setup message: {}", error.what());
  }
}

Result<Reply> parse_reply(const nlohmann::json& body) {
  auto bad = [&](std::string_view what) {
    return make_error(ErrorCode::kInternal, "quarry-init sent a malformed message ({}): {:.200}",
                      what, body.dump());
  };
  Reply reply;
  reply.type = message_type(body);
  if (reply.type.empty()) return bad("no type");
  if (reply.type == "userns" || reply.type == "ready") return reply;
  if (reply.type == "error") {
    auto message = body.find("message");
    if (message == body.end() || !message->is_string()) return bad("an error without a message");
    reply.message = message->get<std::string>().substr(0, 4096);
    return reply;
  }
  if (reply.type == "exit") {
    auto status = body.find("status");
    auto run_ns = body.find("run_ns");
    if (status == body.end() || !status->is_number_integer() || status->get<int64_t>() < 0 ||
        status->get<int64_t>() > 0xffff) {
      return bad("an exit without a wait status");
    }
    if (run_ns == body.end() || !run_ns->is_number_integer() || run_ns->get<int64_t>() < 0) {
      return bad("an exit without a run time");
    }
    reply.status = static_cast<int>(status->get<int64_t>());
    reply.run_ns = run_ns->get<int64_t>();
    return reply;
  }
  return bad("unknown type");
}

}  // namespace quarry::sandbox::local::protocol

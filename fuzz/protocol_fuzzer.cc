// Fuzzes the messages between quarry and quarry-init: the input is what arrives on the socket
// (length-prefixed JSON frames, as protocol::send writes them), received frame by frame
// through a socketpair as init and the host receive them, and each body read as every kind of
// message. What a reader accepts must write out and read back the same.
#include <sys/socket.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "check.h"
#include "sandbox/local/protocol.h"

namespace {

namespace protocol = quarry::sandbox::local::protocol;

void read_body(const nlohmann::json& body) {
  // As init reads what the host sends.
  (void)protocol::message_type(body);
  if (auto setup = protocol::setup_from_json(body)) {
    auto again = protocol::setup_from_json(protocol::to_json(*setup));
    check(again && protocol::to_json(*again) == protocol::to_json(*setup),
          "a setup message does not survive writing it out");
  }
  if (auto request = protocol::exec_request_from_json(body)) {
    check(!request->argv.empty(), "an exec request without argv");
    auto again = protocol::exec_request_from_json(protocol::to_json(*request));
    check(again && again->argv == request->argv && again->env == request->env &&
              again->cwd == request->cwd,
          "an exec request does not survive writing it out");
  }
  // As the host reads what init sends.
  if (auto reply = protocol::parse_reply(body)) {
    check(reply->type == "userns" || reply->type == "ready" || reply->type == "exit" ||
              reply->type == "error",
          "a reply of an unknown type");
    check(reply->status >= 0 && reply->status <= 0xffff && reply->run_ns >= 0,
          "an exit with a status or run time out of range");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // More than a socket buffer would need a writer thread; frames are small anyway.
  if (size > 64 * 1024) return 0;
  // init receives without a deadline, the host with one (another path through the reads).
  for (const auto deadline :
       {protocol::kNoDeadline, std::chrono::steady_clock::now() + std::chrono::seconds(10)}) {
    int fds[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) std::abort();
    quarry::UniqueFd reader(fds[0]), writer(fds[1]);
    check(::write(writer.get(), data, size) == static_cast<ssize_t>(size), "short write");
    writer.reset();  // the peer hangs up after the input, so receive ends
    while (true) {
      auto message = protocol::receive(reader.get(), deadline);
      if (!message) break;
      read_body(message->body);
    }
  }
  return 0;
}

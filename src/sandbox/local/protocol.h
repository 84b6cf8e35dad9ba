// The messages between quarry (the host side) and quarry-init (PID 1 in a sandbox): JSON bodies
// in length-prefixed frames over a unix socket, with file descriptors passed alongside.
//
// Setup, over a socketpair at fd 3 of a new init:
//   host -> init  setup {layer paths, control socket path, user, directories, seccomp filter}
//                 + fds [each frozen layer (a snapshot's), top first, then the image: idmapped
//                        mount trees, for the overlay's lower layers]
//   init -> host  userns      (mounts done, user namespace created: write its id maps now)
//   host -> init  maps_written
//   init -> host  ready | error {message}
// Exec, one connection to the control socket per command:
//   host -> init  exec {argv, env, cwd, stdin, root} + fds [stdout, stderr, stdin?,
//                                                          cgroup.procs...]
//   init -> host  exit {status, run_ns} | error {message}     (checked by parse_reply)
// Closing the connection early kills the command's process group.
#pragma once

#include <chrono>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/unique_fd.h"

namespace quarry::sandbox::local::protocol {

inline constexpr int kSetupFd = 3;
// Frames larger than this are refused: argv and env of one command, or the setup message.
inline constexpr uint32_t kMaxFrameBytes = 4 << 20;
inline constexpr size_t kMaxFds = 16;

struct Message {
  nlohmann::json body;
  std::vector<UniqueFd> fds;
};

using Deadline = std::chrono::steady_clock::time_point;
inline constexpr Deadline kNoDeadline = Deadline::max();

// Sends one frame; `fds` travel with its first byte.
Result<void> send(int socket, const nlohmann::json& body, std::span<const int> fds = {});
// Receives one frame. A peer that closed cleanly before a new frame gives kUnavailable; a frame
// not all there by `deadline` (a peer that sent part of one and stopped) kDeadlineExceeded.
Result<Message> receive(int socket, Deadline deadline = kNoDeadline);

// A message from init to the host, checked field by field: init runs inside the sandbox, so
// the host takes nothing in what it says on trust (a wrong type is an error, not an exception).
struct Reply {
  std::string type;     // "userns", "ready", "exit" or "error"
  int status = 0;       // exit: the command's wait status
  int64_t run_ns = 0;   // exit: how long it ran
  std::string message;  // error: what went wrong
};
Result<Reply> parse_reply(const nlohmann::json& body);

// The "type" of a message, or "" when the body is not an object or has no string "type": a
// peer may send any JSON, and a body of the wrong shape must be an error, not an exception.
std::string message_type(const nlohmann::json& body);

// exec: a command for init to start, as the host asks for it. init reads it with
// exec_request_from_json, which refuses a request of the wrong shape before anything starts.
// Every member has a default, so designated initializers may name only what they set.
// The descriptors that come with it: stdout, stderr, then stdin if `stdin` is set, then the
// exec cgroup's cgroup.procs files (one per hierarchy).
struct ExecRequest {
  std::vector<std::string> argv{};   // not empty; argv[0] is looked up in env's PATH
  std::vector<std::string> env{};    // "NAME=value"
  std::optional<std::string> cwd{};  // unset: the sandbox user's home
  bool has_stdin = false;            // a descriptor for stdin comes (else it is /dev/null)
  // Runs as the sandbox's root, without any capability, instead of the sandbox user: for what
  // the host itself installs (packages into the image's virtual environment, which root owns).
  // Never for code from the agent or a user.
  bool as_root = false;
};

nlohmann::json to_json(const ExecRequest& request);
Result<ExecRequest> exec_request_from_json(const nlohmann::json& body);

// A cgroup filesystem that init mounts read-only inside the sandbox (in its cgroup namespace,
// so it shows the sandbox's own subtree): programs there, such as DuckDB and Rust's
// available_parallelism, read their memory and CPU limits from it.
struct CgroupMount {
  std::string type;                  // "cgroup" or "cgroup2"
  std::string options;               // v1: the hierarchy's controllers, e.g. "cpu,cpuacct"
  std::string target;                // e.g. /sys/fs/cgroup/memory
  std::vector<std::string> aliases;  // symlinks beside target, e.g. cpu -> cpu,cpuacct
};

// The setup message: everything init needs to build the sandbox.
struct Setup {
  std::string root_dir;   // empty directory to mount the root filesystem on
  std::string lower_dir;  // the image's root filesystem (sent as a tree; named in errors)
  // Frozen layers between the image and the writable layer (a snapshot and the snapshots it was
  // made on), top first; each is sent as a tree, before the image's, and named in errors.
  std::vector<std::string> frozen_dirs;
  std::string upper_dir;       // the sandbox's writable layer
  std::string work_dir;        // overlayfs work directory, same filesystem as upper_dir
  std::string control_socket;  // where init listens for exec requests (host path)
  std::string hostname;
  uint32_t user_id = 1000;  // the sandbox user, inside the sandbox
  uint32_t group_id = 1000;
  uint32_t host_id_base = 0;  // host uid/gid that inside uid/gid 0 maps to
  std::string home;
  std::vector<std::string> directories;    // made and given to the sandbox user
  std::vector<uint8_t> seccomp_filter;     // struct sock_filter[], applied before serving
  uint32_t max_processes = 0;              // RLIMIT_NPROC for commands
  std::vector<CgroupMount> cgroup_mounts;  // at /sys/fs/cgroup, read-only
};

nlohmann::json to_json(const Setup& setup);
Result<Setup> setup_from_json(const nlohmann::json& body);

}  // namespace quarry::sandbox::local::protocol

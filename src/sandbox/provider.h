// SandboxProvider: the interface every sandbox backend implements (local now, Daytona later).
// Nothing local leaks through it: sandboxes are named by opaque ids and found by labels, paths
// are paths inside the sandbox, and every call may fail with a Result error.
#pragma once

#include <chrono>
#include <functional>
#include <iosfwd>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.h"
#include "config/config.h"

namespace quarry::sandbox {

using Labels = std::map<std::string, std::string>;

struct SandboxSpec {
  Labels labels;
  ResourceLimits resources;
  NetworkPolicy network;
  // The provider's snapshot to start from, by name, instead of the bare image ("" for none).
  std::string snapshot;
  // Extra Python packages (pip requirements: "tabulate", "tabulate==0.9.0"), installed when the
  // sandbox is created, on top of the image (and the snapshot). A provider with snapshots keeps
  // the result, so the next sandbox that asks for the same set starts with them installed.
  std::vector<std::string> packages;
  // Readable once the create is to stop (Ctrl-C, a cancelled turn); -1 for none. A create that
  // is still installing packages, or waiting for a remote sandbox to start, then removes what
  // it made and fails with kCancelled. Only polled, never read.
  int cancel_fd = -1;
};

// What `prepare` makes ready before a sandbox is handed out. (Packages are part of what a
// sandbox is made from, so they are in SandboxSpec: a provider picks its layers at create.)
struct PrepareSpec {
  std::vector<std::string> directories;  // created with parents, owned by the sandbox user
};

enum class SandboxState { kRunning, kStopped };

struct SandboxInfo {
  std::string id;
  Labels labels;
  ResourceLimits resources;
  SandboxState state = SandboxState::kRunning;
  std::chrono::system_clock::time_point created_at;
  NetworkPolicy network;
  std::string snapshot;               // what it started from ("" for the bare image)
  std::vector<std::string> packages;  // the extra packages asked for
};

enum class OutputStream { kStdout, kStderr };

// A connection the sandbox's network allowlist refused.
struct NetworkDenial {
  std::string host;  // as the program asked for it (a name, or an address)
  uint16_t port = 0;
  std::string reason;
};

struct ExecRequest {
  std::vector<std::string> argv;               // argv[0] is looked up in the sandbox's PATH
  std::map<std::string, std::string> env;      // added to the sandbox's base environment
  std::string working_directory;               // empty: the sandbox user's home
  std::chrono::milliseconds timeout{120'000};  // the whole process tree is killed after it
  uint64_t output_limit = 1 << 20;             // bytes of stdout and of stderr kept, each
  // Called with output as it arrives (all of it, even past output_limit). Optional.
  std::function<void(OutputStream, std::string_view)> on_output{};
  // A descriptor that becomes readable when the caller wants the command stopped (e.g. a
  // signalfd for SIGINT); -1 for none. The exec then fails with kCancelled.
  int cancel_fd = -1;
};

// What every exec reports. Times are wall-clock milliseconds; memory in bytes.
struct ExecResult {
  int exit_code = 0;          // the command's status; 128 + signal when killed by a signal
  std::optional<int> signal;  // the signal that ended it, if any
  std::string stdout_text;
  std::string stderr_text;
  bool truncated = false;  // stdout or stderr was longer than output_limit
  double run_ms = 0;       // from start to exit of the command
  double cpu_ms = 0;       // user + system CPU time of the command and all its children
  uint64_t peak_memory_bytes = 0;
  uint64_t memory_limit_bytes = 0;
  double overhead_ms = 0;  // whole call time minus run time: the provider's own cost
  bool oom = false;        // the kernel killed a process of this exec for memory
  bool timed_out = false;
  // Connections the sandbox's network allowlist refused while the command ran, and the first
  // of them (at most kMaxDenialsKept).
  uint64_t denied_connections = 0;
  std::vector<NetworkDenial> denials;
  // For the model: the OOM text ("Killed: command ran out of memory. ..."), a timeout notice,
  // or nothing.
  std::optional<std::string> message;
};

inline constexpr size_t kMaxDenialsKept = 16;

struct FileInfo {
  std::string path;  // inside the sandbox
  uint64_t size = 0;
  // Bytes of disk the file holds: less than `size` when it has holes (sparse), which a copy
  // would fill in. Equal to `size` where the provider cannot tell.
  uint64_t allocated = 0;
  uint64_t links = 1;  // names of the same file (hard links)
  bool is_directory = false;
  std::chrono::system_clock::time_point modified_at;
};

// One step of a Process: a message written to it, the output it makes until it answers.
struct StepRequest {
  std::string message;  // written to the process as one frame
  std::chrono::milliseconds timeout{120'000};
  // Written as a frame when the timeout passes or the caller cancels, so the process can stop
  // the step itself (Python: KeyboardInterrupt); empty: killed at once. Killed if it has not
  // answered `grace` later.
  std::string interrupt;
  std::chrono::milliseconds grace{5'000};
  std::chrono::milliseconds cancel_grace{1'000};  // the same, after a cancel
  uint64_t output_limit = 1 << 20;
  std::function<void(OutputStream, std::string_view)> on_output{};
  int cancel_fd = -1;
};

struct StepResult {
  // The step's metering (run time as the host saw it, CPU time, peak memory, OOM kills of this
  // step alone), its output, and, if the process ended, its exit status; timed_out when the
  // timeout passed (whether the process then stopped the step or was killed).
  ExecResult exec;
  std::optional<std::string> reply;  // the frame the process answered with; none if it ended
  bool exited = false;
  bool cancelled = false;
  bool peak_since_start = false;  // the kernel could not reset the peak: it is since start()
};

// A command that keeps running between the steps it is given (the Python kernel): it reads
// frames (a 4-byte little-endian length, then the bytes) from its stdin, a unix socket, and
// answers each step with one frame on it. It runs in a cgroup of its own, like an exec, which
// each step is measured by. Destroying it kills every process of the command.
class Process {
 public:
  virtual ~Process() = default;
  virtual Result<StepResult> step(const StepRequest& request) = 0;
  // Whether it still runs (false once it exited or was killed).
  virtual bool alive() = 0;
  // The provider's name for it in its sandbox: what another quarry process, which cannot reach
  // it, stops it by (SandboxProvider::stop_process).
  virtual const std::string& id() const = 0;
};

// What code in a provider's sandboxes runs with, so that the model writes code for it.
struct Runtime {
  std::string python_version;  // major.minor, e.g. 3.11
  // The packages the configuration asks for, in its order, each with its version ("polars",
  // "1.35.2"); and every Python package installed (normalised name -> version).
  std::vector<std::pair<std::string, std::string>> requested;
  std::map<std::string, std::string> installed;
};

class SandboxProvider {
 public:
  virtual ~SandboxProvider() = default;

  // The Python and packages new sandboxes have. kFailedPrecondition where the provider cannot
  // tell (or, for the local provider, while the image is not built).
  virtual Result<Runtime> runtime() {
    return make_error(ErrorCode::kFailedPrecondition,
                      "this sandbox provider does not say what its sandboxes run");
  }

  // Creates and starts a sandbox; returns once it accepts exec, with spec.packages installed.
  virtual Result<SandboxInfo> create(const SandboxSpec& spec) = 0;
  // Makes working directories (and later files) ready inside a running sandbox.
  virtual Result<void> prepare(std::string_view id, const PrepareSpec& spec) = 0;
  virtual Result<ExecResult> exec(std::string_view id, const ExecRequest& request) = 0;
  // Starts `request` (its timeout and output fields unused) as a Process. kFailedPrecondition
  // where the provider has no such processes: run each step as an exec then.
  virtual Result<std::unique_ptr<Process>> start(std::string_view id, const ExecRequest& request) {
    (void)id;
    (void)request;
    return make_error(ErrorCode::kFailedPrecondition,
                      "this sandbox provider keeps no process between commands");
  }
  // Stops the Process `process` (its id()) of the sandbox, started by this quarry process or by
  // another; one that is gone already needs nothing.
  virtual Result<void> stop_process(std::string_view id, std::string_view process) {
    (void)id;
    (void)process;
    return {};  // a provider that starts none has none to stop
  }
  // Kills every command running in the sandbox (the sandbox itself goes on), e.g. what a process
  // that died in the middle of an exec left running. Returns how many commands were stopped.
  virtual Result<int> stop_commands(std::string_view id) = 0;

  // Writes `content` to `path` (absolute, inside the sandbox), creating parent directories.
  // Once `cancel_fd` (-1: none) is readable it stops with kCancelled, leaving what was there.
  virtual Result<void> write_file(std::string_view id, std::string_view path, std::istream& content,
                                  int cancel_fd) = 0;
  // Copies the regular file at `path` to `out`; refuses symlinks and files over `max_bytes`.
  // Returns the number of bytes copied. Once `cancel_fd` (-1: none) is readable it stops with
  // kCancelled.
  virtual Result<uint64_t> read_file(std::string_view id, std::string_view path, std::ostream& out,
                                     uint64_t max_bytes, int cancel_fd) = 0;
  // Lists `directory` recursively (files and directories, not following links), within bounds
  // on entries, depth, path length and time that the provider sets; beyond them it fails with
  // kResourceExhausted and says which bound was met.
  virtual Result<std::vector<FileInfo>> list_files(std::string_view id,
                                                   std::string_view directory) = 0;
  // Whether `path` is a directory (false where nothing is, or something else, a link included).
  virtual Result<bool> is_directory(std::string_view id, std::string_view path) = 0;

  // Stops the sandbox and removes everything it used. Destroying an unknown id is kNotFound.
  virtual Result<void> destroy(std::string_view id) = 0;
  virtual Result<bool> is_alive(std::string_view id) = 0;
  // Every sandbox whose labels include all of `labels` (all sandboxes for an empty map).
  virtual Result<std::vector<SandboxInfo>> find(const Labels& labels) = 0;

  // The accounts new sandboxes are made in, by name, when this provider stands for several
  // (each with a quota the scheduler keeps to); empty: the provider is one account.
  virtual std::vector<std::pair<std::string, SandboxProvider*>> accounts() { return {}; }
};

}  // namespace quarry::sandbox

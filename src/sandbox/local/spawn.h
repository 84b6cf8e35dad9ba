// Starting a sandbox's init: one clone(2) into new mount, pid, network, UTS and IPC namespaces,
// straight into execve of quarry-init. The user and cgroup namespaces come later, from inside
// (see init/steps.h), so that everything mounted before them stays owned by the host.
#pragma once

#include <sys/types.h>

#include <filesystem>
#include <utility>

#include "common/error.h"
#include "common/unique_fd.h"

namespace quarry::sandbox::local {

// A stack of its own for a child that shares our memory (CLONE_VM), unmapped when this goes: it
// must outlive the child, or with CLONE_VFORK the clone call.
class ChildStack {
 public:
  static Result<ChildStack> make(size_t size);
  ChildStack(ChildStack&& other) noexcept
      : base_(std::exchange(other.base_, nullptr)), size_(other.size_) {}
  ChildStack& operator=(ChildStack&&) = delete;
  ~ChildStack();

  // clone(2) of `fn(arg)` on this stack with `flags` (CLONE_VM among them), every signal
  // blocked around the call, so no handler ever runs in the child: `fn` may make system calls
  // only. Returns the pid, or -1 with errno set.
  pid_t clone(int (*fn)(void*), void* arg, int flags, int* pidfd = nullptr);

 private:
  ChildStack(void* base, size_t size) : base_(base), size_(size) {}
  void* base_;
  size_t size_;
};

struct InitProcess {
  pid_t pid = 0;     // in our pid namespace
  UniqueFd pidfd;    // refers to the process for as long as we hold it, whatever its pid
  UniqueFd channel;  // the setup socket; init has the other end at fd 3
};

// `log_fd` becomes init's stderr.
Result<InitProcess> spawn_init(const std::filesystem::path& init_binary, int log_fd);

// /proc/<pid>/stat's start time, which with the pid names a process uniquely.
Result<uint64_t> process_start_time(pid_t pid);

// Opens a pidfd for `pid` if it is still the process that started at `start_time`.
// kNotFound if it has exited (or its pid was reused).
Result<UniqueFd> open_process(pid_t pid, uint64_t start_time);

// Whether the process behind `pidfd` has exited (a zombie counts as exited).
bool process_exited(int pidfd);

// Reaps the process if it is our child (no-op otherwise, e.g. after a restart).
void reap(int pidfd);

// SIGKILLs the process, waits (up to 10 s) until it is gone and reaps it if it is our child.
Result<void> kill_and_reap(int pidfd);

// Reaps the process that started at `start_time` as `pid` if it has exited and is our child:
// a sandbox init that died on its own stays a zombie of its creator until then.
void reap_exited(pid_t pid, uint64_t start_time);

}  // namespace quarry::sandbox::local

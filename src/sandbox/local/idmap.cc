#include "sandbox/local/idmap.h"

#include <fcntl.h>
#include <linux/mount.h>
#include <sched.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/file_util.h"
#include "sandbox/local/spawn.h"

namespace quarry::sandbox::local {
namespace {

constexpr size_t kChildStack = 16 * 1024;

// Runs in the child while it shares our memory (CLONE_VM), on a stack of its own: only system
// calls. Every descriptor but its end of the pipe goes: the parent closing the other end must
// be the end of the file, and a child made at the same time by another thread holds a copy of
// this pipe's write end (and this child of its pipe's) unless both close what they inherited.
int wait_for_release(void* raw) {
  const unsigned wait_fd = *static_cast<const unsigned*>(raw);
  if (wait_fd > 0) ::syscall(SYS_close_range, 0u, wait_fd - 1, 0u);
  ::syscall(SYS_close_range, wait_fd + 1, ~0u, 0u);
  char byte;
  (void)!::syscall(SYS_read, wait_fd, &byte, 1);
  ::syscall(SYS_exit, 0);
  return 0;
}

// A user namespace whose ids [from, from + count) are the host's [to, to + count): made by a
// child born in it, which waits on a pipe while its maps are written and its namespace opened,
// then exits. The child shares our memory rather than copying it as fork would: a copy of a
// server's address space (and, with its threads on other CPUs, the TLB shootdowns of making
// it copy-on-write) for a child that only reads a pipe.
Result<UniqueFd> mapping_namespace(uint32_t from, uint32_t to, uint32_t count) {
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0) return errno_error("pipe2");
  UniqueFd wait_end(pipe_fds[0]), release_end(pipe_fds[1]);
  // Its stack is ours until it has exited (declared before `done`, which waits for that).
  ASSIGN_OR_RETURN(ChildStack stack, ChildStack::make(kChildStack));
  unsigned wait_fd = static_cast<unsigned>(wait_end.get());
  const pid_t pid = stack.clone(wait_for_release, &wait_fd, CLONE_VM | CLONE_NEWUSER | SIGCHLD);
  if (pid < 0) return errno_error("clone(CLONE_NEWUSER)");
  auto done = [&] {
    release_end.reset();
    ::waitpid(pid, nullptr, 0);
  };
  const std::string map = fmt::format("{} {} {}\n", from, to, count);
  for (const char* file : {"uid_map", "gid_map"}) {
    auto written = write_control_file(fmt::format("/proc/{}/{}", pid, file), map);
    if (!written) {
      done();
      return std::unexpected(written.error());
    }
  }
  const std::string path = fmt::format("/proc/{}/ns/user", pid);
  UniqueFd ns(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  const int open_errno = errno;
  done();
  if (!ns) {
    errno = open_errno;
    return errno_error("open '{}'", path);
  }
  return ns;
}

}  // namespace

Result<UniqueFd> idmapped_tree(const std::filesystem::path& directory, uint32_t from, uint32_t to,
                               uint32_t count) {
  ASSIGN_OR_RETURN(UniqueFd ns, mapping_namespace(from, to, count));
  UniqueFd tree(static_cast<int>(
      ::syscall(SYS_open_tree, AT_FDCWD, directory.c_str(), OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC)));
  if (!tree) return errno_error("open_tree('{}')", directory.string());
  mount_attr attributes{};
  attributes.attr_set = MOUNT_ATTR_IDMAP;
  attributes.userns_fd = static_cast<uint64_t>(ns.get());
  if (::syscall(SYS_mount_setattr, tree.get(), "", AT_EMPTY_PATH, &attributes, sizeof attributes) !=
      0) {
    return errno_error(
        "an idmapped mount of '{}' (needs Linux 5.12 and a filesystem that "
        "supports it, e.g. ext4, btrfs or xfs)",
        directory.string());
  }
  return tree;
}

}  // namespace quarry::sandbox::local

// The seccomp filter for sandboxed processes, built with libseccomp on the host and handed to
// the sandbox's init as raw BPF, which loads it before serving any command.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "common/error.h"

namespace quarry::sandbox::local {

// Returns the filter as an array of struct sock_filter, ready for
// prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER). An allowlist: the syscalls analysis code needs
// (modelled on Docker's default profile) are allowed, socket(2) only for AF_UNIX, AF_INET,
// AF_INET6 and AF_NETLINK (others fail with EAFNOSUPPORT); what a sandbox may never do fails
// with EPERM, so a program sees a clean error rather than being killed (mounting and namespace
// changes, ptrace and cross-process memory access, kernel modules, kexec, bpf, perf events,
// keyrings, clock and swap changes, io_uring); everything else, including whatever a newer
// kernel adds, fails with ENOSYS. Syscalls of other architectures (i386, x32) kill the process.
// Fails if libseccomp does not know a listed name: a filter must never be built with holes.
Result<std::vector<uint8_t>> build_seccomp_filter();

// The names of the allowed and of the denied syscalls, for documentation and tests.
std::vector<std::string_view> allowed_syscalls();
std::vector<std::string_view> denied_syscalls();

}  // namespace quarry::sandbox::local

// The seccomp filter for sandboxed processes, built with libseccomp on the host and handed to
// the sandbox's init as raw BPF, which loads it before serving any command.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "common/error.h"

namespace quarry::sandbox::local {

// Returns the filter as an array of struct sock_filter, ready for
// prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER). Everything not listed is allowed (analysis code
// needs a wide and changing set of ordinary syscalls); what is listed fails with EPERM, so a
// program sees a clean error rather than being killed: mounting and namespace changes,
// ptrace and cross-process memory access, kernel modules, kexec, bpf, perf events, keyrings,
// clock and swap changes, and io_uring. Syscalls of other architectures (i386, x32) are killed.
Result<std::vector<uint8_t>> build_seccomp_filter();

// The names of the denied syscalls, for documentation and tests.
std::vector<std::string_view> denied_syscalls();

}  // namespace quarry::sandbox::local

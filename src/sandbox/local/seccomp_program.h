// The sandbox's seccomp filter as quarry carries it: the BPF program that build_seccomp_filter()
// (seccomp_filter.h) makes with libseccomp, compiled once at build time by the seccomp_compile
// tool into a generated source. Making it at run time took about 4 ms of every process that
// opened the provider (most of them never start a sandbox), and quarry no longer links
// libseccomp; tests/unit/seccomp_filter_test.cc holds the two to be the same program.
#pragma once

#include <cstdint>
#include <span>

namespace quarry::sandbox::local {

// An array of struct sock_filter, ready for prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER).
std::span<const uint8_t> seccomp_program();

}  // namespace quarry::sandbox::local

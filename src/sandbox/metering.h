// How an exec's measurements are put into words and JSON, the same for every provider.
#pragma once

#include <chrono>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "sandbox/provider.h"

namespace quarry::sandbox {

// The text the model gets when the kernel killed a command for memory:
//   Killed: command ran out of memory.
//   Peak memory: 973 MiB
//   Sandbox limit: 1024 MiB
std::string oom_message(uint64_t peak_memory_bytes, uint64_t memory_limit_bytes);

// One line for the model after each command:
//   exit code 0 · 1.23 s · CPU 1.20 s · peak memory 171 MiB of 1024 MiB
//   exit code 1 · 0.4 ms · CPU 0.4 ms · peak memory 86 MiB of 1024 MiB
std::string metering_line(const ExecResult& result);

// What the sandbox's network allowlist refused the command, or nothing:
//   Network: 2 connections refused by the sandbox's allowlist:
//     example.com:443: example.com is not in the sandbox's network allowlist
//     10.0.0.1:80: '10.0.0.1' is an IP address, not a name: ...
std::optional<std::string> network_message(const ExecResult& result);

// "Timed out: command ran longer than 30s and was killed."
std::string timeout_message(std::chrono::milliseconds timeout);

// Fills oom/timed_out-derived `message` from the other fields.
void describe(ExecResult& result, std::chrono::milliseconds timeout);
// The exit code (128 + N for a signal N, as a shell reports it) and signal of a waitpid status.
void set_exit_status(ExecResult& result, int wait_status);

// The `--json` shape of `quarry sandbox exec`: exit_code, signal, stdout, stderr, truncated,
// run_ms, cpu_ms, peak_memory_bytes, memory_limit_bytes, overhead_ms, oom, timed_out, message,
// denied_connections and denials ({host, port, reason}).
nlohmann::json to_json(const ExecResult& result);
// The denials as that JSON has them, and back (what does not parse is left out).
nlohmann::json denials_json(const std::vector<NetworkDenial>& denials);
std::vector<NetworkDenial> denials_from_json(const nlohmann::json& json);

}  // namespace quarry::sandbox

#include "sandbox/metering.h"

#include <fmt/format.h>
#include <sys/wait.h>

#include <cmath>

#include "common/units.h"

namespace quarry::sandbox {

namespace {

// Whole MiB, rounded.
uint64_t mebibytes(uint64_t bytes) {
  return static_cast<uint64_t>(std::llround(static_cast<double>(bytes) / (1024.0 * 1024.0)));
}

}  // namespace

std::string oom_message(uint64_t peak_memory_bytes, uint64_t memory_limit_bytes) {
  return fmt::format(
      "Killed: command ran out of memory.\nPeak memory: {} MiB\nSandbox limit: {} MiB",
      mebibytes(peak_memory_bytes), mebibytes(memory_limit_bytes));
}

std::string metering_line(const ExecResult& r) {
  return fmt::format("exit code {} · {} · CPU {} · peak memory {} MiB of {} MiB", r.exit_code,
                     format_elapsed(r.run_ms), format_elapsed(r.cpu_ms),
                     mebibytes(r.peak_memory_bytes), mebibytes(r.memory_limit_bytes));
}

std::optional<std::string> network_message(const ExecResult& result) {
  if (result.denied_connections == 0) return std::nullopt;
  std::string text = fmt::format(
      "Network: {} connection{} refused by the sandbox's allowlist:", result.denied_connections,
      result.denied_connections == 1 ? "" : "s");
  for (const auto& denial : result.denials)
    text += fmt::format("\n  {}:{}: {}", denial.host, denial.port, denial.reason);
  if (result.denied_connections > result.denials.size()) {
    text += fmt::format("\n  ({} more)", result.denied_connections - result.denials.size());
  }
  return text;
}

std::string timeout_message(std::chrono::milliseconds timeout) {
  return fmt::format("Timed out: command ran longer than {} and was killed.",
                     format_duration(timeout));
}

void set_exit_status(ExecResult& result, int wait_status) {
  if (WIFSIGNALED(wait_status)) {
    result.signal = WTERMSIG(wait_status);
    result.exit_code = 128 + WTERMSIG(wait_status);
  } else {
    result.exit_code = WEXITSTATUS(wait_status);
  }
}

void describe(ExecResult& result, std::chrono::milliseconds timeout) {
  if (result.oom) {
    result.message = oom_message(result.peak_memory_bytes, result.memory_limit_bytes);
  } else if (result.timed_out) {
    result.message = timeout_message(timeout);
  } else {
    result.message.reset();
  }
}

nlohmann::json to_json(const ExecResult& result) {
  auto round3 = [](double value) { return std::round(value * 1000.0) / 1000.0; };
  return {
      {"exit_code", result.exit_code},
      {"signal", result.signal ? nlohmann::json(*result.signal) : nlohmann::json(nullptr)},
      {"stdout", result.stdout_text},
      {"stderr", result.stderr_text},
      {"truncated", result.truncated},
      {"run_ms", round3(result.run_ms)},
      {"cpu_ms", round3(result.cpu_ms)},
      {"peak_memory_bytes", result.peak_memory_bytes},
      {"memory_limit_bytes", result.memory_limit_bytes},
      {"overhead_ms", round3(result.overhead_ms)},
      {"oom", result.oom},
      {"timed_out", result.timed_out},
      {"message", result.message ? nlohmann::json(*result.message) : nlohmann::json(nullptr)},
      {"denied_connections", result.denied_connections},
      {"denials", denials_json(result.denials)},
  };
}

nlohmann::json denials_json(const std::vector<NetworkDenial>& denials) {
  nlohmann::json json = nlohmann::json::array();
  for (const auto& denial : denials)
    json.push_back({{"host", denial.host}, {"port", denial.port}, {"reason", denial.reason}});
  return json;
}

std::vector<NetworkDenial> denials_from_json(const nlohmann::json& json) {
  std::vector<NetworkDenial> denials;
  if (!json.is_array()) return denials;
  for (const auto& denial : json) {
    if (!denial.is_object()) continue;
    denials.push_back(
        {denial.value("host", ""), denial.value("port", uint16_t{0}), denial.value("reason", "")});
  }
  return denials;
}

}  // namespace quarry::sandbox

#include "agent/kernel.h"

#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "agent/tools.h"
#include "common/json.h"
#include "common/units.h"
#include "conversation/context_filter.h"
#include "sandbox/metering.h"

namespace quarry::agent {
namespace {

// How long a kernel may take to start and say it is ready.
constexpr auto kStartTimeout = std::chrono::seconds(30);
// After a step's timeout the kernel is interrupted; if the step has not ended this much later,
// the kernel is killed.
constexpr auto kInterruptGrace = std::chrono::seconds(5);

// A script read from the sandbox may be any bytes: what is no UTF-8 goes as U+FFFD.
std::string frame(const nlohmann::json& message) {
  return message.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string held(const std::vector<std::string>& names) {
  return fmt::format("{}", fmt::join(names, "; "));
}

// "df: polars.DataFrame 6351 x 4" for each name the kernel reports.
std::vector<std::string> names_of(const nlohmann::json& reply) {
  std::vector<std::string> names;
  if (!reply.contains("names") || !reply["names"].is_array()) return names;
  for (const auto& entry : reply["names"]) {
    if (!entry.is_object() || !entry.value("name", nlohmann::json()).is_string()) continue;
    const auto type = entry.value("type", nlohmann::json());
    names.push_back(fmt::format("{}: {}", entry["name"].get<std::string>(),
                                type.is_string() ? type.get<std::string>() : "?"));
  }
  return names;
}

}  // namespace

Result<sandbox::Process*> PythonKernel::start(conversation::LazySandbox& sandbox,
                                              KernelStep& step) {
  sandbox::ExecRequest request;
  request.argv = {"python", "-c", std::string(kernel_source())};
  // Figures go to files, not to a display; output reaches quarry as it is written.
  request.env = {{"MPLBACKEND", "Agg"}, {"PYTHONUNBUFFERED", "1"}};
  ASSIGN_OR_RETURN(auto* process, sandbox.start_kernel(request));
  if (auto notice = sandbox.take_notice()) step.notes.push_back(*notice);
  sandbox::StepRequest hello;
  hello.message = frame({{"type", "hello"}});
  hello.timeout = kStartTimeout;
  auto ready = process->step(hello);
  auto reply = ready && ready->reply ? parse_json_or_discarded(*ready->reply) : nlohmann::json();
  if (!ready || !reply.is_object() || reply.value("type", "") != "ready") {
    sandbox.stop_kernel();
    std::string why = !ready ? ready.error().message
                      : ready->exec.stderr_text.empty()
                          ? fmt::format("it exited with code {}", ready->exec.exit_code)
                          : conversation::cut_middle(ready->exec.stderr_text, 2000);
    return make_error(ErrorCode::kUnavailable, "the Python kernel did not start: {}", why);
  }
  // A kernel of this sandbox that is no more (quarry restarted, or it was stopped): what it held
  // is gone. (A new sandbox's notice has said so already.)
  if (!sandbox.kernel_names().empty()) {
    step.notes.push_back(fmt::format(
        "Note: the Python kernel was started again; what it held is gone: {}. Load or compute "
        "it again.",
        held(sandbox.kernel_names())));
    RETURN_IF_ERROR(sandbox.set_kernel_names({}));
  }
  return process;
}

Result<KernelStep> PythonKernel::run(conversation::LazySandbox& sandbox, const KernelRun& run,
                                     const ToolIo& io) {
  KernelStep step;
  sandbox::Process* process = sandbox.kernel();
  if (process && run.fresh) {
    sandbox.stop_kernel();
    process = nullptr;
    if (!sandbox.kernel_names().empty()) {
      step.notes.push_back(
          fmt::format("A new Python process runs this step (fresh); what the "
                      "kernel held before is gone: {}.",
                      held(sandbox.kernel_names())));
      RETURN_IF_ERROR(sandbox.set_kernel_names({}));
    }
  }
  if (!process) {
    ASSIGN_OR_RETURN(process, start(sandbox, step));
  }

  sandbox::StepRequest request;
  request.message = frame({{"type", "run"},
                           {"code", run.code},
                           {"filename", run.filename},
                           {"output_dir", config_.sandbox.output_dir},
                           {"step", run.step}});
  request.interrupt = frame({{"type", "interrupt"}});
  request.timeout = config_.sandbox.exec_timeout;
  request.grace = std::chrono::duration_cast<std::chrono::milliseconds>(kInterruptGrace);
  request.output_limit = config_.sandbox.output_limit_bytes;
  request.on_output = io.on_output;
  request.cancel_fd = io.cancel_fd;
  const auto started = std::chrono::system_clock::now();
  auto ran = process->step(request);
  if (!ran) {
    sandbox.stop_kernel();
    return std::unexpected(ran.error());
  }
  step.exec = std::move(ran->exec);
  step.cancelled = ran->cancelled;
  auto& exec = step.exec;
  const std::vector<std::string> before = sandbox.kernel_names();
  const auto reply = ran->reply ? parse_json_or_discarded(*ran->reply) : nlohmann::json();
  if (reply.is_object() && reply.value("type", "") == "done") {
    const std::string status = reply.value("status", "error");
    exec.exit_code = status == "ok" ? 0 : 1;
    // The kernel's own clocks for the code: the rest of the step, its framing and its answer,
    // is quarry's overhead, and the CPU time is of the same stretch as the run time. (Only what
    // the code could have taken: what the sandbox says is not taken on trust.)
    if (auto kernel_ms = reply.find("run_ms"); kernel_ms != reply.end() && kernel_ms->is_number()) {
      const double total = exec.run_ms + exec.overhead_ms;
      exec.run_ms = std::clamp(kernel_ms->get<double>(), 0.0, exec.run_ms);
      exec.overhead_ms = total - exec.run_ms;
    }
    if (auto kernel_cpu = reply.find("cpu_ms");
        kernel_cpu != reply.end() && kernel_cpu->is_number()) {
      exec.cpu_ms = std::clamp(kernel_cpu->get<double>(), 0.0, exec.cpu_ms);
    }
    if (exec.timed_out) {
      exec.message = fmt::format(
          "Timed out: command ran longer than {} and was interrupted (KeyboardInterrupt); the "
          "kernel goes on with what it held.",
          format_duration(request.timeout));
    }
    if (ran->peak_since_start) {
      step.notes.push_back(
          "(Peak memory here is the kernel's since it started: this kernel "
          "cannot measure one step's alone.)");
    }
    RETURN_IF_ERROR(sandbox.set_kernel_names(names_of(reply)));
  } else {
    // The kernel is gone: out of memory, killed after its timeout, or it died.
    sandbox.stop_kernel();
    RETURN_IF_ERROR(sandbox.set_kernel_names({}));
    if (exec.exit_code == 0) exec.exit_code = 1;
    const std::string lost =
        before.empty()
            ? std::string(
                  "The Python kernel went with it (it held no names yet); the next step "
                  "starts a new one.")
            : fmt::format(
                  "The Python kernel's state was lost with it: {}. The next step starts a new "
                  "kernel; load or compute what it needs again.",
                  held(before));
    if (exec.oom) {
      exec.message =
          sandbox::oom_message(exec.peak_memory_bytes, exec.memory_limit_bytes) + "\n" + lost;
    } else if (exec.timed_out) {
      exec.message = fmt::format(
          "Timed out: command ran longer than {}, did not stop when interrupted and was killed. "
          "{}",
          format_duration(request.timeout), lost);
    } else if (step.cancelled) {
      exec.message = fmt::format(
          "Stopped: the kernel did not stop the step when asked and was "
          "killed. {}",
          lost);
    } else {
      exec.message =
          fmt::format("The Python kernel stopped (exit code {}). {}", exec.exit_code, lost);
    }
  }
  RETURN_IF_ERROR(
      sandbox.record_step(fmt::format("python {} (kernel)", run.filename), exec, started));
  return step;
}

}  // namespace quarry::agent

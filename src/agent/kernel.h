// The Python kernel: one long-lived interpreter per conversation in its sandbox (kernel.py),
// so variables, imports and loaded data stay between run_python steps. Each step is metered on
// its own (run time, CPU time, peak memory, OOM), streams its output, shows the value of its
// last expression and saves the matplotlib figures it left open. A kernel that ran out of
// memory, was killed after a timeout, or went with its sandbox is started again at the next
// step, and the model is told what it held.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "config/config.h"
#include "conversation/lazy_sandbox.h"

namespace quarry::agent {

struct ToolIo;

// kernel.py's text, built in.
std::string_view kernel_source();

struct KernelRun {
  std::string code;
  std::string filename;  // what tracebacks name
  bool fresh = false;    // a new kernel: what the old one held is dropped
  std::string step;      // names the figures it saves: "turn3_step2" gives figure_turn3_step2_1.png
};

struct KernelStep {
  sandbox::ExecResult exec;  // this step's output and metering; exit_code 1 if the code failed
  // What the model is told besides the output: a kernel started (again) and what was lost, a
  // timeout that interrupted the step, the kernel lost with its state.
  std::vector<std::string> notes;
  bool cancelled = false;
};

class PythonKernel {
 public:
  explicit PythonKernel(const Config& config) : config_(config) {}

  // Runs one step in the conversation's kernel, starting one first if it has none.
  // kFailedPrecondition when the sandbox provider keeps no processes: run it as an exec then.
  Result<KernelStep> run(conversation::LazySandbox& sandbox, const KernelRun& run,
                         const ToolIo& io);

 private:
  Result<sandbox::Process*> start(conversation::LazySandbox& sandbox, KernelStep& step);

  const Config& config_;
};

}  // namespace quarry::agent

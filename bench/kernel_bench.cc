// A Python step after `import polars` and a read of a Parquet file, side by side in one run:
//   1. quarry's kernel: run_python through the Toolbox as the agent calls it (host to host:
//      the step's whole call, and the kernel's own run of the code);
//   2. a fresh process per step, as run_python was before the kernel: the import and the read
//      come again with every step, since nothing is kept;
//   3. a Jupyter kernel (ipykernel, driven by jupyter_client inside the same sandbox: the E2B
//      approach), timed inside the sandbox, so without the host's hop.
// Prints p50 and p90 in milliseconds; asserts nothing. The image must have ipykernel and
// jupyter_client (bench/kernel.sh makes one and runs this):
//   build/bench/kernel_bench CONFIG [STEPS]
#include <sys/mount.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "agent/tools.h"
#include "config/paths.h"
#include "conversation/conversation_manager.h"
#include "conversation/sqlite_history_store.h"
#include "percentiles.h"
#include "sandbox/local/local_provider.h"

namespace {

using quarry::bench::Clock;
using quarry::bench::ms_since;
using quarry::bench::stats;
using quarry::bench::Stats;

[[noreturn]] void fail(const std::string& message) {
  std::fprintf(stderr, "kernel_bench: %s\n", message.c_str());
  std::exit(1);
}

template <typename T>
T must(quarry::Result<T> result, const char* what) {
  if (!result) fail(fmt::format("{}: {}", what, result.error().message));
  return std::move(*result);
}

constexpr const char* kData = "/home/sandbox/data/events.parquet";
constexpr const char* kLoad =
    "import polars as pl\ndf = pl.read_parquet('/home/sandbox/data/events.parquet')\n";

// Inside the sandbox: a Jupyter kernel started and stepped with jupyter_client; prints the
// step times (ms) as JSON.
constexpr const char* kJupyter = R"(
import json, sys, time
from jupyter_client.manager import start_new_kernel
steps = int(sys.argv[1])
manager, client = start_new_kernel(kernel_name="python3")
def run(code):
    reply = client.execute_interactive(code, timeout=60, output_hook=lambda message: None)
    assert reply["content"]["status"] == "ok", reply["content"]
client.wait_for_ready(timeout=60)
run(sys.argv[2])
run("df.shape")
times = []
for _ in range(steps):
    start = time.perf_counter()
    run("df.shape")
    times.append((time.perf_counter() - start) * 1000)
client.stop_channels()
manager.shutdown_kernel(now=True)
print(json.dumps(times))
)";

void row(const char* name, Stats s) {
  std::printf("%-62s %8.2f %8.2f %5zu\n", name, s.p50, s.p90, s.n);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) fail("usage: kernel_bench CONFIG [STEPS]");
  const int steps = argc > 2 ? std::stoi(argv[2]) : 50;
  auto config = must(quarry::load_config(std::filesystem::path(argv[1])), "config");
  const auto state_dir = std::filesystem::path(fmt::format("/tmp/qk-{}", ::getpid()));
  const auto cache_dir = quarry::resolve_cache_dir(std::nullopt);
  const auto built = std::filesystem::read_symlink("/proc/self/exe").parent_path().parent_path();
  auto provider =
      must(quarry::sandbox::local::LocalProvider::open(
               config.sandbox, {state_dir, cache_dir, built / "src/quarry-init",
                                config.capacity.overcommit, built / "src/quarry-proxy"}),
           "open");
  quarry::SystemClock clock;
  auto history = must(
      quarry::conversation::SqliteHistoryStore::open(state_dir / "history.db", clock), "history");
  auto options = quarry::conversation::manager_options(config);
  options.instance_id = "kernel-bench";
  quarry::conversation::ConversationManager manager(*provider, *history, clock, options);
  const auto conversation = must(history->create_conversation("bench"), "conversation").id;
  auto turn = must(manager.begin_turn(conversation), "turn");
  quarry::agent::Toolbox toolbox(
      {config, quarry::make_error(quarry::ErrorCode::kUnavailable, "no database"), *history,
       state_dir});
  int call = 0;
  auto python = [&](const std::string& code, bool fresh = false) {
    nlohmann::json arguments = {{"code", code}};
    if (fresh) arguments["fresh"] = true;
    const auto start = Clock::now();
    auto result = toolbox.call({fmt::format("c{}", ++call), "run_python", arguments.dump()}, *turn);
    const double elapsed = ms_since(start);
    if (!result.ok) fail("a step failed: " + result.content);
    return std::pair{elapsed, *result.exec};
  };

  // 1,000,000 rows of the demo's events shape, written once.
  python(fmt::format("import polars as pl\n"
                     "n = 1_000_000\n"
                     "pl.DataFrame({{'device': ['phone', 'tv', 'web', 'tablet'] * (n // 4),\n"
                     "              'session_id': range(n), 'session_length_seconds': range(n)}})"
                     ".write_parquet('{}')\n",
                     kData),
         /*fresh=*/true);

  // 1. The kernel: loaded once, then steps on what it holds.
  python(kLoad);
  python("df.shape");
  std::vector<double> kernel_call, kernel_run, kernel_overhead;
  for (int i = 0; i < steps; ++i) {
    auto [elapsed, exec] = python("df.shape");
    kernel_call.push_back(elapsed);
    kernel_run.push_back(exec.run_ms);
    kernel_overhead.push_back(exec.overhead_ms);
  }
  // 2. A fresh process per step: the import and the read each time.
  std::vector<double> fresh_call;
  for (int i = 0; i < std::max(steps / 5, 5); ++i) {
    fresh_call.push_back(python(std::string(kLoad) + "print(df.shape)", /*fresh=*/true).first);
  }
  // 3. Jupyter in the same sandbox.
  const auto sandbox_id = must(history->sandbox_reference(conversation), "reference").sandbox_id;
  quarry::sandbox::ExecRequest jupyter;
  jupyter.argv = {"python", "-c", kJupyter, std::to_string(steps), kLoad};
  jupyter.timeout = std::chrono::minutes(5);
  auto ran = must(provider->exec(sandbox_id, jupyter), "jupyter");
  if (ran.exit_code != 0) fail("the Jupyter driver failed:\n" + ran.stderr_text);
  const auto jupyter_times = nlohmann::json::parse(ran.stdout_text).get<std::vector<double>>();

  std::printf(
      "a step `df.shape` on 1,000,000 rows read with polars (%d steps)   p50 ms   p90 ms     n\n",
      steps);
  row("quarry kernel: run_python, the whole call (host to host)", stats(kernel_call));
  row("  of which the kernel's run of the code", stats(kernel_run));
  row("  of which quarry's overhead (call time - run)", stats(kernel_overhead));
  row("fresh process per step: import polars + read + shape", stats(fresh_call));
  row("Jupyter kernel (ipykernel + jupyter_client, inside the sandbox)", stats(jupyter_times));
  std::printf("kernel call p50 is %.1fx faster than a fresh process, %.1fx than Jupyter\n",
              stats(fresh_call).p50 / stats(kernel_call).p50,
              stats(jupyter_times).p50 / stats(kernel_call).p50);

  turn.reset();
  (void)manager.shutdown();
  provider.reset();
  ::umount2((state_dir / "sandboxes").c_str(), 0);
  std::filesystem::remove_all(state_dir);
  return 0;
}

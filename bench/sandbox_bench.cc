// Sandbox start, exec and destroy times and idle memory, side by side with bubblewrap (one
// sandbox per command, the same image, the same namespaces) and plain fork/exec on the host.
// Prints a table; asserts nothing. Run as root after `quarry image build`:
//   build/bench/sandbox_bench [--quick]
#include <fcntl.h>
#include <spawn.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "common/file_util.h"
#include "config/paths.h"
#include "percentiles.h"
#include "sandbox/local/image.h"
#include "sandbox/local/local_provider.h"

extern char** environ;

namespace {

using quarry::bench::Clock;
using quarry::bench::ms_since;
using quarry::bench::stats;
using quarry::bench::Stats;
using quarry::sandbox::local::LocalProvider;

// What a run that fails half way must still take apart: its sandboxes (their inits would
// live on), the volume and the state directory. Set once the provider is open.
std::function<void()> clean_up = [] {};

[[noreturn]] void fail(const std::string& message) {
  std::fprintf(stderr, "%s\n", message.c_str());
  clean_up();
  std::exit(1);
}

template <typename T>
T must(quarry::Result<T> result, const char* what) {
  if (!result) fail(fmt::format("{}: {}", what, result.error().message));
  return std::move(*result);
}

void must(quarry::Result<void> result, const char* what) {
  if (!result) fail(fmt::format("{}: {}", what, result.error().message));
}

// posix_spawn + wait of argv, in milliseconds.
double spawn_and_wait(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  for (const auto& arg : args)
    argv.push_back(const_cast<char*>(arg.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  auto start = Clock::now();
  pid_t pid = 0;
  if (::posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ) != 0) {
    fail(fmt::format("cannot run {}", argv[0]));
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  double elapsed = ms_since(start);
  posix_spawn_file_actions_destroy(&actions);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    fail(fmt::format("{} failed (status {})", argv[0], status));
  }
  return elapsed;
}

std::vector<double> repeat(int n, const std::function<double()>& once) {
  once();  // warm up
  std::vector<double> samples;
  for (int i = 0; i < n; ++i)
    samples.push_back(once());
  return samples;
}

std::map<std::string, double> meminfo_kib() {
  std::map<std::string, double> fields;
  std::ifstream meminfo("/proc/meminfo");
  std::string line;
  while (std::getline(meminfo, line)) {
    auto colon = line.find(':');
    if (colon != std::string::npos) {
      fields[line.substr(0, colon)] = std::stod(line.substr(colon + 1));
    }
  }
  return fields;
}

// Lets the kernel finish deferred work (RCU frees, delayed unmounts) and drops clean page
// cache, so that what remains to compare is memory that cannot be reclaimed.
void settle() {
  ::sync();
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  std::ofstream("/proc/sys/vm/drop_caches") << "1";
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
}

double pss_kib(pid_t pid) {
  std::ifstream rollup(fmt::format("/proc/{}/smaps_rollup", pid));
  std::string line;
  while (std::getline(rollup, line)) {
    if (line.starts_with("Pss:")) return std::stod(line.substr(4));
  }
  return 0;
}

void row(const char* name, Stats quarry, Stats bwrap, Stats host) {
  auto cell = [](Stats s) {
    return s.n ? fmt::format("{:8.2f} {:8.2f}", s.p50, s.p90) : fmt::format("{:>17}", "-");
  };
  std::printf("%-36s %s   %s   %s\n", name, cell(quarry).c_str(), cell(bwrap).c_str(),
              cell(host).c_str());
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::string(argv[1]) == "--quick";
  const int starts = quick ? 10 : 50;
  const int execs = quick ? 50 : 300;
  const int pythons = quick ? 5 : 20;
  const int idle_sandboxes = quick ? 10 : 50;

  quarry::Config config;
  const auto state_dir = std::filesystem::path(fmt::format("/tmp/qb-{}", ::getpid()));
  const auto cache_dir = quarry::resolve_cache_dir(std::nullopt);
  const auto built = std::filesystem::read_symlink("/proc/self/exe").parent_path().parent_path();
  auto provider = must(
      LocalProvider::open(config.sandbox, {state_dir, cache_dir, built / "src/quarry-init",
                                           config.capacity.overcommit, built / "src/quarry-proxy"}),
      "open");
  clean_up = [&] {
    if (provider) {
      if (auto left = provider->find({})) {
        for (const auto& info : *left)
          (void)provider->destroy(info.id);
      }
      provider.reset();
    }
    ::umount2((state_dir / "sandboxes").c_str(), 0);
    std::filesystem::remove_all(state_dir);
  };
  auto definition =
      must(quarry::sandbox::local::default_image_definition(config.sandbox), "image definition");
  auto image = must(quarry::sandbox::local::ImageStore(cache_dir).find(definition), "image");
  const std::string rootfs = image.rootfs.string();
  quarry::sandbox::SandboxSpec spec;
  spec.resources = config.sandbox.resources;
  // Many idle sandboxes at once: with the default limits (1 GiB, 1 CPU, 2 GiB of disk) 50 of
  // them are more than this host may admit (capacity.overcommit), so they get small ones.
  quarry::sandbox::SandboxSpec idle_spec = spec;
  idle_spec.resources.memory_bytes = 256 << 20;
  idle_spec.resources.cpus = 0.1;
  idle_spec.resources.disk_bytes = 256 << 20;

  // Idle cost, measured first while nothing else has run: what each idle sandbox holds that
  // cannot be reclaimed (anonymous and shared memory, unreclaimable slab, kernel stacks, page
  // tables, per-cpu data), and the drop in free memory, which also counts page cache.
  must(provider->destroy(must(provider->create(spec), "create").id), "destroy");
  settle();
  auto before = meminfo_kib();
  std::vector<std::string> idle;
  for (int i = 0; i < idle_sandboxes; ++i) {
    idle.push_back(must(provider->create(idle_spec), "create").id);
  }
  settle();
  auto after = meminfo_kib();
  double init_pss = 0;
  double charged = 0;
  for (const auto& id : idle) {
    charged += static_cast<double>(must(provider->memory_usage(id), "memory usage"));
    auto record = quarry::read_file(state_dir / "sandboxes" / id / "sandbox.json");
    if (record) init_pss += pss_kib(nlohmann::json::parse(*record)["init_pid"].get<pid_t>());
  }
  for (const auto& id : idle)
    must(provider->destroy(id), "destroy");
  auto per_sandbox_mib = [&](std::initializer_list<const char*> keys) {
    double total = 0;
    for (const char* key : keys)
      total += after[key] - before[key];
    return total / 1024 / idle_sandboxes;
  };
  const double unreclaimable =
      per_sandbox_mib({"AnonPages", "Shmem", "SUnreclaim", "KernelStack", "PageTables", "Percpu"});

  // quarry: create -> ready, destroy.
  std::vector<double> create_ms, destroy_ms;
  for (int i = 0; i < starts; ++i) {
    auto start = Clock::now();
    auto info = must(provider->create(spec), "create");
    create_ms.push_back(ms_since(start));
    start = Clock::now();
    must(provider->destroy(info.id), "destroy");
    destroy_ms.push_back(ms_since(start));
  }

  // quarry: commands in one running sandbox.
  auto sandbox = must(provider->create(spec), "create");
  std::vector<double> overhead_ms;
  auto exec = [&](std::vector<std::string> command) {
    quarry::sandbox::ExecRequest request;
    request.argv = std::move(command);
    auto start = Clock::now();
    auto result = must(provider->exec(sandbox.id, request), "exec");
    double elapsed = ms_since(start);
    if (result.exit_code != 0) fail(fmt::format("exec failed: {}", result.stderr_text));
    overhead_ms.push_back(result.overhead_ms);
    return elapsed;
  };
  auto exec_true = repeat(execs, [&] { return exec({"true"}); });
  auto exec_overhead = overhead_ms;
  // An agent's commands come seconds apart, not back to back: what the kernel does lazily
  // (such as the grace period moving a process into a cgroup can wait for) shows here.
  overhead_ms.clear();
  auto exec_sparse = repeat(pythons, [&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    return exec({"true"});
  });
  auto sparse_overhead = overhead_ms;
  auto python_pass = repeat(pythons, [&] { return exec({"python3", "-c", "pass"}); });
  auto polars = repeat(pythons, [&] { return exec({"python", "-c", "import polars"}); });
  must(provider->destroy(sandbox.id), "destroy");

  // bubblewrap: a fresh sandbox per command, the same image read-only, the same namespaces.
  auto bwrap = [&](std::vector<std::string> command) {
    std::vector<std::string> args = {
        "/usr/bin/bwrap", "--ro-bind", rootfs,          "/",
        "--proc",         "/proc",     "--dev",         "/dev",
        "--tmpfs",        "/tmp",      "--unshare-all", "--die-with-parent",
        "--clearenv",     "--setenv",  "PATH",          "/opt/quarry/venv/bin:/usr/bin:/bin"};
    args.insert(args.end(), command.begin(), command.end());
    return spawn_and_wait(args);
  };
  auto bwrap_true = repeat(execs / 3, [&] { return bwrap({"true"}); });
  auto bwrap_python = repeat(pythons, [&] { return bwrap({"python3", "-c", "pass"}); });
  auto bwrap_polars = repeat(pythons, [&] { return bwrap({"python", "-c", "import polars"}); });

  // The host: plain posix_spawn of the same programs. The image's virtual environment runs on
  // the host's /usr/bin/python3, the same Debian build as the image's.
  auto host_true = repeat(execs, [&] { return spawn_and_wait({"/bin/true"}); });
  auto host_python = repeat(pythons, [&] {
    return spawn_and_wait({"/usr/bin/python3", "-c", "pass"});
  });
  auto host_polars = repeat(pythons, [&] {
    return spawn_and_wait({rootfs + "/opt/quarry/venv/bin/python", "-c", "import polars"});
  });

  const std::string cgroup_version(provider->cgroup_version());
  clean_up();

  std::printf("quarry sandbox benchmark (cgroup %s, image %s); milliseconds\n\n",
              cgroup_version.c_str(), image.hash.c_str());
  std::printf("%-36s %17s   %17s   %17s\n", "", "quarry", "bwrap", "host fork/exec");
  std::printf("%-36s %8s %8s   %8s %8s   %8s %8s\n", "", "p50", "p90", "p50", "p90", "p50", "p90");
  row("start: create->ready | bwrap true", stats(create_ms), stats(bwrap_true), {});
  row("exec true (whole call)", stats(exec_true), stats(bwrap_true), stats(host_true));
  row("exec true (overhead_ms: call - run)", stats(exec_overhead), {}, {});
  row("exec true, one per 100 ms (call)", stats(exec_sparse), {}, {});
  row("  the same, overhead_ms", stats(sparse_overhead), {}, {});
  row("destroy", stats(destroy_ms), {}, {});
  row("python3 -c pass", stats(python_pass), stats(bwrap_python), stats(host_python));
  row("python -c 'import polars'", stats(polars), stats(bwrap_polars), stats(host_polars));
  std::printf(
      "\nidle sandboxes (%d), host memory per sandbox: %.2f MiB unreclaimable (anon, shmem, "
      "unreclaimable slab, kernel stacks, page tables, per-cpu), %.2f MiB charged to its "
      "cgroup, init PSS %.2f MiB\n",
      idle_sandboxes, unreclaimable, charged / (1 << 20) / idle_sandboxes,
      init_pss / 1024 / idle_sandboxes);
  std::printf("samples: %d starts, %d execs (%d bwrap), %d python runs each\n", starts, execs,
              execs / 3, pythons);
  std::printf(
      "targets: start p50 <= bwrap true p50; exec overhead p50 < 1.5 ms; destroy p50 < "
      "5 ms; idle < 5 MiB per sandbox\n");
  return 0;
}

#include "sandbox_environment.h"

#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <thread>

#include "common/file_util.h"
#include "config/paths.h"
#include "sandbox/local/spawn.h"
#include "sandbox/local/state.h"

namespace quarry::testing {
namespace {

SandboxEnvironment* g_environment = nullptr;

}  // namespace

SandboxEnvironment& SandboxEnvironment::get() {
  return *g_environment;
}

std::filesystem::path SandboxEnvironment::cache_dir() const {
  return resolve_cache_dir(std::nullopt);
}

std::filesystem::path SandboxEnvironment::quarry_binary() const {
  return std::filesystem::path(QUARRY_BUILD_DIR) / "src/quarry";
}

std::filesystem::path SandboxEnvironment::fresh_history_path() const {
  auto path =
      state_dir_ /
      fmt::format("history-{}.db", ::testing::UnitTest::GetInstance()->current_test_info()->name());
  std::filesystem::remove(path);
  return path;
}

std::filesystem::path SandboxEnvironment::init_binary() const {
  return std::filesystem::path(QUARRY_BUILD_DIR) / "src/quarry-init";
}

std::filesystem::path SandboxEnvironment::proxy_binary() const {
  return std::filesystem::path(QUARRY_BUILD_DIR) / "src/quarry-proxy";
}

void SandboxEnvironment::SetUp() {
  g_environment = this;
  // Sandboxes whose creator dies are re-parented to the nearest subreaper; being one means
  // this process can reap them after destroying them, whatever the host's PID 1 does.
  ::prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
  // Short: control socket paths must fit in a sockaddr_un.
  state_dir_ = fmt::format("/tmp/qt-{}", ::getpid());
  std::filesystem::remove_all(state_dir_);
  auto provider = sandbox::local::LocalProvider::open(
      config_.sandbox,
      {state_dir_, cache_dir(), init_binary(), config_.capacity.overcommit, proxy_binary()});
  ASSERT_TRUE(provider) << provider.error().message;
  provider_ = std::move(*provider);
}

void SandboxEnvironment::TearDown() {
  // Every sandbox directory, with a record or not (a create cut short, however recently): the
  // state directory goes, and with it any way to find their cgroups again.
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(state_dir_ / "sandboxes", error)) {
    if (provider_) (void)provider_->destroy(entry.path().filename().string());
  }
  provider_.reset();
  ::umount2((state_dir_ / "sandboxes").c_str(), 0);
  std::filesystem::remove_all(state_dir_);
}

Result<sandbox::ExecResult> run(std::string_view id, std::vector<std::string> argv,
                                std::chrono::milliseconds timeout) {
  sandbox::ExecRequest request;
  request.argv = std::move(argv);
  request.timeout = timeout;
  return SandboxEnvironment::get().provider().exec(id, request);
}

Result<sandbox::ExecResult> python(std::string_view id, const std::string& code,
                                   std::chrono::milliseconds timeout) {
  return run(id, {"python3", "-c", code}, timeout);
}

sandbox::SandboxSpec ScopedSandbox::default_spec() {
  sandbox::SandboxSpec spec;
  spec.resources = SandboxEnvironment::get().config().sandbox.resources;
  spec.labels = {{"test", ::testing::UnitTest::GetInstance()->current_test_info()->name()}};
  return spec;
}

ScopedSandbox::ScopedSandbox(sandbox::SandboxSpec spec) {
  auto info = SandboxEnvironment::get().provider().create(spec);
  if (!info) {
    ADD_FAILURE() << "create failed: " << info.error().message;
    return;
  }
  id_ = info->id;
}

ScopedSandbox::~ScopedSandbox() {
  if (id_.empty()) return;
  auto destroyed = SandboxEnvironment::get().provider().destroy(id_);
  if (!destroyed && destroyed.error().code != ErrorCode::kNotFound) {
    ADD_FAILURE() << "destroy failed: " << destroyed.error().message;
  }
}

std::vector<pid_t> host_processes_of(std::string_view id) {
  std::vector<pid_t> pids;
  const std::string needle = fmt::format("/quarry/{}", id);
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    auto cgroups = read_file(entry.path() / "cgroup");
    if (!cgroups || cgroups->find(needle) == std::string::npos) continue;
    // A process killed a moment ago may still be a zombie, waiting for the sandbox's init to
    // reap it: it is gone, though /proc still shows its cgroups.
    auto stat = read_file(entry.path() / "stat");
    if (stat) {
      const auto name_end = stat->rfind(") ");
      if (name_end != std::string::npos && stat->compare(name_end + 2, 1, "Z") == 0) continue;
    }
    pids.push_back(std::stoi(name));
  }
  return pids;
}

std::vector<std::string> command_lines_when(
    std::string_view id, const std::function<bool(const std::vector<std::string>&)>& settled,
    std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    std::vector<std::string> command_lines;
    for (pid_t pid : host_processes_of(id)) {
      auto command_line = read_file(fmt::format("/proc/{}/cmdline", pid));
      if (!command_line) continue;  // gone since
      std::replace(command_line->begin(), command_line->end(), '\0', ' ');
      command_lines.push_back(std::move(*command_line));
    }
    if (settled(command_lines) || std::chrono::steady_clock::now() >= deadline) {
      return command_lines;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

std::vector<std::filesystem::path> cgroups_of(std::string_view id) {
  std::vector<std::filesystem::path> found;
  const std::filesystem::path root = "/sys/fs/cgroup";
  std::vector<std::filesystem::path> hierarchies = {root};  // v2 alone: one at the root
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(root, error)) {
    if (entry.is_directory(error)) hierarchies.push_back(entry.path());
  }
  for (const auto& hierarchy : hierarchies) {
    const auto cgroup = hierarchy / "quarry" / std::string(id);
    if (std::filesystem::exists(cgroup, error)) found.push_back(cgroup);
  }
  return found;
}

void kill_init_of(std::string_view id) {
  auto record = sandbox::local::StateStore(SandboxEnvironment::get().state_dir()).load(id);
  ASSERT_TRUE(record) << record.error().message;
  auto init = sandbox::local::open_process(record->init_pid, record->init_start_time);
  ASSERT_TRUE(init) << "sandbox " << id << ": " << init.error().message;
  auto killed = sandbox::local::kill_and_reap(init->get());
  ASSERT_TRUE(killed) << killed.error().message;
}

void reap_orphaned_inits() {
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    auto stat = read_file(entry.path() / "stat");
    if (!stat || stat->find("(quarry-init) Z ") == std::string::npos) continue;
    ::waitpid(std::stoi(name), nullptr, WNOHANG);
  }
}

}  // namespace quarry::testing

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  ::testing::AddGlobalTestEnvironment(new quarry::testing::SandboxEnvironment);
  return RUN_ALL_TESTS();
}

// Sandbox lifecycle and the provider interface: exec, files, find, destroy, and survival of
// the process that created them.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/inotify.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include "common/command.h"
#include "common/file_util.h"
#include "common/unique_fd.h"
#include "sandbox/local/idmap.h"
#include "sandbox/local/local_provider.h"
#include "sandbox/local/volume.h"
#include "sandbox_environment.h"

extern char** environ;

namespace quarry::testing {
namespace {

sandbox::SandboxProvider& provider() {
  return SandboxEnvironment::get().provider();
}

TEST(Exec, PassesExitCodesOutputEnvAndDirectory) {
  ScopedSandbox sandbox;
  sandbox::ExecRequest request;
  request.argv = {"sh", "-c", "echo out; echo err >&2; pwd; echo $GREETING; exit 3"};
  request.env = {{"GREETING", "hello"}};
  request.working_directory = "/tmp";
  std::string streamed;
  request.on_output = [&](sandbox::OutputStream stream, std::string_view data) {
    if (stream == sandbox::OutputStream::kStdout) streamed += data;
  };
  auto result = provider().exec(sandbox.id(), request);
  ASSERT_TRUE(result) << result.error().message;
  EXPECT_EQ(result->exit_code, 3);
  EXPECT_FALSE(result->signal);
  EXPECT_EQ(result->stdout_text, "out\n/tmp\nhello\n");
  EXPECT_EQ(result->stderr_text, "err\n");
  EXPECT_EQ(streamed, result->stdout_text);
}

TEST(Exec, ReportsCommandsThatCannotStart) {
  ScopedSandbox sandbox;
  auto missing = run(sandbox.id(), {"no-such-program"});
  ASSERT_TRUE(missing) << missing.error().message;
  EXPECT_EQ(missing->exit_code, 127);
  EXPECT_NE(missing->stderr_text.find("cannot run 'no-such-program'"), std::string::npos);
  sandbox::ExecRequest request;
  request.argv = {"true"};
  request.working_directory = "/nowhere";
  auto bad_dir = provider().exec(sandbox.id(), request);
  ASSERT_TRUE(bad_dir);
  EXPECT_EQ(bad_dir->exit_code, 126);
  EXPECT_NE(bad_dir->stderr_text.find("/nowhere"), std::string::npos);
  auto empty = provider().exec(sandbox.id(), sandbox::ExecRequest{});
  ASSERT_FALSE(empty);
  EXPECT_EQ(empty.error().code, ErrorCode::kInvalidArgument);
}

TEST(Exec, CapsOutputAndSaysSo) {
  ScopedSandbox sandbox;
  sandbox::ExecRequest request;
  request.argv = {"sh", "-c", "head -c 300000 /dev/zero | tr '\\0' a"};
  request.output_limit = 1000;
  uint64_t streamed = 0;
  request.on_output = [&](sandbox::OutputStream, std::string_view data) {
    streamed += data.size();
  };
  auto result = provider().exec(sandbox.id(), request);
  ASSERT_TRUE(result) << result.error().message;
  EXPECT_TRUE(result->truncated);
  EXPECT_EQ(result->stdout_text.size(), 1000u);
  EXPECT_EQ(streamed, 300000u);
}

TEST(Exec, CancelKillsTheCommand) {
  ScopedSandbox sandbox;
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  sandbox::ExecRequest request;
  request.argv = {"sleep", "100"};
  request.cancel_fd = pipe_fds[0];
  std::thread canceller([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    (void)!::write(pipe_fds[1], "x", 1);
  });
  auto result = provider().exec(sandbox.id(), request);
  canceller.join();
  ::close(pipe_fds[0]);
  ::close(pipe_fds[1]);
  ASSERT_FALSE(result);
  EXPECT_EQ(result.error().code, ErrorCode::kCancelled);
  EXPECT_EQ(host_processes_of(sandbox.id()).size(), 1u);
}

// A command stopped the moment it was started (before it joined its cgroups, even) ends all
// the same, and the stop returns at once: nothing survives in the sandbox.
TEST(Exec, CommandsStoppedAsTheyStartEnd) {
  ScopedSandbox sandbox;
  sandbox::ExecRequest request;
  request.argv = {"sleep", "1000"};
  for (int round = 0; round < 40; ++round) {
    SCOPED_TRACE(round);
    auto started = provider().start(sandbox.id(), request);
    ASSERT_TRUE(started) << started.error().message;
    auto stopped = provider().stop_commands(sandbox.id());
    ASSERT_TRUE(stopped) << stopped.error().message;
    EXPECT_EQ(*stopped, 1);
    for (int wait = 0; wait < 500 && (*started)->alive(); ++wait)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    EXPECT_FALSE((*started)->alive());
  }
  EXPECT_EQ(host_processes_of(sandbox.id()).size(), 1u);  // init alone
}

// A process another quarry process started (a kernel named in the history) is stopped by the
// name it was given; the names come from the history, so nothing but a command of one of
// quarry's sandboxes is ever stopped by them, and one that is gone needs nothing.
TEST(Exec, AProcessIsStoppedByItsIdAndByNothingElse) {
  ScopedSandbox sandbox;
  sandbox::ExecRequest request;
  request.argv = {"sleep", "1000"};
  auto started = provider().start(sandbox.id(), request);
  ASSERT_TRUE(started) << started.error().message;
  auto other = provider().start(sandbox.id(), request);
  ASSERT_TRUE(other) << other.error().message;
  EXPECT_NE((*started)->id(), (*other)->id());
  // A command joins its cgroups once init has forked it, after start returns.
  for (int wait = 0; wait < 500 && host_processes_of(sandbox.id()).size() < 3; ++wait)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_EQ(host_processes_of(sandbox.id()).size(), 3u);  // init and both commands

  for (const auto& [id, process] : std::vector<std::pair<std::string, std::string>>{
           {"..", "init"}, {"/sys/fs/cgroup", "init"}, {"../" + sandbox.id(), (*started)->id()}}) {
    SCOPED_TRACE(id);
    auto refused = provider().stop_process(id, process);
    ASSERT_FALSE(refused);
    EXPECT_EQ(refused.error().code, ErrorCode::kNotFound);
  }
  // Not a command: init, the network proxy, a path.
  for (const char* process : {"init", "proxy", "..", "../..", ""}) {
    SCOPED_TRACE(process);
    EXPECT_TRUE(provider().stop_process(sandbox.id(), process));
  }
  EXPECT_TRUE((*started)->alive());
  EXPECT_EQ(host_processes_of(sandbox.id()).size(), 3u);  // init and both commands

  ASSERT_TRUE(provider().stop_process(sandbox.id(), (*started)->id()));
  for (int wait = 0; wait < 500 && (*started)->alive(); ++wait)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_FALSE((*started)->alive());
  EXPECT_TRUE((*other)->alive());
  // Gone already, or its sandbox gone: nothing to do.
  EXPECT_TRUE(provider().stop_process(sandbox.id(), (*started)->id()));
  EXPECT_TRUE(provider().stop_process("0123456789ab", (*started)->id()));
}

TEST(Exec, ConcurrentExecsAreMeteredSeparately) {
  ScopedSandbox sandbox;
  Result<sandbox::ExecResult> big, small;
  std::thread a(
      [&] { big = python(sandbox.id(), "b = b'x' * (200 << 20)\nimport time; time.sleep(0.5)"); });
  std::thread b([&] { small = python(sandbox.id(), "import time; time.sleep(0.5)"); });
  a.join();
  b.join();
  ASSERT_TRUE(big) << big.error().message;
  ASSERT_TRUE(small) << small.error().message;
  EXPECT_GT(big->peak_memory_bytes, 200u << 20);
  EXPECT_LT(small->peak_memory_bytes, 50u << 20);
}

TEST(Files, WriteReadListRoundTrip) {
  ScopedSandbox sandbox;
  std::istringstream script("print(open('/home/sandbox/data/in.txt').read().upper())\n");
  ASSERT_TRUE(provider().write_file(sandbox.id(), "analysis.py", script, -1));
  std::istringstream data("quarry");
  ASSERT_TRUE(provider().write_file(sandbox.id(), "/home/sandbox/data/in.txt", data, -1));
  auto result =
      run(sandbox.id(), {"sh", "-c", "python3 analysis.py > outputs/result.txt && ls -l outputs"});
  ASSERT_TRUE(result) << result.error().message;
  ASSERT_EQ(result->exit_code, 0) << result->stderr_text;
  std::ostringstream out;
  auto size =
      provider().read_file(sandbox.id(), "/home/sandbox/outputs/result.txt", out, 1 << 20, -1);
  ASSERT_TRUE(size) << size.error().message;
  EXPECT_EQ(out.str(), "QUARRY\n");
  auto listed = provider().list_files(sandbox.id(), "/home/sandbox");
  ASSERT_TRUE(listed) << listed.error().message;
  std::vector<std::string> paths;
  for (const auto& file : *listed)
    paths.push_back(file.path);
  EXPECT_EQ(paths, (std::vector<std::string>{"/home/sandbox/analysis.py", "/home/sandbox/data",
                                             "/home/sandbox/data/in.txt", "/home/sandbox/outputs",
                                             "/home/sandbox/outputs/result.txt"}));
  // Files the host wrote belong to the sandbox user, who can change them.
  auto owner =
      run(sandbox.id(), {"sh", "-c", "stat -c %U analysis.py && echo more >> data/in.txt"});
  ASSERT_TRUE(owner);
  EXPECT_EQ(owner->stdout_text, "sandbox\n");
  EXPECT_EQ(owner->exit_code, 0);
}

TEST(Files, AWriteThatFillsTheDiskLeavesTheOldFile) {
  auto spec = ScopedSandbox::default_spec();
  spec.resources.disk_bytes = 64 << 20;
  ScopedSandbox sandbox(spec);
  std::istringstream small(std::string(1 << 20, 'a'));
  ASSERT_TRUE(provider().write_file(sandbox.id(), "/home/sandbox/data/table.parquet", small, -1));
  std::istringstream huge(std::string(100 << 20, 'b'));
  auto refused = provider().write_file(sandbox.id(), "/home/sandbox/data/table.parquet", huge, -1);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code, ErrorCode::kResourceExhausted);
  EXPECT_NE(refused.error().message.find("would fill the sandbox's disk; nothing was written"),
            std::string::npos)
      << refused.error().message;
  std::ostringstream out;
  ASSERT_TRUE(
      provider().read_file(sandbox.id(), "/home/sandbox/data/table.parquet", out, 2 << 20, -1));
  EXPECT_EQ(out.str(), std::string(1 << 20, 'a'));
  auto listed = provider().list_files(sandbox.id(), "/home/sandbox/data");
  ASSERT_TRUE(listed);
  EXPECT_EQ(listed->size(), 1u);  // no temporary file left behind
}

TEST(Files, SymlinkPlantedInsideIsRefused) {
  ScopedSandbox sandbox;
  auto planted = run(sandbox.id(), {"sh", "-c",
                                    "ln -s /etc/shadow outputs/shadow && ln -s / outputs/root && "
                                    "ln -s /proc/1/root outputs/proc"});
  ASSERT_TRUE(planted);
  ASSERT_EQ(planted->exit_code, 0) << planted->stderr_text;
  for (const char* path : {"/home/sandbox/outputs/shadow", "/home/sandbox/outputs/root/etc/passwd",
                           "/home/sandbox/outputs/proc/etc/hostname", "/proc/1/environ"}) {
    SCOPED_TRACE(path);
    std::ostringstream out;
    auto read = provider().read_file(sandbox.id(), path, out, 1 << 20, -1);
    ASSERT_FALSE(read);
    EXPECT_EQ(read.error().code, ErrorCode::kPermissionDenied) << read.error().message;
    EXPECT_TRUE(out.str().empty());
  }
  std::istringstream content("x");
  auto write = provider().write_file(sandbox.id(), "/home/sandbox/outputs/root/tmp/x", content, -1);
  ASSERT_FALSE(write);
  EXPECT_EQ(write.error().code, ErrorCode::kPermissionDenied);
}

TEST(Files, PrepareMakesDirectoriesForTheUser) {
  ScopedSandbox sandbox;
  ASSERT_TRUE(provider().prepare(sandbox.id(), {{"/home/sandbox/work/a", "/srv/shared"}}));
  auto result =
      run(sandbox.id(), {"sh", "-c", "touch /home/sandbox/work/a/x /srv/shared/y && echo ok"});
  ASSERT_TRUE(result);
  EXPECT_EQ(result->stdout_text, "ok\n") << result->stderr_text;
}

TEST(Lifecycle, FindMatchesEveryGivenLabel) {
  auto spec = ScopedSandbox::default_spec();
  spec.labels = {{"team", "blue"}, {"conversation", "c1"}};
  ScopedSandbox first(spec);
  spec.labels = {{"team", "blue"}, {"conversation", "c2"}};
  ScopedSandbox second(spec);
  auto blue = provider().find({{"team", "blue"}});
  ASSERT_TRUE(blue);
  EXPECT_EQ(blue->size(), 2u);
  auto c2 = provider().find({{"team", "blue"}, {"conversation", "c2"}});
  ASSERT_TRUE(c2);
  ASSERT_EQ(c2->size(), 1u);
  EXPECT_EQ((*c2)[0].id, second.id());
  EXPECT_EQ((*c2)[0].state, sandbox::SandboxState::kRunning);
  EXPECT_TRUE(provider().find({{"team", "red"}})->empty());
}

TEST(Lifecycle, BadSpecsAreRefusedBeforeAnythingIsMade) {
  auto spec = ScopedSandbox::default_spec();
  spec.labels = {{"bad key!", "x"}};
  auto bad_label = provider().create(spec);
  ASSERT_FALSE(bad_label);
  EXPECT_EQ(bad_label.error().code, ErrorCode::kInvalidArgument);
  spec = ScopedSandbox::default_spec();
  spec.resources.memory_bytes = 1024;
  EXPECT_FALSE(provider().create(spec));
  spec = ScopedSandbox::default_spec();
  spec.network.mode = NetworkMode::kAllowlist;
  EXPECT_FALSE(provider().create(spec));
  EXPECT_TRUE(provider().find({{"test", "BadSpecsAreRefusedBeforeAnythingIsMade"}})->empty());
}

TEST(Lifecycle, DestroyLeavesNothingBehind) {
  auto info = provider().create(ScopedSandbox::default_spec());
  ASSERT_TRUE(info) << info.error().message;
  const std::string id = info->id;
  auto& environment = SandboxEnvironment::get();
  auto record = read_file(environment.state_dir() / "sandboxes" / id / "sandbox.json");
  ASSERT_TRUE(record);
  const auto fields = nlohmann::json::parse(*record);
  const pid_t init = fields["init_pid"];
  const uint64_t qgroup = fields["qgroup"];
  const uint64_t id_base = fields["id_base"];
  ASSERT_TRUE(run(id, {"sh", "-c", "sleep 100 & echo started"}));

  ASSERT_TRUE(provider().destroy(id));
  EXPECT_FALSE(std::filesystem::exists(fmt::format("/proc/{}", init))) << "init still exists";
  EXPECT_TRUE(host_processes_of(id).empty());
  EXPECT_EQ(cgroups_of(id), std::vector<std::filesystem::path>{});
  EXPECT_FALSE(std::filesystem::exists(environment.state_dir() / "sandboxes" / id));
  EXPECT_FALSE(
      std::filesystem::exists(environment.state_dir() / "id-ranges" / std::to_string(id_base)));
  // Its disk accounting too, once btrfs has cleaned the deleted subvolume up (a commit wakes
  // its cleaner; without one that takes up to 30 s).
  const auto volume = (environment.state_dir() / "sandboxes").string();
  std::string qgroups;
  for (int attempt = 0; attempt < 40; ++attempt) {
    ASSERT_TRUE(run_command({"btrfs", "filesystem", "sync", volume}));
    auto shown = run_command({"btrfs", "qgroup", "show", "--raw", volume});
    ASSERT_TRUE(shown) << shown.error().message;
    qgroups = shown->output;
    if (qgroups.find(fmt::format("0/{} ", qgroup)) == std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
  EXPECT_EQ(qgroups.find(fmt::format("0/{} ", qgroup)), std::string::npos) << qgroups;
  auto mounts = read_file("/proc/self/mountinfo");
  ASSERT_TRUE(mounts);
  EXPECT_EQ(mounts->find(id), std::string::npos);
  auto again = provider().destroy(id);
  ASSERT_FALSE(again);
  EXPECT_EQ(again.error().code, ErrorCode::kNotFound);
}

// sandbox.local.volume_size made larger after the volume was made grows it, on the next open
// and while it is mounted; before, the message that refused a sandbox for want of room told the
// user to raise a setting that changed nothing.
TEST(Lifecycle, ALargerVolumeSizeGrowsTheVolume) {
  const auto dir = SandboxEnvironment::get().state_dir().parent_path() /
                   fmt::format("volume-grows-{}", ::getpid());
  std::filesystem::remove_all(dir);
  const auto mount_point = dir / "sandboxes";
  const auto capacity = [&] {
    struct statvfs info {};
    EXPECT_EQ(::statvfs(mount_point.c_str(), &info), 0);
    return static_cast<uint64_t>(info.f_blocks) * info.f_frsize;
  };
  {
    auto small = sandbox::local::SandboxVolume::open(dir, kGiB);
    ASSERT_TRUE(small) << small.error().message;
  }
  const uint64_t before = capacity();
  EXPECT_LE(before, kGiB);
  auto larger = sandbox::local::SandboxVolume::open(dir, 3 * kGiB);
  const uint64_t after = capacity();
  ::umount2(mount_point.c_str(), MNT_DETACH);
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(larger) << larger.error().message;
  EXPECT_GT(after, 2 * kGiB) << "before: " << before;
}

// Opening the volume sweeps qgroups whose subvolume is gone (as btrfs qgroup clear-stale does);
// the qgroup of a live sandbox carries its disk limit, so it must survive every sweep, limit
// and all, and so must qgroups of higher levels.
TEST(Lifecycle, OpeningTheVolumeKeepsTheQgroupsOfLiveSubvolumes) {
  ScopedSandbox sandbox;
  auto& environment = SandboxEnvironment::get();
  auto record = read_file(environment.state_dir() / "sandboxes" / sandbox.id() / "sandbox.json");
  ASSERT_TRUE(record);
  const uint64_t qgroup = nlohmann::json::parse(*record)["qgroup"];
  const auto volume = (environment.state_dir() / "sandboxes").string();
  ASSERT_TRUE(run_command({"btrfs", "qgroup", "create", "1/4242", volume}));
  auto opened = sandbox::local::SandboxVolume::open(
      environment.state_dir(), environment.config().sandbox.local.volume_bytes);
  ASSERT_TRUE(opened) << opened.error().message;
  auto shown = run_command({"btrfs", "qgroup", "show", "--raw", "-r", volume});
  (void)run_command({"btrfs", "qgroup", "destroy", "1/4242", volume});
  ASSERT_TRUE(shown) << shown.error().message;
  EXPECT_NE(shown->output.find("0/5 "), std::string::npos) << shown->output;
  EXPECT_NE(shown->output.find("1/4242 "), std::string::npos) << shown->output;
  const auto line = shown->output.find(fmt::format("0/{} ", qgroup));
  ASSERT_NE(line, std::string::npos) << shown->output;
  const auto limit = ScopedSandbox::default_spec().resources.disk_bytes;
  EXPECT_NE(
      shown->output.substr(line, shown->output.find('\n', line) - line).find(std::to_string(limit)),
      std::string::npos)
      << shown->output;
  auto write = run(sandbox.id(), {"sh", "-c", "echo still here > /tmp/after-sweep"});
  ASSERT_TRUE(write) << write.error().message;
  EXPECT_EQ(write->exit_code, 0);
}

// The quarry-init processes that are this process's children, alive or not yet reaped.
std::set<pid_t> our_inits() {
  std::set<pid_t> pids;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    auto stat = read_file(entry.path() / "stat");
    if (!stat || stat->find("(quarry-init) ") == std::string::npos) continue;
    std::istringstream fields(stat->substr(stat->rfind(')') + 2));
    char state = 0;
    pid_t parent = 0;
    fields >> state >> parent;
    if (parent == ::getpid()) pids.insert(std::stoi(name));
  }
  return pids;
}

// A create that fails after init was started, before its record names it (saving the record
// failed), killed nothing: init waited for a setup that never came. Here the record cannot be
// saved (a directory is planted at its name the moment the sandbox's directory appears), and
// init must be gone, reaped, after the failure.
TEST(Lifecycle, ACreateThatFailsAfterInitStartedLeavesNoInit) {
  { ScopedSandbox first; }  // the volume is mounted on first use
  const auto sandboxes = SandboxEnvironment::get().state_dir() / "sandboxes";
  const auto before = our_inits();
  UniqueFd watch(::inotify_init1(IN_CLOEXEC | IN_NONBLOCK));
  ASSERT_TRUE(watch);
  ASSERT_GE(::inotify_add_watch(watch.get(), sandboxes.c_str(), IN_CREATE | IN_ONLYDIR), 0);
  std::atomic<bool> done = false;
  std::thread planter([&] {
    alignas(inotify_event) char buffer[4096];
    while (!done) {
      const ssize_t length = ::read(watch.get(), buffer, sizeof(buffer));
      if (length <= 0) {
        std::this_thread::sleep_for(std::chrono::microseconds(20));
        continue;
      }
      for (ssize_t at = 0; at < length;) {
        const auto* event = reinterpret_cast<const inotify_event*>(buffer + at);
        if (event->len > 0) {
          const auto record = sandboxes / event->name / "sandbox.json";
          ::mkdir(record.c_str(), 0700);
          ::mkdir((record / "in-the-way").c_str(), 0700);
        }
        at += static_cast<ssize_t>(sizeof(inotify_event) + event->len);
      }
    }
  });
  // The planter may be too slow for a start (one takes milliseconds): a few tries.
  int failed = 0;
  for (int attempt = 0; attempt < 10 && failed == 0; ++attempt) {
    auto created = provider().create(ScopedSandbox::default_spec());
    if (created) {
      (void)provider().destroy(created->id);
      continue;
    }
    ++failed;
    EXPECT_NE(created.error().message.find("sandbox.json"), std::string::npos)
        << created.error().message;
  }
  done = true;
  planter.join();
  ASSERT_EQ(failed, 1) << "the record was never in the way";
  EXPECT_EQ(our_inits(), before) << "an init outlived the failed create";
}

// Several threads create at once (as a server's turns and its warm pool do). Each create makes
// a short-lived child for its id map; a child made by one thread must not hold another thread's
// pipe open, or both wait for ever. A watchdog turns such a hang into a failure.
TEST(Lifecycle, ManyThreadsCreateAtOnce) {
  std::atomic<bool> finished = false;
  std::thread watchdog([&] {
    for (int i = 0; i < 600 && !finished; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    if (!finished) {
      std::fprintf(stderr, "Lifecycle.ManyThreadsCreateAtOnce: creates hung for 60 s\n");
      std::_Exit(1);
    }
  });
  sandbox::SandboxSpec spec = ScopedSandbox::default_spec();
  spec.resources.cpus = 0.25;  // eight at once fit the host's CPU admission beside others
  std::atomic<int> made = 0;
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 4; ++i) {
        auto created = provider().create(spec);
        ASSERT_TRUE(created) << created.error().message;
        auto result = run(created->id, {"true"});
        EXPECT_TRUE(result && result->exit_code == 0);
        EXPECT_TRUE(provider().destroy(created->id));
        ++made;
      }
    });
  }
  // The id maps alone, many at once: the window in which two children overlap is small.
  const auto images = SandboxEnvironment::get().cache_dir() / "images";
  std::filesystem::path tree;
  for (const auto& entry : std::filesystem::directory_iterator(images)) {
    if (std::filesystem::is_directory(entry.path() / "rootfs")) tree = entry.path() / "rootfs";
  }
  ASSERT_FALSE(tree.empty());
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 300; ++i) {
        auto mapped = sandbox::local::idmapped_tree(tree, 1u << 30, (1u << 30) + 65536, 65536);
        ASSERT_TRUE(mapped) << mapped.error().message;
      }
    });
  }
  for (auto& thread : threads)
    thread.join();
  finished = true;
  watchdog.join();
  EXPECT_EQ(made.load(), 32);
}

// Sandboxes created at once that together fill the host's CPU admission exactly are all
// admitted: one being created counts once, not also by the record it writes half way through.
TEST(Lifecycle, ConcurrentCreatesUpToTheHostLimitAreAllAdmitted) {
  auto host = sandbox::local::host_capacity();
  ASSERT_TRUE(host);
  auto existing = provider().find({});
  ASSERT_TRUE(existing);
  double committed = 0;
  for (const auto& info : *existing)
    committed += info.resources.cpus;
  const double free = host->cpus * CapacityConfig::Overcommit{}.cpu - committed;
  ASSERT_GT(free, 0.8);
  sandbox::SandboxSpec spec = ScopedSandbox::default_spec();
  spec.resources.cpus = std::floor(free / 8 * 100) / 100;  // eight of them fill it
  std::mutex mutex;
  std::vector<std::string> made;
  std::vector<std::string> refused;
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      auto created = provider().create(spec);
      std::lock_guard lock(mutex);
      if (created) {
        made.push_back(created->id);
      } else {
        refused.push_back(created.error().message);
      }
    });
  }
  for (auto& thread : threads)
    thread.join();
  for (const auto& id : made)
    EXPECT_TRUE(provider().destroy(id));
  EXPECT_EQ(made.size(), 8u);
  EXPECT_TRUE(refused.empty()) << refused.front();
}

// A create cut short (its process killed after making the sandbox's subvolume and cgroups,
// before saving its record) leaves them without a record. Once they have sat a minute, a later
// create removes them: a server killed in a create does not leave them for good.
TEST(Lifecycle, ACreateRemovesWhatACreateCutShortLeft) {
  auto info = provider().create(ScopedSandbox::default_spec());
  ASSERT_TRUE(info) << info.error().message;
  const std::string id = info->id;
  auto& environment = SandboxEnvironment::get();
  const auto dir = environment.state_dir() / "sandboxes" / id;
  ASSERT_NO_FATAL_FAILURE(kill_init_of(id));  // init ends when its creator does
  ASSERT_TRUE(std::filesystem::remove(dir / "sandbox.json"));
  ASSERT_FALSE(cgroups_of(id).empty());

  // Younger than a minute, it may be a create under way: a create that looks leaves it alone.
  const auto long_ago = std::filesystem::file_time_type::clock::now() - std::chrono::minutes(2);
  std::filesystem::last_write_time(environment.state_dir() / "collected", long_ago);
  auto next = provider().create(ScopedSandbox::default_spec());
  ASSERT_TRUE(next) << next.error().message;
  ASSERT_TRUE(provider().destroy(next->id));
  EXPECT_TRUE(std::filesystem::exists(dir));

  // A minute on, and a minute since the last look: the next create removes it.
  std::filesystem::last_write_time(dir, long_ago);
  std::filesystem::last_write_time(environment.state_dir() / "collected", long_ago);
  ScopedSandbox after;
  EXPECT_FALSE(std::filesystem::exists(dir));
  EXPECT_EQ(cgroups_of(id), std::vector<std::filesystem::path>{});
  auto listed = provider().find({});
  ASSERT_TRUE(listed);
  for (const auto& sandbox : *listed)
    EXPECT_NE(sandbox.id, id);
}

TEST(Lifecycle, ADeadSandboxIsReportedNotHidden) {
  ScopedSandbox sandbox;
  ASSERT_NO_FATAL_FAILURE(kill_init_of(sandbox.id()));
  EXPECT_FALSE(*provider().is_alive(sandbox.id()));
  auto result = run(sandbox.id(), {"true"});
  ASSERT_FALSE(result);
  EXPECT_EQ(result.error().code, ErrorCode::kUnavailable);
  EXPECT_NE(result.error().message.find("not running"), std::string::npos);
  auto found = provider().find({{"test", "ADeadSandboxIsReportedNotHidden"}});
  ASSERT_TRUE(found);
  ASSERT_EQ(found->size(), 1u);
  EXPECT_EQ((*found)[0].state, sandbox::SandboxState::kStopped);
}

// The process that created sandboxes is SIGKILLed: its sandboxes live on and are found again
// by label, from the state on disk, by another process.
TEST(Lifecycle, SandboxesOutliveTheirCreator) {
  auto& environment = SandboxEnvironment::get();
  const std::string label = fmt::format("creator-{}", ::getpid());
  std::vector<std::string> args = {environment.quarry_binary().string(),
                                   "--state-dir",
                                   environment.state_dir().string(),
                                   "sandbox",
                                   "run",
                                   "--label",
                                   "crash=" + label,
                                   "--",
                                   "sleep",
                                   "600"};
  std::vector<char*> argv;
  for (auto& arg : args)
    argv.push_back(arg.data());
  argv.push_back(nullptr);
  pid_t creator = 0;
  ASSERT_EQ(::posix_spawn(&creator, argv[0], nullptr, nullptr, argv.data(), environ), 0);
  std::vector<sandbox::SandboxInfo> found;
  for (int i = 0; i < 200 && found.empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    found = *provider().find({{"crash", label}});
  }
  ASSERT_EQ(found.size(), 1u) << "the creator never made its sandbox";
  // Let it get into its exec, then kill it without warning.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ASSERT_EQ(::kill(creator, SIGKILL), 0);
  ::waitpid(creator, nullptr, 0);

  found = *provider().find({{"crash", label}});
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].state, sandbox::SandboxState::kRunning);
  auto result = run(found[0].id, {"echo", "alive"});
  ASSERT_TRUE(result) << result.error().message;
  EXPECT_EQ(result->stdout_text, "alive\n");
  ASSERT_TRUE(provider().destroy(found[0].id));
  EXPECT_TRUE(provider().find({{"crash", label}})->empty());
  EXPECT_TRUE(host_processes_of(found[0].id).empty());
}

}  // namespace
}  // namespace quarry::testing

// Attacks tried from inside a sandbox, as model code would try them, each against a real
// sandbox and the real host-side code it aims at. One test per attack; each says what it tries
// and what the host must still have afterwards. Add new ones here.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/inotify.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "agent/artifacts.h"
#include "child_process.h"
#include "common/file_util.h"
#include "common/units.h"
#include "conversation/conversation_manager.h"
#include "conversation/sqlite_history_store.h"
#include "sandbox/local/state.h"
#include "sandbox_environment.h"

namespace quarry::testing {
namespace {

// The host's own resources that an attack must leave as they were.
int open_descriptors() {
  int count = 0;
  for ([[maybe_unused]] const auto& fd : std::filesystem::directory_iterator("/proc/self/fd"))
    ++count;
  return count;
}

uint64_t bytes_on_disk(const std::filesystem::path& directory) {
  uint64_t total = 0;
  std::error_code error;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(directory, error)) {
    struct stat info {};
    if (::lstat(entry.path().c_str(), &info) == 0)
      total += static_cast<uint64_t>(info.st_blocks) * 512;
  }
  return total;
}

// A conversation whose turns run in real sandboxes, as the agent's tools use them.
class AttackTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto& environment = SandboxEnvironment::get();
    const std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    dir_ = environment.state_dir() / "attacks" / name;
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    auto store = conversation::SqliteHistoryStore::open(dir_ / "history.db", clock_);
    ASSERT_TRUE(store) << store.error().message;
    history_ = std::move(*store);
    conversation::ManagerOptions options;
    options.instance_id = fmt::format("attack-{}", ::getpid());
    options.spec.resources = environment.config().sandbox.resources;
    options.prepare.directories = {environment.config().sandbox.data_dir,
                                   environment.config().sandbox.output_dir};
    manager_ = std::make_unique<conversation::ConversationManager>(environment.provider(),
                                                                   *history_, clock_, options);
    conversation_ = history_->create_conversation(name)->id;
  }
  void TearDown() override {
    if (manager_) (void)manager_->shutdown();
  }

  std::unique_ptr<conversation::Turn> turn() {
    auto turn = manager_->begin_turn(conversation_);
    EXPECT_TRUE(turn) << turn.error().message;
    return turn ? std::move(*turn) : nullptr;
  }

  // Runs a shell script in the turn's sandbox, as the sandbox user.
  static void sh(conversation::Turn& turn, const std::string& script) {
    sandbox::ExecRequest request;
    request.argv = {"sh", "-c", script};
    auto run = turn.sandbox().execute(request);
    ASSERT_TRUE(run) << run.error().message;
    EXPECT_EQ(run->result.exit_code, 0) << run->result.stderr_text;
  }

  std::string outputs() const { return SandboxEnvironment::get().config().sandbox.output_dir; }

  ManualClock clock_;
  std::filesystem::path dir_;
  std::unique_ptr<conversation::SqliteHistoryStore> history_;
  std::unique_ptr<conversation::ConversationManager> manager_;
  std::string conversation_;
};

std::string notes_of(const agent::Collected& collected) {
  return fmt::format("{}", fmt::join(collected.notes, "\n"));
}

// Sparse files and hard links cost the sandbox almost nothing against its disk quota; copied
// out by their length and once per name they made the host store gigabytes after one step.
TEST_F(AttackTest, SparseFilesAndHardLinksAreNotCopiedToTheHost) {
  auto step = turn();
  ASSERT_TRUE(step);
  const auto store = dir_ / "artifacts";
  agent::ArtifactCollector collector(outputs(), store, ArtifactLimits{});
  auto before = collector.snapshot(step->sandbox());
  ASSERT_TRUE(before) << before.error().message;
  step->set_step("call_flood", "run_python");
  sh(*step, fmt::format("cd {} && for i in $(seq 1 40); do truncate -s 45M sparse$i.csv; done && "
                        "head -c 10485760 /dev/zero > big.parquet && "
                        "for i in $(seq 1 40); do ln big.parquet copy$i.parquet; done && "
                        "echo 'a,b' > small.csv",
                        outputs()));
  auto collected = collector.collect(*step, *before, *history_);
  ASSERT_TRUE(collected) << collected.error().message;
  ASSERT_EQ(collected->artifacts.size(), 1u) << notes_of(*collected);
  EXPECT_EQ(collected->artifacts[0].name, "small.csv");
  const std::string notes = notes_of(*collected);
  EXPECT_NE(notes.find("sparse7.csv was not collected: it has holes (45 MiB long"),
            std::string::npos)
      << notes;
  EXPECT_NE(notes.find("copy3.parquet was not collected: it has 41 names (hard links)"),
            std::string::npos)
      << notes;
  EXPECT_LT(bytes_on_disk(store), 1 * kMiB);
}

// Files that are what they say still fill the host without a bound: each step and each
// conversation has its budget, and the model is told what was left out.
TEST_F(AttackTest, ArtifactsStopAtTheStepAndConversationBudgets) {
  const auto store = dir_ / "artifacts";
  agent::ArtifactCollector collector(outputs(), store,
                                     ArtifactLimits{.max_file_bytes = 2 * kMiB,
                                                    .max_step_bytes = 3 * kMiB,
                                                    .max_conversation_bytes = 5 * kMiB});
  std::string notes;
  for (int number = 1; number <= 2; ++number) {
    auto step = turn();
    ASSERT_TRUE(step);
    auto before = collector.snapshot(step->sandbox());
    ASSERT_TRUE(before) << before.error().message;
    step->set_step(fmt::format("call_{}", number), "run_python");
    sh(*step, fmt::format("cd {} && for i in 1 2 3 4 5; do head -c 1048576 /dev/urandom > "
                          "t{}_$i.csv; done && head -c 3145728 /dev/urandom > t{}_big.csv",
                          outputs(), number, number));
    auto collected = collector.collect(*step, *before, *history_);
    ASSERT_TRUE(collected) << collected.error().message;
    EXPECT_EQ(collected->artifacts.size(), number == 1 ? 3u : 2u) << notes_of(*collected);
    notes += notes_of(*collected) + "\n";
  }
  EXPECT_NE(notes.find("t1_big.csv was not collected: 3 MiB is over the 2 MiB limit per file"),
            std::string::npos)
      << notes;
  EXPECT_NE(notes.find("t1_4.csv was not collected: this step's files reached the 3 MiB limit"),
            std::string::npos)
      << notes;
  EXPECT_NE(notes.find("t2_3.csv was not collected: this conversation's files reached its "
                       "5 MiB limit"),
            std::string::npos)
      << notes;
  EXPECT_LE(bytes_on_disk(store), 5 * kMiB + 64 * kKiB);
}

// A deep chain of long directory names, and a wide tree: listing the output directory held
// gigabytes of path strings, or one descriptor per directory (EMFILE for the whole server).
TEST_F(AttackTest, ListingADeepOrWideTreeIsBoundedInMemoryAndDescriptors) {
  auto step = turn();
  ASSERT_TRUE(step);
  step->set_step("call_tree", "run_python");
  sh(*step, fmt::format("cd {} && mkdir wide deep && cd wide && "
                        "for i in $(seq 1 2000); do mkdir d$i; done && cd ../deep && "
                        "python -c 'import os\nfor _ in range(60): "
                        "os.mkdir(250 * \"0\"); os.chdir(250 * \"0\")'",
                        outputs()));
  const int descriptors = open_descriptors();
  rlimit saved{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &saved), 0);
  // A few more than the host holds now: one per directory of the wide tree would not fit.
  const rlimit tight{static_cast<rlim_t>(descriptors + 16), saved.rlim_max};
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &tight), 0);
  auto deep = step->sandbox().list_files(outputs() + "/deep");
  auto wide = step->sandbox().list_files(outputs() + "/wide");
  ::setrlimit(RLIMIT_NOFILE, &saved);
  ASSERT_FALSE(deep);
  EXPECT_EQ(deep.error().code, ErrorCode::kResourceExhausted);
  EXPECT_NE(deep.error().message.find("holds a path longer than 1024 bytes"), std::string::npos)
      << deep.error().message;
  ASSERT_TRUE(wide) << wide.error().message;
  EXPECT_EQ(wide->size(), 2000u);
  EXPECT_EQ(open_descriptors(), descriptors);
}

// inotify instances made inside were charged to host root (the user namespace's maker), so a
// sandbox that opened 128 made host root's next inotify_init fail. Inside the limit is zero;
// the host's is untouched.
TEST(Attack, InotifyExhaustionInsideLeavesTheHostsAlone) {
  ScopedSandbox sandbox;
  auto result = python(sandbox.id(), R"(
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
made, errors = 0, set()
for _ in range(1000):
    if libc.inotify_init1(0) >= 0:
        made += 1
    else:
        errors.add(os.strerror(ctypes.get_errno()))
print(made, sorted(errors))
for name in ["max_inotify_instances", "max_fanotify_groups", "max_user_namespaces"]:
    print(name, open("/proc/sys/user/" + name).read().strip())
)");
  ASSERT_TRUE(result) << result.error().message;
  EXPECT_EQ(result->stdout_text,
            "0 ['Too many open files']\nmax_inotify_instances 0\nmax_fanotify_groups 0\n"
            "max_user_namespaces 0\n")
      << result->stderr_text;
  // Host root (this test) can still make as many as its limit allows.
  std::vector<int> mine;
  for (int i = 0; i < 64; ++i) {
    int fd = ::inotify_init1(IN_CLOEXEC);
    ASSERT_GE(fd, 0) << "host root's inotify_init failed after " << i << ": "
                     << std::strerror(errno);
    mine.push_back(fd);
  }
  for (int fd : mine)
    ::close(fd);
}

// The host wrote into a sandbox through a temporary file whose name the sandbox could guess
// (the host pid shows in /proc/self/cgroup): a symlink or FIFO planted there broke the write.
TEST(Attack, APlantedTemporaryNameDoesNotBreakAWrite) {
  ScopedSandbox sandbox;
  auto& provider = SandboxEnvironment::get().provider();
  const std::string data = SandboxEnvironment::get().config().sandbox.data_dir;
  auto planted = run(sandbox.id(), {"sh", "-c",
                                    fmt::format("cd {0} && for pid in {1} $(seq 1 400); do "
                                                "ln -s /etc/passwd .export.parquet.quarry-$pid; "
                                                "mkfifo .other.csv.quarry-$pid; done",
                                                data, ::getpid())});
  ASSERT_TRUE(planted) << planted.error().message;
  ASSERT_EQ(planted->exit_code, 0) << planted->stderr_text;
  for (const char* name : {"export.parquet", "other.csv"}) {
    std::istringstream content("PAR1 the export");
    auto written = provider.write_file(sandbox.id(), fmt::format("{}/{}", data, name), content, -1);
    ASSERT_TRUE(written) << name << ": " << written.error().message;
    auto check = run(sandbox.id(), {"cat", fmt::format("{}/{}", data, name)});
    ASSERT_TRUE(check);
    EXPECT_EQ(check->stdout_text, "PAR1 the export");
  }
}

// /proc told the sandbox where the host keeps its state and cache (the overlay's layers in
// mountinfo, the control socket in /proc/net/unix), and showed what Docker masks (kernel
// memory, keys, timers, scheduler internals).
TEST(Attack, NoHostPathIsVisibleInProc) {
  ScopedSandbox sandbox;
  auto& environment = SandboxEnvironment::get();
  auto result = run(sandbox.id(), {"sh", "-c",
                                   "cat /proc/self/mountinfo /proc/net/unix /proc/self/cgroup "
                                   "/proc/mounts /proc/self/mountstats 2>&1"});
  ASSERT_TRUE(result) << result.error().message;
  const std::string& seen = result->stdout_text;
  EXPECT_NE(seen.find("lowerdir=lower,upperdir=upper,workdir=work"), std::string::npos) << seen;
  EXPECT_NE(seen.find("control.sock"), std::string::npos) << seen;
  for (const auto& host : {environment.state_dir().string(), environment.cache_dir().string()}) {
    EXPECT_EQ(seen.find(host), std::string::npos) << host << " shows in:\n" << seen;
  }
  auto masked = python(sandbox.id(), R"(
import os
for name in ["kcore", "keys", "timer_list", "sched_debug", "latency_stats", "acpi", "scsi"]:
    path = "/proc/" + name
    if not os.path.exists(path):
        continue
    if os.path.isdir(path):
        print(name, os.listdir(path))
    else:
        try:
            print(name, len(open(path, "rb").read(4096)))
        except OSError as error:
            print(name, error.strerror)
if os.path.exists("/proc/sysrq-trigger"):
    try:
        open("/proc/sysrq-trigger", "w").write("h")
    except OSError as error:
        print("sysrq-trigger", error.strerror)
)");
  ASSERT_TRUE(masked) << masked.error().message;
  EXPECT_EQ(masked->stderr_text, "");
  std::istringstream lines(masked->stdout_text);
  for (std::string line; std::getline(lines, line);) {
    EXPECT_TRUE(line.ends_with(" 0") || line.ends_with(" []") ||
                line.ends_with("Read-only file system") || line.ends_with("Permission denied"))
        << line;
  }
  EXPECT_NE(masked->stdout_text.find("timer_list 0"), std::string::npos) << masked->stdout_text;
}

// The seccomp filter was a denylist: AF_VSOCK opened (a hypervisor's services on a VM) and
// syscalls it did not name went through. Now an allowlist; the i386 (int 0x80) and x32 entry
// points, whose numbers mean other calls, kill the process.
TEST(Attack, OtherSocketFamiliesAndForeignSyscallEntriesAreRefused) {
  ScopedSandbox sandbox;
  auto result = python(sandbox.id(), R"(
import socket, subprocess, sys
for name in ["AF_VSOCK", "AF_PACKET", "AF_ALG", "AF_BLUETOOTH", "AF_CAN", "AF_TIPC"]:
    family = getattr(socket, name, None)
    if family is None:
        continue
    try:
        socket.socket(family, socket.SOCK_STREAM if name != "AF_PACKET" else socket.SOCK_RAW)
        print(name, "opened")
    except OSError as error:
        print(name, error.strerror)
socket.socket(socket.AF_INET, socket.SOCK_STREAM).close()
socket.socket(socket.AF_UNIX, socket.SOCK_STREAM).close()
print("inet and unix open")
# Machine code run in a child: getpid through the i386 entry (int 0x80) and the x32 one.
program = """
import ctypes, mmap, sys
code = bytes.fromhex(sys.argv[1])
memory = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
memory.write(code)
address = ctypes.addressof(ctypes.c_char.from_buffer(memory))
print(ctypes.CFUNCTYPE(ctypes.c_long)(address)())
"""
for name, code in [("i386", "b814000000cd80c3"), ("x32", "b8270000400f05c3")]:
    child = subprocess.run([sys.executable, "-c", program, code], capture_output=True, text=True)
    print(name, child.returncode, child.stdout.strip())
)");
  ASSERT_TRUE(result) << result.error().message;
  EXPECT_EQ(result->stderr_text, "");
  const std::string& seen = result->stdout_text;
  EXPECT_NE(seen.find("AF_VSOCK Address family not supported by protocol"), std::string::npos)
      << seen;
  EXPECT_EQ(seen.find("opened"), std::string::npos) << seen;
  EXPECT_NE(seen.find("inet and unix open"), std::string::npos) << seen;
  EXPECT_NE(seen.find("i386 -31 \n"), std::string::npos) << seen;  // SIGSYS
  EXPECT_NE(seen.find("x32 -31 \n"), std::string::npos) << seen;
}

// Many small processes filling the memory limit: without an oom_score_adj init could be the
// OOM killer's choice, ending the sandbox. Commands start at 1000, and the sandbox outlives
// its OOM.
TEST(Attack, TheOomKillerNeverChoosesInit) {
  auto spec = ScopedSandbox::default_spec();
  spec.resources.memory_bytes = 256 * kMiB;
  ScopedSandbox sandbox(spec);
  auto scores =
      run(sandbox.id(), {"sh", "-c", "cat /proc/1/oom_score_adj /proc/self/oom_score_adj"});
  ASSERT_TRUE(scores) << scores.error().message;
  // -1000 for init where root has CAP_SYS_RESOURCE (not on every host), 1000 for commands.
  EXPECT_TRUE(scores->stdout_text == "-1000\n1000\n" || scores->stdout_text == "0\n1000\n")
      << scores->stdout_text;
  auto flood = python(sandbox.id(), R"(
import os
for _ in range(40):
    if os.fork() == 0:
        blocks = []
        while True:
            blocks.append(bytearray(4 << 20))
os.wait()
)");
  ASSERT_TRUE(flood) << flood.error().message;
  EXPECT_TRUE(flood->oom);
  auto alive = SandboxEnvironment::get().provider().is_alive(sandbox.id());
  ASSERT_TRUE(alive);
  EXPECT_TRUE(*alive);
  auto after = run(sandbox.id(), {"echo", "still here"});
  ASSERT_TRUE(after) << after.error().message;
  EXPECT_EQ(after->stdout_text, "still here\n");
}

// The volume is sparse: sandboxes' disk limits together could exceed what the host's
// filesystem can back, and a host filesystem that fills under btrfs turns it read-only for
// every sandbox. A sandbox whose limit cannot be backed is refused, saying why.
TEST(Attack, ADiskLimitTheHostCannotBackIsRefused) {
  auto spec = ScopedSandbox::default_spec();
  spec.resources.disk_bytes = uint64_t{64} << 40;  // 64 TiB
  auto refused = SandboxEnvironment::get().provider().create(spec);
  ASSERT_FALSE(refused) << "created " << refused->id;
  EXPECT_EQ(refused.error().code, ErrorCode::kResourceExhausted);
  EXPECT_NE(refused.error().message.find("a sandbox with a 64 TiB disk cannot be backed"),
            std::string::npos)
      << refused.error().message;
  EXPECT_NE(refused.error().message.find("lower sandbox.resources.disk"), std::string::npos);
  ScopedSandbox ordinary;  // what fits is still made
  auto result = run(ordinary.id(), {"true"});
  ASSERT_TRUE(result) << result.error().message;
}

// Memory and CPU limits were not weighed against the host at all: sandboxes could together be
// promised more memory than the host has (the kernel's OOM killer then picks among everyone).
// Their sums stay within what the host has, times capacity.overcommit, or the next is refused.
TEST(Attack, MemoryAndCpuLimitsBeyondTheHostAreRefused) {
  auto& environment = SandboxEnvironment::get();
  auto spec = ScopedSandbox::default_spec();
  spec.resources.memory_bytes = uint64_t{1} << 40;  // 1 TiB
  auto refused = environment.provider().create(spec);
  ASSERT_FALSE(refused) << "created " << refused->id;
  EXPECT_EQ(refused.error().code, ErrorCode::kResourceExhausted);
  EXPECT_NE(refused.error().message.find("a sandbox with 1 TiB of memory does not fit"),
            std::string::npos)
      << refused.error().message;
  EXPECT_NE(refused.error().message.find("capacity.overcommit.memory"), std::string::npos);

  // With room for two and a half one-CPU sandboxes, the third waits for one to go.
  auto host = sandbox::local::host_capacity();
  ASSERT_TRUE(host);
  auto config = environment.config();
  config.capacity.overcommit.cpu = 2.5 / host->cpus;
  auto provider = sandbox::local::LocalProvider::open(
      config.sandbox, {environment.state_dir(), environment.cache_dir(), environment.init_binary(),
                       config.capacity.overcommit, environment.proxy_binary()});
  ASSERT_TRUE(provider) << provider.error().message;
  spec = ScopedSandbox::default_spec();
  spec.resources.cpus = 1;
  auto first = (*provider)->create(spec);
  auto second = (*provider)->create(spec);
  ASSERT_TRUE(first) << first.error().message;
  ASSERT_TRUE(second) << second.error().message;
  auto third = (*provider)->create(spec);
  ASSERT_FALSE(third) << "created " << third->id;
  EXPECT_NE(third.error().message.find("a sandbox with a CPU limit of 1 does not fit: the "
                                       "sandboxes here may use 2 CPUs together, and this host "
                                       "has 2.5 for them"),
            std::string::npos)
      << third.error().message;
  ASSERT_TRUE((*provider)->destroy(first->id));
  auto again = (*provider)->create(spec);
  ASSERT_TRUE(again) << again.error().message;
  (void)(*provider)->destroy(second->id);
  (void)(*provider)->destroy(again->id);
}

// Admission counted the sandboxes being created in its own process only: two `quarry sandbox
// create` at once, with room for one more, could both pass before either had a record.
TEST(Attack, TwoProcessesCreatingAtOnceWhereOneFitsMakeOne) {
  auto& environment = SandboxEnvironment::get();
  auto host = sandbox::local::host_capacity();
  ASSERT_TRUE(host);
  auto present = environment.provider().find({});
  ASSERT_TRUE(present) << present.error().message;
  double committed = 0;
  for (const auto& info : *present)
    committed += info.resources.cpus;
  const std::filesystem::path dir = fmt::format("/tmp/qt-admit-{}", ::getpid());
  std::filesystem::create_directories(dir);
  ASSERT_TRUE(write_file_atomic(
      dir / "config.yml",
      fmt::format("capacity: {{overcommit: {{cpu: {:.6f}}}}}\n", (committed + 1.5) / host->cpus)));
  for (int round = 0; round < 8; ++round) {
    SCOPED_TRACE(fmt::format("round {}", round));
    std::vector<std::unique_ptr<ChildProcess>> creates;
    for (int i = 0; i < 2; ++i) {
      creates.push_back(std::make_unique<ChildProcess>(
          std::vector<std::string>{
              environment.quarry_binary().string(), "--config", (dir / "config.yml").string(),
              "--state-dir", environment.state_dir().string(), "--cache-dir",
              environment.cache_dir().string(), "sandbox", "create", "--cpus", "1"},
          dir / fmt::format("stderr-{}", i)));
    }
    std::vector<std::string> made;
    std::string refusals;
    for (int i = 0; i < 2; ++i) {
      const std::string out = creates[i]->rest();
      if (creates[i]->wait() == 0) {
        made.push_back(out.substr(0, out.find('\n')));
      } else {
        refusals += read_file(dir / fmt::format("stderr-{}", i)).value_or("");
      }
    }
    for (const auto& id : made)
      EXPECT_TRUE(environment.provider().destroy(id));
    ASSERT_EQ(made.size(), 1u) << refusals;
    EXPECT_NE(refusals.find("a sandbox with a CPU limit of 1 does not fit"), std::string::npos)
        << refusals;
  }
  std::filesystem::remove_all(dir);
}

// Every sandbox mapped its users to the same host range, so the sandbox user was one host uid
// for every tenant (per-uid limits shared; an escape from one would own all their files).
// Each has a range of its own now, claimed and released with it, and sees the image as its.
TEST(Attack, TwoSandboxesHaveDisjointHostIdRanges) {
  ScopedSandbox first;
  ScopedSandbox second;
  auto& environment = SandboxEnvironment::get();
  std::vector<uint64_t> bases;
  for (const auto* sandbox : {&first, &second}) {
    auto result = run(sandbox->id(), {"sh", "-c",
                                      "cat /proc/self/uid_map /proc/self/gid_map; "
                                      "stat -c '%u %g' /usr /opt/quarry/matplotlib; "
                                      "touch /home/sandbox/mine"});
    ASSERT_TRUE(result) << result.error().message;
    std::istringstream words(result->stdout_text);
    uint64_t inside = 1, uid_base = 0, count = 0, gid_inside = 1, gid_base = 0, gid_count = 0;
    words >> inside >> uid_base >> count >> gid_inside >> gid_base >> gid_count;
    EXPECT_EQ(inside, 0u);
    EXPECT_EQ(count, 65536u);
    EXPECT_EQ(gid_base, uid_base);
    // The image's files are root's and the sandbox user's inside, as in every sandbox.
    EXPECT_NE(result->stdout_text.find("0 0\n1000 1000\n"), std::string::npos)
        << result->stdout_text;
    // On the host, what the sandbox user writes belongs to this sandbox's range only.
    struct stat info {};
    const auto mine =
        environment.state_dir() / "sandboxes" / sandbox->id() / "upper/home/sandbox/mine";
    ASSERT_EQ(::stat(mine.c_str(), &info), 0) << mine;
    EXPECT_EQ(info.st_uid, uid_base + 1000);
    bases.push_back(uid_base);
  }
  ASSERT_EQ(bases.size(), 2u);
  EXPECT_GE(bases[0] > bases[1] ? bases[0] - bases[1] : bases[1] - bases[0], 65536u);
  EXPECT_NE(bases[0], uint64_t{1} << 30);  // never the image's own range
  // The claims are released with the sandboxes.
  const auto claims = environment.state_dir() / "id-ranges";
  EXPECT_TRUE(std::filesystem::exists(claims / std::to_string(bases[0])));
  const std::string second_id = second.id();
  ASSERT_TRUE(environment.provider().destroy(second_id));
  EXPECT_FALSE(std::filesystem::exists(claims / std::to_string(bases[1])));
}

// A range whose ids a host process runs with is not handed to a sandbox, whatever the claims
// say (another program may use ids up there). The check sees such a process.
TEST(Attack, AHostProcessRunningWithSandboxIdsIsSeen) {
  using sandbox::local::kSandboxIdCount;
  const uint32_t base = sandbox::local::kSandboxIdBase + 16000 * kSandboxIdCount;
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(ready[0]);
    if (::setresgid(base + 7, base + 7, base + 7) != 0 ||
        ::setresuid(base + 7, base + 7, base + 7) != 0) {
      ::_exit(1);
    }
    (void)!::write(ready[1], "x", 1);
    ::pause();
    ::_exit(0);
  }
  ::close(ready[1]);
  char byte = 0;
  EXPECT_EQ(::read(ready[0], &byte, 1), 1) << "the child could not take the ids";
  ::close(ready[0]);
  // Read afresh at each question here; a provider reads at most once a second.
  sandbox::local::HostIds ids(std::chrono::milliseconds(0));
  EXPECT_TRUE(ids.in_use(base, kSandboxIdCount));
  EXPECT_FALSE(ids.in_use(base + kSandboxIdCount, kSandboxIdCount));
  EXPECT_FALSE(ids.in_use(base - kSandboxIdCount, kSandboxIdCount));
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  EXPECT_FALSE(ids.in_use(base, kSandboxIdCount));
}

// One sandbox could take the disk every sandbox shares: nothing limited its reads and writes on
// the volume. They are throttled now (here to 4 MiB/s each way) on the volume's device: reads
// from it, and writes that go to it at once, wait their turn. (Writes the kernel flushes later
// from the page cache are throttled on cgroup v2 only; v1 does not charge them to the cgroup.)
TEST(Attack, DiskReadsAndWritesOnTheVolumeAreThrottled) {
  auto& environment = SandboxEnvironment::get();
  auto config = environment.config().sandbox;
  config.local.disk_io = {.read_bytes = 4 * kMiB, .write_bytes = 4 * kMiB, .iops = 0};
  auto throttled = sandbox::local::LocalProvider::open(
      config, {environment.state_dir(), environment.cache_dir(), environment.init_binary(),
               environment.config().capacity.overcommit, environment.proxy_binary()});
  ASSERT_TRUE(throttled) << throttled.error().message;
  auto made = (*throttled)->create(ScopedSandbox::default_spec());
  ASSERT_TRUE(made) << made.error().message;
  struct Destroy {
    sandbox::local::LocalProvider& provider;
    std::string id;
    ~Destroy() { (void)provider.destroy(id); }
  } destroy{**throttled, made->id};
  auto dd = [&](const std::string& arguments) -> double {
    sandbox::ExecRequest request;
    request.argv = {"sh", "-c", "dd bs=1M count=6 " + arguments + " 2>&1"};
    request.timeout = std::chrono::seconds(60);
    auto result = (*throttled)->exec(made->id, request);
    EXPECT_TRUE(result) << result.error().message;
    if (!result) return 0;
    EXPECT_EQ(result->exit_code, 0) << result->stdout_text;
    return result->run_ms;
  };
  // 6 MiB at 4 MiB/s take 1.5 seconds each way; unthrottled they take milliseconds here.
  EXPECT_GT(dd("if=/dev/zero of=/home/sandbox/big oflag=direct"), 1000);
  EXPECT_GT(dd("if=/home/sandbox/big of=/dev/null iflag=direct"), 1000);
}

// Huge pages come from a pool the host sets aside, outside every memory limit: a sandbox could
// take all of it. Where the host has the hugetlb controller, a sandbox may have none. The test
// gives the host a pool of two pages for its duration, so that the refusal is the limit's.
TEST(Attack, HugePagesAreRefusedInsideWhileTheHostHasThem) {
  auto controllers = read_file("/proc/cgroups");
  ASSERT_TRUE(controllers);
  if (controllers->find("\nhugetlb\t") == std::string::npos) {
    GTEST_SKIP() << "this kernel has no hugetlb controller";
  }
  const std::filesystem::path pool = "/proc/sys/vm/nr_hugepages";
  auto before = read_file(pool);
  ASSERT_TRUE(before) << before.error().message;
  ASSERT_TRUE(write_control_file(pool, "2"));
  struct Restore {
    std::filesystem::path pool;
    std::string value;
    ~Restore() { (void)write_control_file(pool, value); }
  } restore{pool, *before};
  constexpr size_t kHugePage = 2 * 1024 * 1024;
  void* host = ::mmap(nullptr, kHugePage, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB, -1, 0);
  ASSERT_NE(host, MAP_FAILED) << "the host itself gets no huge page: " << std::strerror(errno);
  static_cast<char*>(host)[0] = 1;
  ::munmap(host, kHugePage);

  ScopedSandbox sandbox;
  auto inside = python(sandbox.id(), R"(
import mmap
try:
    page = mmap.mmap(-1, 2 << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | 0x40000)
    page[0] = 1
    print("allocated")
except OSError as error:
    print("refused:", error.strerror)
)");
  ASSERT_TRUE(inside) << inside.error().message;
  EXPECT_EQ(inside->stdout_text.find("allocated"), std::string::npos) << inside->stdout_text;
  EXPECT_NE(inside->stdout_text.find("refused"), std::string::npos)
      << inside->stdout_text << inside->stderr_text;
}

}  // namespace
}  // namespace quarry::testing

// Snapshots: a sandbox's files frozen into a layer that new sandboxes start from, and extra
// packages kept as a snapshot of their own. What a user would check: what a sandbox started
// from a snapshot has (and a base sandbox has not), that deletions stay deleted, that sandboxes
// of one snapshot are apart, what is refused and why, and what garbage collection removes.
//
// The package index is a directory of the test's own wheels (PIP_NO_INDEX, PIP_FIND_LINKS), and
// the provider here has a cache of its own (with the real cache's images), so package locks and
// wheels made here go nowhere else.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>
#include <tuple>

#include "common/clock.h"
#include "common/command.h"
#include "common/file_util.h"
#include "conversation/conversation_manager.h"
#include "conversation/sqlite_history_store.h"
#include "probe_wheel.h"
#include "sandbox/local/local_provider.h"
#include "sandbox_environment.h"
#include "silent_server.h"

namespace quarry::testing {
namespace {

using sandbox::local::LocalProvider;
using sandbox::local::SnapshotInfo;

class Snapshot : public ::testing::Test {
 protected:
  static constexpr const char* kPipSettings[] = {"PIP_CONFIG_FILE", "PIP_NO_INDEX",
                                                 "PIP_FIND_LINKS", "PIP_INDEX_URL"};

  void SetUp() override {
    auto& environment = SandboxEnvironment::get();
    dir_ = fmt::format("/tmp/qt-snap-{}", ::getpid());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_ / "index");
    std::filesystem::create_directories(dir_ / "cache");
    std::filesystem::create_directory_symlink(environment.cache_dir() / "images",
                                              dir_ / "cache/images");
    for (const char* name : kPipSettings) {
      if (const char* value = std::getenv(name)) saved_env_.emplace_back(name, value);
      ::unsetenv(name);
    }
    ::setenv("PIP_CONFIG_FILE", "/dev/null", 1);
    ::setenv("PIP_NO_INDEX", "1", 1);
    ::setenv("PIP_FIND_LINKS", (dir_ / "index").c_str(), 1);
    open_provider(environment.config().sandbox.snapshots);
  }

  void TearDown() override {
    for (const auto& id : sandboxes_)
      (void)provider_->destroy(id);
    if (auto left = provider_->snapshots()) {
      // Children before parents: the newest first.
      for (auto it = left->rbegin(); it != left->rend(); ++it)
        (void)provider_->remove_snapshot(it->snapshot.name);
    }
    for (const char* name : kPipSettings)
      ::unsetenv(name);
    for (const auto& [name, value] : saved_env_)
      ::setenv(name.c_str(), value.c_str(), 1);
    std::filesystem::remove_all(dir_);
  }

  // A provider on the shared state directory with this test's cache and snapshot settings.
  void open_provider(const SnapshotConfig& snapshots) {
    auto& environment = SandboxEnvironment::get();
    SandboxConfig config = environment.config().sandbox;
    config.snapshots = snapshots;
    auto opened = LocalProvider::open(config, {environment.state_dir(),
                                               dir_ / "cache",
                                               environment.init_binary(),
                                               {},
                                               environment.proxy_binary()});
    ASSERT_TRUE(opened) << opened.error().message;
    provider_ = std::move(*opened);
  }

  // A sandbox destroyed when the test ends (unless destroyed before).
  std::string create(std::string snapshot = "", std::vector<std::string> packages = {}) {
    auto spec = ScopedSandbox::default_spec();
    spec.snapshot = std::move(snapshot);
    spec.packages = std::move(packages);
    auto info = provider_->create(spec);
    EXPECT_TRUE(info) << info.error().message;
    if (!info) return "";
    sandboxes_.push_back(info->id);
    return info->id;
  }

  void destroy(const std::string& id) {
    ASSERT_TRUE(provider_->destroy(id));
    std::erase(sandboxes_, id);
  }

  // sh -c `script` in the sandbox: its stdout (stderr when it fails).
  std::string sh(const std::string& id, const std::string& script) {
    sandbox::ExecRequest request;
    request.argv = {"sh", "-c", script};
    auto result = provider_->exec(id, request);
    EXPECT_TRUE(result) << result.error().message;
    if (!result) return "";
    return result->exit_code == 0
               ? result->stdout_text
               : fmt::format("exit {}: {}", result->exit_code, result->stderr_text);
  }

  SnapshotInfo snapshot(const std::string& id, const std::string& name) {
    auto made = provider_->snapshot(id, name, /*stop_commands=*/false);
    EXPECT_TRUE(made) << made.error().message;
    return made ? *made : SnapshotInfo{};
  }

  std::optional<SnapshotInfo> listed(std::string_view name) {
    auto all = provider_->snapshots();
    EXPECT_TRUE(all) << all.error().message;
    if (!all) return std::nullopt;
    for (auto& info : *all) {
      if (info.snapshot.name == name) return info;
    }
    return std::nullopt;
  }

  // Conversations on this test's provider, in a history of their own (history_).
  std::unique_ptr<conversation::ConversationManager> open_conversations() {
    auto history = conversation::SqliteHistoryStore::open(
        SandboxEnvironment::get().fresh_history_path(), clock_);
    EXPECT_TRUE(history) << history.error().message;
    if (!history) return nullptr;
    history_ = std::move(*history);
    conversation::ManagerOptions options;
    options.instance_id = fmt::format("snapshot-{}", ::getpid());
    options.spec = ScopedSandbox::default_spec();
    return std::make_unique<conversation::ConversationManager>(*provider_, *history_, clock_,
                                                               options);
  }

  std::filesystem::path dir_;
  SystemClock clock_;
  std::unique_ptr<conversation::SqliteHistoryStore> history_;
  std::unique_ptr<LocalProvider> provider_;
  std::vector<std::string> sandboxes_;
  std::vector<std::pair<std::string, std::string>> saved_env_;
};

constexpr const char* kImageFile = "/opt/quarry/matplotlib/fontlist-v390.json";

TEST_F(Snapshot, ASandboxStartedFromOneHasWhatItsSourceWroteAndDeleted) {
  const auto source = create();
  ASSERT_EQ(sh(source, fmt::format("mkdir -p work && echo 'a,b' > work/result.csv && "
                                   "ln -s result.csv work/latest && chmod 600 work/result.csv && "
                                   "test -f {0} && rm {0} && echo done",
                                   kImageFile)),
            "done\n");
  const auto made = snapshot(source, "prepared");
  EXPECT_EQ(made.snapshot.name, "prepared");
  EXPECT_EQ(made.snapshot.sandbox, source);
  EXPECT_GT(made.snapshot.size_bytes, 0u);
  // Frozen at that moment: what the source does later is its own.
  ASSERT_EQ(sh(source, "echo later > work/later.txt && echo ok"), "ok\n");

  const auto from_snapshot = create("prepared");
  EXPECT_EQ(sh(from_snapshot, "cat work/result.csv work/latest"), "a,b\na,b\n");
  EXPECT_EQ(sh(from_snapshot, "stat -c '%U %a' work/result.csv"), "sandbox 600\n");
  EXPECT_EQ(sh(from_snapshot, fmt::format("test -e {} || echo deleted", kImageFile)), "deleted\n");
  EXPECT_EQ(sh(from_snapshot, "test -e work/later.txt || echo absent"), "absent\n");
  // It writes and deletes as any sandbox does, its files being its own user's.
  EXPECT_EQ(sh(from_snapshot, "echo more >> work/result.csv && rm work/latest && id -un"),
            "sandbox\n");

  const auto base = create();
  EXPECT_EQ(sh(base, "test -e work || echo absent"), "absent\n");
  EXPECT_EQ(sh(base, fmt::format("test -f {} && echo present", kImageFile)), "present\n");

  // The layers are named inside as the image is: no host path shows.
  const auto mounts = sh(from_snapshot, "cat /proc/self/mountinfo");
  EXPECT_NE(mounts.find("lowerdir=frozen0:lower,upperdir=upper"), std::string::npos) << mounts;
  EXPECT_EQ(mounts.find(SandboxEnvironment::get().state_dir().string()), std::string::npos)
      << mounts;

  auto info = listed("prepared");
  ASSERT_TRUE(info);
  EXPECT_EQ(info->users.sandboxes, std::vector<std::string>{from_snapshot});
}

TEST_F(Snapshot, SandboxesOfOneSnapshotDoNotSeeEachOthersWrites) {
  const auto source = create();
  ASSERT_EQ(sh(source, "echo shared > shared.txt && echo ok"), "ok\n");
  snapshot(source, "shared");
  destroy(source);  // the snapshot outlives its source
  const auto first = create("shared");
  const auto second = create("shared");
  ASSERT_EQ(sh(first, "echo first > mine.txt && echo changed >> shared.txt && echo ok"), "ok\n");
  EXPECT_EQ(sh(second, "cat shared.txt; test -e mine.txt || echo absent"), "shared\nabsent\n");
  EXPECT_EQ(sh(first, "cat shared.txt"), "shared\nchanged\n");
  auto info = listed("shared");
  ASSERT_TRUE(info);
  EXPECT_EQ(info->users.sandboxes.size(), 2u);
}

TEST_F(Snapshot, SnapshotsOfSnapshotsKeepWhiteoutsAndOpaqueDirectories) {
  const auto source = create();
  ASSERT_EQ(sh(source,
               "mkdir -p a b && echo 1 > a/one && echo 2 > a/two && echo 3 > b/three && "
               "echo ok"),
            "ok\n");
  snapshot(source, "first");
  const auto middle = create("first");
  // A file of the lower layer deleted (a whiteout), a directory of it replaced by a new one of
  // the same name (an opaque directory), and a new file.
  ASSERT_EQ(sh(middle,
               "rm a/one && rm -r b && mkdir b && echo 4 > b/four && echo 5 > five && "
               "echo ok"),
            "ok\n");
  const auto second = snapshot(middle, "second");
  EXPECT_EQ(second.snapshot.parent, "first");

  const auto top = create("second");
  EXPECT_EQ(sh(top, "ls a b; cat five"), "a:\ntwo\n\nb:\nfour\n5\n");
  EXPECT_EQ(sh(top, "cat /proc/self/mountinfo | grep -o 'lowerdir=[^,]*'"),
            "lowerdir=frozen0:frozen1:lower\n");
  EXPECT_EQ(sh(create("first"), "ls a b"), "a:\none\ntwo\n\nb:\nthree\n");

  // A snapshot made on another stays as long as that one does.
  destroy(source);
  destroy(middle);
  for (const auto& id : std::vector<std::string>(sandboxes_))
    destroy(id);
  auto refused = provider_->remove_snapshot("first");
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code, ErrorCode::kFailedPrecondition);
  EXPECT_NE(refused.error().message.find(
                "snapshot second is made on snapshot 'first'; remove it first: quarry snapshot rm "
                "second"),
            std::string::npos)
      << refused.error().message;
  ASSERT_TRUE(provider_->remove_snapshot("second"));
  EXPECT_TRUE(provider_->remove_snapshot("first"));
}

// Snapshots share their extents with the sandboxes they were frozen from; deleting either, in
// any order, must leave btrfs's accounting whole, or disk limits stop holding for every sandbox.
TEST_F(Snapshot, DiskLimitsStillHoldAfterSnapshotsAndTheirSourcesAreGone) {
  for (int round = 0; round < 2; ++round) {
    const auto source = create();
    ASSERT_EQ(sh(source, "head -c 20000000 /dev/urandom > data/big && echo ok"), "ok\n");
    snapshot(source, "churn");
    const auto user = create("churn");
    ASSERT_EQ(sh(user, "rm data/big && echo ok"), "ok\n");
    if (round == 0) {
      destroy(source);
      destroy(user);
      ASSERT_TRUE(provider_->remove_snapshot("churn"));
    } else {
      destroy(user);
      ASSERT_TRUE(provider_->remove_snapshot("churn"));
      destroy(source);
    }
    // Every later open of the volume sweeps qgroups of deleted subvolumes.
    open_provider(SandboxEnvironment::get().config().sandbox.snapshots);
  }
  const auto volume = (SandboxEnvironment::get().state_dir() / "sandboxes").string();
  ASSERT_TRUE(run_command({"btrfs", "filesystem", "sync", volume}));
  auto shown = run_command({"btrfs", "qgroup", "show", volume});
  ASSERT_TRUE(shown) << shown.error().message;
  EXPECT_EQ(shown->output.find("inconsistent"), std::string::npos) << shown->output;
  auto spec = ScopedSandbox::default_spec();
  spec.resources.disk_bytes = 64 * kMiB;
  auto limited = provider_->create(spec);
  ASSERT_TRUE(limited) << limited.error().message;
  sandboxes_.push_back(limited->id);
  EXPECT_NE(sh(limited->id, "dd if=/dev/zero of=/tmp/fill bs=1M count=200 2>&1; true")
                .find("Disk quota exceeded"),
            std::string::npos);
}

TEST_F(Snapshot, RemoveIsRefusedWhileASandboxUsesIt) {
  const auto source = create();
  snapshot(source, "in-use");
  const auto user = create("in-use");
  auto refused = provider_->remove_snapshot("in-use");
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code, ErrorCode::kFailedPrecondition);
  EXPECT_NE(
      refused.error().message.find(fmt::format(
          "snapshot 'in-use' is in use by sandbox {0}; remove it first: quarry sandbox rm {0}",
          user)),
      std::string::npos)
      << refused.error().message;
  EXPECT_EQ(sh(user, "echo still here"), "still here\n");
  destroy(user);
  ASSERT_TRUE(provider_->remove_snapshot("in-use"));
  EXPECT_FALSE(listed("in-use"));
  auto gone = provider_->create([&] {
    auto spec = ScopedSandbox::default_spec();
    spec.snapshot = "in-use";
    return spec;
  }());
  ASSERT_FALSE(gone);
  EXPECT_EQ(gone.error().code, ErrorCode::kNotFound);
  EXPECT_NE(gone.error().message.find("no snapshot 'in-use'"), std::string::npos);
  // The source is untouched by all of it.
  EXPECT_EQ(sh(source, "echo fine"), "fine\n");
}

TEST_F(Snapshot, BadRequestsAreRefusedWithWhatToDo) {
  const auto source = create();
  for (const char* name :
       {"", "Upper", "-dash", "a/b", "..", "with space",
        "a-name-that-is-far-too-long-for-a-snapshot-because-it-goes-on-and-on"}) {
    SCOPED_TRACE(name);
    auto refused = provider_->snapshot(source, name, false);
    ASSERT_FALSE(refused);
    EXPECT_EQ(refused.error().code, ErrorCode::kInvalidArgument);
    EXPECT_NE(refused.error().message.find("is not a snapshot name"), std::string::npos)
        << refused.error().message;
  }
  auto reserved = provider_->snapshot(source, "packages-mine", false);
  ASSERT_FALSE(reserved);
  EXPECT_NE(reserved.error().message.find("quarry's own"), std::string::npos);
  auto no_sandbox = provider_->snapshot("0123456789ab", "fine", false);
  ASSERT_FALSE(no_sandbox);
  EXPECT_EQ(no_sandbox.error().code, ErrorCode::kNotFound);

  snapshot(source, "taken");
  auto again = provider_->snapshot(source, "taken", false);
  ASSERT_FALSE(again);
  EXPECT_EQ(again.error().code, ErrorCode::kAlreadyExists);
  EXPECT_NE(again.error().message.find("quarry snapshot rm taken"), std::string::npos);

  // A command still running could be writing: refused unless it is to be stopped.
  sandbox::ExecRequest request;
  request.argv = {"sh", "-c", "while true; do date > clock.txt; sleep 0.01; done"};
  auto running = provider_->start(source, request);
  ASSERT_TRUE(running) << running.error().message;
  auto busy = provider_->snapshot(source, "busy", false);
  ASSERT_FALSE(busy);
  EXPECT_EQ(busy.error().code, ErrorCode::kFailedPrecondition);
  EXPECT_NE(busy.error().message.find(fmt::format("sandbox {} is running 1 command", source)),
            std::string::npos)
      << busy.error().message;
  EXPECT_NE(busy.error().message.find("--stop-commands"), std::string::npos);
  auto stopped = provider_->snapshot(source, "busy", true);
  ASSERT_TRUE(stopped) << stopped.error().message;
  // Killed; init reports its end a moment later.
  for (int wait = 0; wait < 500 && (*running)->alive(); ++wait)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_FALSE((*running)->alive());

  // A snapshot of another image than the configuration's cannot be started from.
  const auto record = SandboxEnvironment::get().state_dir() / "sandboxes/snapshots/taken";
  auto text = read_file(record / "snapshot.json");
  ASSERT_TRUE(text);
  auto json = nlohmann::json::parse(*text);
  json["image"] = "0000000000000000";
  ASSERT_TRUE(write_file_atomic(record / "snapshot.json", json.dump()));
  auto spec = ScopedSandbox::default_spec();
  spec.snapshot = "taken";
  auto other_image = provider_->create(spec);
  ASSERT_FALSE(other_image);
  EXPECT_EQ(other_image.error().code, ErrorCode::kFailedPrecondition);
  EXPECT_NE(other_image.error().message.find("snapshot 'taken' was made on image 0000000000000000, "
                                             "but this configuration's image is"),
            std::string::npos)
      << other_image.error().message;
  spec.snapshot = "../taken";
  auto outside = provider_->create(spec);
  ASSERT_FALSE(outside);
  EXPECT_EQ(outside.error().code, ErrorCode::kNotFound);
}

// What a snapshot holds was written by code in a sandbox. Init makes the user's directories
// (and its mount points) while it is still the host's root and names still resolve from the
// host's '/': a link planted in their place must not point it at the host's files.
TEST_F(Snapshot, ALinkPlantedWhereQuarryMakesADirectoryReachesNothingOnTheHost) {
  const auto target = dir_ / "host-directory";
  std::filesystem::create_directory(target);
  std::filesystem::permissions(target, std::filesystem::perms::owner_all);
  const auto source = create();
  ASSERT_EQ(
      sh(source, fmt::format("rm -rf data && ln -s {} data && echo planted", target.string())),
      "planted\n");
  snapshot(source, "linked");
  ASSERT_EQ(sh(source, "rm data && mkdir data && rm -rf outputs && touch outputs && echo planted"),
            "planted\n");
  snapshot(source, "filed");

  for (const auto& [name, what, path] :
       {std::tuple{"linked", "a symbolic link", "/home/sandbox/data"},
        std::tuple{"filed", "not a directory", "/home/sandbox/outputs"}}) {
    SCOPED_TRACE(name);
    auto spec = ScopedSandbox::default_spec();
    spec.snapshot = name;
    auto refused = provider_->create(spec);
    if (refused) sandboxes_.push_back(refused->id);
    ASSERT_FALSE(refused);
    EXPECT_NE(refused.error().message.find(fmt::format(
                  "'{}' in the sandbox is {} where quarry makes a directory", path, what)),
              std::string::npos)
        << refused.error().message;
  }
  struct stat info {};
  ASSERT_EQ(::stat(target.c_str(), &info), 0);
  EXPECT_EQ(info.st_uid, 0u);
  EXPECT_EQ(info.st_gid, 0u);
  EXPECT_EQ(info.st_mode & 07777, 0700u);
  EXPECT_TRUE(std::filesystem::is_empty(target));
}

TEST_F(Snapshot, PackagesAreInstalledOnceAndTheNextSandboxStartsWithThem) {
  ASSERT_TRUE(make_probe_wheel(dir_ / "index", "1.0"));
  const std::string import = "python3 -c 'import quarry_probe; print(quarry_probe.__version__)'";
  const auto first = create("", {"Quarry_Probe"});
  ASSERT_FALSE(first.empty());
  EXPECT_EQ(sh(first, import), "1.0\n");
  EXPECT_EQ(sh(first, "test -e /tmp/quarry-packages || echo gone"), "gone\n")
      << "the wheels are not left in the sandbox";
  // The sandbox user cannot change what was installed.
  EXPECT_TRUE(sh(first, "touch /opt/quarry/venv/lib/python3*/site-packages/quarry_probe/x")
                  .starts_with("exit 1: "));
  const auto base = create();
  EXPECT_NE(sh(base, import + " 2>&1; true").find("No module named 'quarry_probe'"),
            std::string::npos);

  auto all = provider_->snapshots();
  ASSERT_TRUE(all);
  ASSERT_EQ(all->size(), 1u);
  const auto& made = all->front().snapshot;
  EXPECT_TRUE(made.name.starts_with("packages-")) << made.name;
  EXPECT_EQ(made.packages, std::vector<std::string>{"quarry-probe"});
  EXPECT_NE(made.lock.find("quarry-probe==1.0"), std::string::npos) << made.lock;

  // The next sandbox asking for the same set starts from that snapshot: nothing is resolved or
  // installed (the index and the downloaded wheel are gone).
  std::filesystem::remove_all(dir_ / "index");
  std::filesystem::remove_all(dir_ / "cache/wheels");
  const auto second = create("", {"quarry-probe"});
  ASSERT_FALSE(second.empty());
  EXPECT_EQ(sh(second, import), "1.0\n");
  auto info = listed(made.name);
  ASSERT_TRUE(info);
  EXPECT_EQ(info->users.sandboxes, std::vector<std::string>{second});
  // The first installed them itself; it started from the image.
  EXPECT_EQ(std::count(info->users.sandboxes.begin(), info->users.sandboxes.end(), first), 0);
}

TEST_F(Snapshot, PackagesOnANamedSnapshotHaveBoth) {
  ASSERT_TRUE(make_probe_wheel(dir_ / "index", "1.0"));
  const auto source = create();
  ASSERT_EQ(sh(source, "echo data > data/input.csv && echo ok"), "ok\n");
  snapshot(source, "with-data");
  const auto both = create("with-data", {"quarry-probe"});
  EXPECT_EQ(sh(both, "cat data/input.csv && python3 -c 'import quarry_probe'"), "data\n");
  std::filesystem::remove_all(dir_ / "index");
  std::filesystem::remove_all(dir_ / "cache/wheels");
  const auto again = create("with-data", {"quarry-probe"});
  EXPECT_EQ(sh(again, "cat data/input.csv && python3 -c 'import quarry_probe'"), "data\n");
  auto named = listed("with-data");
  ASSERT_TRUE(named);
  ASSERT_EQ(named->users.snapshots.size(), 1u) << "the packages' snapshot is made on it";
  EXPECT_TRUE(named->users.snapshots.front().starts_with("packages-"));
}

TEST_F(Snapshot, AMissingPackageFailsTheCreateAndSaysWhich) {
  auto spec = ScopedSandbox::default_spec();
  spec.packages = {"quarry-no-such-package"};
  auto failed = provider_->create(spec);
  ASSERT_FALSE(failed);
  // pip's own words, under the name of what ran, not its 60 arguments.
  EXPECT_NE(failed.error().message.find("'pip download' exited with status 1"), std::string::npos)
      << failed.error().message;
  EXPECT_NE(failed.error().message.find("No matching distribution found for "
                                        "quarry-no-such-package"),
            std::string::npos)
      << failed.error().message;
  EXPECT_EQ(failed.error().message.find("--platform"), std::string::npos) << failed.error().message;
  auto left = provider_->find({{"test", spec.labels.at("test")}});
  ASSERT_TRUE(left);
  EXPECT_TRUE(left->empty()) << "the half-made sandbox is destroyed";
  spec.packages = {"https://example.invalid/evil.whl"};
  auto bad = provider_->create(spec);
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().code, ErrorCode::kInvalidArgument);
  EXPECT_NE(bad.error().message.find("is not a package requirement"), std::string::npos);
}

// A conversation started with extra packages has them in each of its sandboxes; the second
// conversation asking for the same set starts from their snapshot.
TEST_F(Snapshot, AConversationsSandboxesHaveThePackagesItStartedWith) {
  ASSERT_TRUE(make_probe_wheel(dir_ / "index", "1.0"));
  auto manager = open_conversations();
  ASSERT_TRUE(manager);
  auto step = [&](const std::string& conversation_id) {
    auto turn = manager->begin_turn(conversation_id);
    EXPECT_TRUE(turn) << turn.error().message;
    if (!turn) return std::string();
    sandbox::ExecRequest request;
    request.argv = {"python3", "-c",
                    "try:\n import quarry_probe; print(quarry_probe.__version__)\n"
                    "except ImportError: print('missing')"};
    auto ran = (*turn)->sandbox().execute(request);
    (*turn)->finish(conversation::TurnStatus::kCompleted);
    EXPECT_TRUE(ran) << ran.error().message;
    return ran ? ran->result.stdout_text : std::string();
  };
  auto snapshot_of = [&](const std::string& conversation_id) {
    auto found =
        provider_->find({{std::string(conversation::kConversationLabel), conversation_id}});
    EXPECT_TRUE(found && found->size() == 1u);
    return found && found->size() == 1u ? found->front().snapshot : std::string("?");
  };

  const auto first = history_->create_conversation("", "local", std::nullopt, {"quarry-probe"})->id;
  EXPECT_EQ(step(first), "1.0\n");
  EXPECT_EQ(snapshot_of(first), "") << "the first installed them itself";
  const auto second =
      history_->create_conversation("", "local", std::nullopt, {"quarry-probe"})->id;
  EXPECT_EQ(step(second), "1.0\n");
  EXPECT_TRUE(snapshot_of(second).starts_with("packages-")) << snapshot_of(second);
  const auto plain = history_->create_conversation("")->id;
  EXPECT_EQ(step(plain), "missing\n");
  EXPECT_EQ(snapshot_of(plain), "");
  ASSERT_TRUE(manager->shutdown());
}

// Stopping a turn whose sandbox was still installing its conversation's packages waited for the
// install (minutes, for a large set or a slow index). The install stops now, and the half-made
// sandbox goes: here pip is stuck on an index that never answers.
TEST_F(Snapshot, ATurnCancelledWhileItsSandboxInstallsPackagesLeavesNoSandbox) {
  SilentServer index;
  ::unsetenv("PIP_NO_INDEX");
  ::unsetenv("PIP_FIND_LINKS");
  ::setenv("PIP_INDEX_URL", index.url("/simple/").c_str(), 1);
  auto manager = open_conversations();
  ASSERT_TRUE(manager);
  const auto id =
      history_->create_conversation("", "local", std::nullopt, {"quarry-never-served"})->id;
  auto turn = manager->begin_turn(id);
  ASSERT_TRUE(turn) << turn.error().message;
  UniqueFd cancel(::eventfd(0, EFD_CLOEXEC));
  (*turn)->set_cancel_fd(cancel.get());
  std::optional<Result<conversation::Execution>> ran;
  std::thread stepping([&] {
    sandbox::ExecRequest request;
    request.argv = {"true"};
    ran = (*turn)->sandbox().execute(request);
  });
  const UniqueFd asking = index.accept(std::chrono::seconds(60));
  EXPECT_TRUE(asking) << "pip did not ask the index";
  const uint64_t one = 1;
  ASSERT_EQ(::write(cancel.get(), &one, sizeof one), 8);
  stepping.join();
  ASSERT_FALSE(*ran) << "the step ran";
  EXPECT_EQ(ran->error().code, ErrorCode::kCancelled) << ran->error().message;
  if (asking) {
    EXPECT_TRUE(SilentServer::closed_within(asking, std::chrono::seconds(10))) << "pip goes on";
  }
  auto found = provider_->find({{std::string(conversation::kConversationLabel), id}});
  ASSERT_TRUE(found) << found.error().message;
  EXPECT_TRUE(found->empty()) << "the half-made sandbox is left";
  (*turn)->finish(conversation::TurnStatus::kCancelled);
  ASSERT_TRUE(manager->shutdown());
}

TEST_F(Snapshot, UnusedOnesAreCollectedAfterTheirSetting) {
  ASSERT_TRUE(make_probe_wheel(dir_ / "index", "1.0"));
  // Package snapshots go as soon as nothing uses them; named ones stay (the default).
  open_provider({.keep_unused = std::chrono::seconds(0), .keep_unused_named = std::nullopt});
  const auto installer = create("", {"quarry-probe"});  // installs them itself
  const auto from_packages = create("", {"quarry-probe"});
  destroy(installer);
  auto collected = provider_->collect_snapshots();
  ASSERT_TRUE(collected) << collected.error().message;
  EXPECT_TRUE(collected->empty()) << "a sandbox uses the package snapshot";

  snapshot(from_packages, "named");
  destroy(from_packages);
  collected = provider_->collect_snapshots();
  ASSERT_TRUE(collected);
  EXPECT_TRUE(collected->empty()) << "named snapshots are kept, and so the one below it";
  ASSERT_EQ(provider_->snapshots()->size(), 2u);

  // Named snapshots too, when so configured; one in use stays.
  open_provider(
      {.keep_unused = std::chrono::seconds(0), .keep_unused_named = std::chrono::seconds(0)});
  const auto user = create("named");
  collected = provider_->collect_snapshots();
  ASSERT_TRUE(collected);
  EXPECT_TRUE(collected->empty());
  destroy(user);
  collected = provider_->collect_snapshots();
  ASSERT_TRUE(collected);
  ASSERT_EQ(collected->size(), 2u);
  EXPECT_EQ(collected->front(), "named") << "the one on top first";
  EXPECT_TRUE(collected->back().starts_with("packages-"));
  EXPECT_TRUE(provider_->snapshots()->empty());

  // Kept for an hour: not yet.
  open_provider({.keep_unused = std::chrono::hours(1), .keep_unused_named = std::nullopt});
  destroy(create("", {"quarry-probe"}));
  collected = provider_->collect_snapshots();
  ASSERT_TRUE(collected);
  EXPECT_TRUE(collected->empty());
  EXPECT_EQ(provider_->snapshots()->size(), 1u);
}

}  // namespace
}  // namespace quarry::testing

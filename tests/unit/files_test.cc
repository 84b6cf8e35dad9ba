// Host-side file access on a plain directory standing in for a sandbox's root: nothing the
// "sandbox" plants there may lead the host outside it.
#include "sandbox/local/files.h"

#include <gtest/gtest.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include "common/file_util.h"

namespace quarry::sandbox::local {
namespace {

// Servers sharing a state directory remove the same tree at once (a deleted conversation's
// artifacts): each succeeds, and nothing is left.
TEST(RemoveTree, SeveralRemovingOneTreeAtOnceAllSucceed) {
  const auto root = std::filesystem::path(::testing::TempDir()) / "remove-tree-at-once";
  for (int round = 0; round < 5; ++round) {
    SCOPED_TRACE(round);
    for (int dir = 0; dir < 100; ++dir) {
      const auto sub = root / std::to_string(dir) / "step";
      std::filesystem::create_directories(sub);
      for (int file = 0; file < 5; ++file)
        std::ofstream(sub / std::to_string(file)) << "x";
    }
    std::vector<std::string> errors(4);
    std::vector<std::thread> removers;
    for (size_t i = 0; i < errors.size(); ++i) {
      removers.emplace_back([&, i] {
        if (auto removed = quarry::remove_tree(root); !removed) errors[i] = removed.error().message;
      });
    }
    for (auto& remover : removers)
      remover.join();
    for (const auto& error : errors)
      EXPECT_EQ(error, "");
    EXPECT_FALSE(std::filesystem::exists(root));
  }
}

// A file that cannot be written is named as the caller named it, not by its temporary name.
TEST(WriteFileAtomic, AFailureNamesTheFile) {
  const auto missing = std::filesystem::path(::testing::TempDir()) / "no-such-dir" / "lock";
  auto written = quarry::write_file_atomic(missing, "text");
  ASSERT_FALSE(written);
  EXPECT_EQ(written.error().message,
            fmt::format("writing '{}' failed: No such file or directory", missing.string()));
}

// A writer's file replaces the old one only once it is complete; a failed writer leaves the old
// file and nothing beside it.
TEST(WriteThenRename, ReplacesTheFileOnlyWhenTheWriterSucceeded) {
  const auto dir = std::filesystem::path(::testing::TempDir()) / "write-then-rename";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const auto file = dir / "result.parquet";
  ASSERT_TRUE(quarry::write_file_atomic(file, "old"));
  auto write = [](std::string_view content, bool fail) {
    return [=](const std::filesystem::path& partial) -> quarry::Result<int> {
      std::ofstream(partial) << content;
      if (fail) return quarry::make_error(quarry::ErrorCode::kInternal, "the query failed");
      return 7;
    };
  };
  auto failed = quarry::write_then_rename(file, write("half", true));
  ASSERT_FALSE(failed);
  EXPECT_EQ(failed.error().message, "the query failed");
  EXPECT_EQ(quarry::read_file(file).value_or(""), "old");
  auto written = quarry::write_then_rename(file, write("new", false));
  ASSERT_TRUE(written) << written.error().message;
  EXPECT_EQ(*written, 7);
  EXPECT_EQ(quarry::read_file(file).value_or(""), "new");
  // Over a directory the rename fails: said, and the partial file removed.
  std::filesystem::create_directories(dir / "taken" / "inside");
  auto refused = quarry::write_then_rename(dir / "taken", write("new", false));
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().message.find("writing '" + (dir / "taken").string() + "' failed: "),
            std::string::npos)
      << refused.error().message;
  std::vector<std::string> left;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    left.push_back(entry.path().filename().string());
  }
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{"result.parquet", "taken"}));
}

// What the user named as a command's output stays what it was: a symbolic link is written
// through, as cp does, and a device or a pipe (/dev/null, /dev/stdout) is written into, never
// replaced by a plain file. Before, `quarry sandbox cp ID:/file /dev/null` run as root left a
// plain file where the host's /dev/null was.
TEST(WriteThenRename, WritesThroughALinkAndIntoADeviceOrAPipe) {
  const auto dir = std::filesystem::path(::testing::TempDir()) / "write-through";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  auto write = [](std::string_view content) {
    return [=](const std::filesystem::path& file) -> quarry::Result<void> {
      std::ofstream out(file, std::ios::binary | std::ios::trunc);
      out << content;
      out.close();
      if (!out) return quarry::make_error(quarry::ErrorCode::kInternal, "cannot write");
      return {};
    };
  };

  ASSERT_TRUE(quarry::write_file_atomic(dir / "target.csv", "old"));
  std::filesystem::create_symlink("target.csv", dir / "link.csv");
  auto through = quarry::write_then_rename(dir / "link.csv", write("new"));
  ASSERT_TRUE(through) << through.error().message;
  EXPECT_TRUE(std::filesystem::is_symlink(dir / "link.csv"));
  EXPECT_EQ(quarry::read_file(dir / "target.csv").value_or(""), "new");

  // A link to the host's /dev/null: the device is written into and stays a device (the old
  // code replaced the link, not the device, so this test cannot harm the host).
  std::filesystem::create_symlink("/dev/null", dir / "null");
  auto discarded = quarry::write_then_rename(dir / "null", write("gone"));
  ASSERT_TRUE(discarded) << discarded.error().message;
  EXPECT_TRUE(std::filesystem::is_symlink(dir / "null"));
  EXPECT_TRUE(std::filesystem::is_character_file("/dev/null"));

  const auto fifo = dir / "pipe";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  std::string heard;
  std::thread reader([&] { heard = quarry::read_file(fifo).value_or("unreadable"); });
  auto piped = quarry::write_then_rename(fifo, write("through the pipe"));
  reader.join();
  ASSERT_TRUE(piped) << piped.error().message;
  EXPECT_EQ(heard, "through the pipe");
  EXPECT_TRUE(std::filesystem::is_fifo(fifo));
  std::vector<std::string> left;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    left.push_back(entry.path().filename().string());
  }
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{"link.csv", "null", "pipe", "target.csv"}));
}

TEST(NormalizeSandboxPath, MakesPathsAbsoluteAndRefusesDotDot) {
  EXPECT_EQ(*normalize_sandbox_path("/home/sandbox/outputs/", "/home/sandbox"),
            "/home/sandbox/outputs");
  EXPECT_EQ(*normalize_sandbox_path("analysis.py", "/home/sandbox"), "/home/sandbox/analysis.py");
  EXPECT_EQ(*normalize_sandbox_path("/a//b/./c", "/"), "/a/b/c");
  for (const char* bad : {"", "../etc/passwd", "/home/sandbox/../../etc/shadow", "a/../b"}) {
    SCOPED_TRACE(bad);
    auto path = normalize_sandbox_path(bad, "/home/sandbox");
    ASSERT_FALSE(path);
    EXPECT_EQ(path.error().code, ErrorCode::kInvalidArgument);
  }
  EXPECT_FALSE(normalize_sandbox_path(std::string("a\0b", 3), "/"));
}

class FakeSandboxRoot : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = std::filesystem::temp_directory_path() / fmt::format("quarry-files-{}", ::getpid());
    std::filesystem::remove_all(base_);
    root_ = base_ / "root";
    std::filesystem::create_directories(root_ / "home/sandbox/outputs");
    // A "host" file next to the root that no path may reach.
    std::ofstream(base_ / "host-secret") << "secret";
    auto files = SandboxFiles::open_directory(root_);
    ASSERT_TRUE(files) << files.error().message;
    files_.emplace(std::move(*files));
  }
  void TearDown() override { std::filesystem::remove_all(base_); }

  Result<std::string> read(const std::string& path) {
    std::ostringstream out;
    auto n = files_->read(path, out, 1 << 20);
    if (!n) return std::unexpected(n.error());
    return out.str();
  }

  std::filesystem::path base_, root_;
  std::optional<SandboxFiles> files_;
};

TEST_F(FakeSandboxRoot, WritesCreateParentsOwnedByTheUser) {
  std::istringstream content("print('hi')\n");
  const uid_t me = ::getuid();
  ASSERT_TRUE(files_->write("/home/sandbox/work/deep/analysis.py", content, me, me));
  EXPECT_EQ(*read("/home/sandbox/work/deep/analysis.py"), "print('hi')\n");
  struct stat info {};
  ASSERT_EQ(::stat((root_ / "home/sandbox/work/deep").c_str(), &info), 0);
  EXPECT_EQ(info.st_uid, me);
}

TEST_F(FakeSandboxRoot, RefusesSymlinksPlantedInside) {
  std::filesystem::create_symlink(base_ / "host-secret", root_ / "home/sandbox/outputs/leak.txt");
  std::filesystem::create_symlink("/etc", root_ / "home/sandbox/outputs/etc");
  auto leaked = read("/home/sandbox/outputs/leak.txt");
  ASSERT_FALSE(leaked);
  EXPECT_EQ(leaked.error().code, ErrorCode::kPermissionDenied);
  EXPECT_NE(leaked.error().message.find("symbolic link"), std::string::npos);
  EXPECT_FALSE(read("/home/sandbox/outputs/etc/passwd"));

  // Writing through a planted link must not touch the host file either.
  std::istringstream content("overwritten");
  EXPECT_FALSE(files_->write("/home/sandbox/outputs/leak.txt", content, 0, 0));
  EXPECT_FALSE(files_->write("/home/sandbox/outputs/etc/evil", content, 0, 0));
  std::ifstream secret(base_ / "host-secret");
  std::string text((std::istreambuf_iterator<char>(secret)), {});
  EXPECT_EQ(text, "secret");
}

TEST_F(FakeSandboxRoot, DotDotCannotClimbOutOfTheRoot) {
  // Whatever a path says, it is resolved inside the root.
  EXPECT_FALSE(read("/../host-secret"));
  EXPECT_FALSE(read("/home/../../host-secret"));
}

TEST_F(FakeSandboxRoot, RefusesFifosWithoutHanging) {
  ASSERT_EQ(::mkfifo((root_ / "home/sandbox/outputs/pipe").c_str(), 0644), 0);
  auto read_fifo = read("/home/sandbox/outputs/pipe");
  ASSERT_FALSE(read_fifo);
  EXPECT_NE(read_fifo.error().message.find("not a regular file"), std::string::npos);
  std::istringstream content("x");
  EXPECT_FALSE(files_->write("/home/sandbox/outputs/pipe", content, 0, 0));
}

TEST_F(FakeSandboxRoot, AFailedWriteLeavesTheOldFile) {
  std::istringstream first("the data exported yesterday");
  ASSERT_TRUE(files_->write("/home/sandbox/data/events.parquet", first, ::getuid(), ::getgid()));
  // A stream that breaks half way: the file must not be left half written.
  std::stringstream broken;
  broken << std::string(100000, 'x');
  broken.setstate(std::ios::badbit);
  EXPECT_FALSE(files_->write("/home/sandbox/data/events.parquet", broken, ::getuid(), ::getgid()));
  EXPECT_EQ(*read("/home/sandbox/data/events.parquet"), "the data exported yesterday");
  // and no temporary file is left beside it
  size_t entries = 0;
  for ([[maybe_unused]] const auto& entry :
       std::filesystem::directory_iterator(root_ / "home/sandbox/data")) {
    ++entries;
  }
  EXPECT_EQ(entries, 1u);
}

// A cancel (a turn's Stop, Ctrl-C) stops a write part way and leaves the old file.
TEST_F(FakeSandboxRoot, ACancelledWriteLeavesTheOldFile) {
  std::istringstream first("the data exported yesterday");
  ASSERT_TRUE(files_->write("/home/sandbox/data/events.parquet", first, ::getuid(), ::getgid()));
  UniqueFd cancel(::eventfd(1, EFD_CLOEXEC));  // readable: already cancelled
  std::istringstream large(std::string(1 << 20, 'x'));
  auto written = files_->write("/home/sandbox/data/events.parquet", large, ::getuid(), ::getgid(),
                               cancel.get());
  ASSERT_FALSE(written);
  EXPECT_EQ(written.error().code, ErrorCode::kCancelled) << written.error().message;
  EXPECT_EQ(*read("/home/sandbox/data/events.parquet"), "the data exported yesterday");
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(root_ / "home/sandbox/data"), {}), 1)
      << "no temporary file is left beside it";
}

TEST_F(FakeSandboxRoot, ACancelledReadStops) {
  std::istringstream content(std::string(1 << 20, 'x'));
  ASSERT_TRUE(files_->write("/home/sandbox/outputs/big.bin", content, ::getuid(), ::getgid()));
  UniqueFd cancel(::eventfd(1, EFD_CLOEXEC));  // readable: already cancelled
  std::ostringstream out;
  auto read = files_->read("/home/sandbox/outputs/big.bin", out, 2 << 20, cancel.get());
  ASSERT_FALSE(read);
  EXPECT_EQ(read.error().code, ErrorCode::kCancelled) << read.error().message;
}

TEST_F(FakeSandboxRoot, ReadsRespectTheSizeLimit) {
  std::ofstream(root_ / "home/sandbox/outputs/big") << std::string(1000, 'x');
  std::ostringstream out;
  auto n = files_->read("/home/sandbox/outputs/big", out, 999);
  ASSERT_FALSE(n);
  EXPECT_EQ(n.error().code, ErrorCode::kResourceExhausted);
}

TEST_F(FakeSandboxRoot, ListsFilesAndDirectoriesButNotLinks) {
  std::ofstream(root_ / "home/sandbox/outputs/chart.png") << "png";
  std::filesystem::create_directories(root_ / "home/sandbox/outputs/tables");
  std::ofstream(root_ / "home/sandbox/outputs/tables/t.csv") << "a,b\n";
  std::filesystem::create_symlink("/etc", root_ / "home/sandbox/outputs/etc");
  auto listed = files_->list("/home/sandbox/outputs");
  ASSERT_TRUE(listed) << listed.error().message;
  std::vector<std::string> paths;
  for (const auto& file : *listed)
    paths.push_back(file.path);
  EXPECT_EQ(paths, (std::vector<std::string>{"/home/sandbox/outputs/chart.png",
                                             "/home/sandbox/outputs/tables",
                                             "/home/sandbox/outputs/tables/t.csv"}));
  EXPECT_EQ((*listed)[0].size, 3u);
  EXPECT_TRUE((*listed)[1].is_directory);
  EXPECT_FALSE(files_->list("/home/sandbox/outputs/etc"));
}

TEST_F(FakeSandboxRoot, ListingStopsAtEachBoundAndSaysWhich) {
  const auto outputs = root_ / "home/sandbox/outputs";
  auto deep = outputs;
  for (int level = 0; level < 5; ++level)
    deep /= std::string(40, 'd');
  std::filesystem::create_directories(deep);
  for (int i = 0; i < 20; ++i)
    std::ofstream(outputs / fmt::format("f{}.csv", i)) << "x";

  auto bounded = [&](ListLimits limits, const std::string& says) {
    SCOPED_TRACE(says);
    auto listed = files_->list("/home/sandbox/outputs", limits);
    ASSERT_FALSE(listed);
    EXPECT_EQ(listed.error().code, ErrorCode::kResourceExhausted);
    EXPECT_NE(listed.error().message.find(says), std::string::npos) << listed.error().message;
  };
  bounded({.max_entries = 10}, "holds more than 10 entries");
  bounded({.max_depth = 3}, "is more than 3 levels deep");
  bounded({.max_path = 150}, "holds a path longer than 150 bytes");
  bounded({.max_time = std::chrono::milliseconds(-1)}, "took longer than -1 ms");
  auto listed = files_->list("/home/sandbox/outputs");
  ASSERT_TRUE(listed) << listed.error().message;
  EXPECT_EQ(listed->size(), 25u);
}

// One descriptor per directory waiting to be read would run out on a wide tree (EMFILE for
// every other thread of the server); the walk holds a constant number.
TEST_F(FakeSandboxRoot, AWideTreeIsListedWithAFewDescriptors) {
  const auto outputs = root_ / "home/sandbox/outputs";
  for (int i = 0; i < 300; ++i) {
    std::filesystem::create_directories(outputs / fmt::format("d{}/e", i));
    std::ofstream(outputs / fmt::format("d{}/e/t.csv", i)) << "x";
  }
  int open_now = 0;
  for ([[maybe_unused]] const auto& fd : std::filesystem::directory_iterator("/proc/self/fd"))
    ++open_now;
  rlimit saved{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &saved), 0);
  const rlimit tight{static_cast<rlim_t>(open_now + 8), saved.rlim_max};
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &tight), 0);
  auto listed = files_->list("/home/sandbox/outputs");
  ::setrlimit(RLIMIT_NOFILE, &saved);
  ASSERT_TRUE(listed) << listed.error().message;
  EXPECT_EQ(listed->size(), 900u);
}

TEST_F(FakeSandboxRoot, ListingTellsHolesAndHardLinks) {
  const auto outputs = root_ / "home/sandbox/outputs";
  {
    std::ofstream sparse(outputs / "sparse.csv");
    sparse.seekp(64 << 20);
    sparse << "x";
  }
  std::ofstream(outputs / "whole.csv") << std::string(100000, 'x');
  std::filesystem::create_hard_link(outputs / "whole.csv", outputs / "again.csv");
  auto listed = files_->list("/home/sandbox/outputs");
  ASSERT_TRUE(listed) << listed.error().message;
  ASSERT_EQ(listed->size(), 3u);
  const FileInfo& again = (*listed)[0];
  const FileInfo& sparse = (*listed)[1];
  const FileInfo& whole = (*listed)[2];
  EXPECT_EQ(sparse.size, (64u << 20) + 1);
  EXPECT_LT(sparse.allocated, 1u << 20);
  EXPECT_GE(whole.allocated, whole.size);
  EXPECT_EQ(whole.links, 2u);
  EXPECT_EQ(again.links, 2u);
}

}  // namespace
}  // namespace quarry::sandbox::local

// Reproducible images: `quarry image build` installs what the lock pins even when the package
// index has something newer, and `quarry image lock` is how a newer version gets in. The index
// is a directory of wheels this test makes (pip reads it through its ordinary configuration:
// PIP_NO_INDEX, PIP_FIND_LINKS), so nothing leaves the machine; the images go to a cache of the
// test's own that shares the debootstrapped base of the real one.
#include <gtest/gtest.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "common/command.h"
#include "common/file_util.h"
#include "probe_wheel.h"
#include "sandbox/local/python_lock.h"
#include "sandbox_environment.h"

extern char** environ;

namespace quarry::testing {
namespace {

class ImageLock : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(fmt::format("/tmp/qt-lock-{}", ::getpid()));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_ / "index");
    std::filesystem::create_directories(dir_ / "cache");
    // The debootstrapped base is the real cache's (made once per machine, shared by images).
    std::filesystem::create_directories(SandboxEnvironment::get().cache_dir() / "bases");
    std::filesystem::create_directory_symlink(SandboxEnvironment::get().cache_dir() / "bases",
                                              dir_ / "cache/bases");
    write_config("sandbox:\n  packages: [quarry-probe]\n");
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  void write_config(std::string_view text) {
    ASSERT_TRUE(write_file_atomic(dir_ / "config.yml", text));
  }

  void add_wheel(std::string_view version) {
    auto made = make_probe_wheel(dir_ / "index", version);
    ASSERT_TRUE(made) << made.error().message;
  }

  // quarry with this test's configuration, cache and index; its stdout and stderr merged.
  Result<std::string> quarry(std::vector<std::string> args) {
    args.insert(args.begin(),
                {SandboxEnvironment::get().quarry_binary().string(), "--config",
                 (dir_ / "config.yml").string(), "--cache-dir", (dir_ / "cache").string(),
                 "--state-dir", (dir_ / "state").string()});
    CommandOptions options;
    options.environment.emplace();
    for (char** entry = environ; *entry; ++entry) {
      std::string_view text(*entry);
      const auto equals = text.find('=');
      if (equals == std::string_view::npos || text.starts_with("PIP_")) continue;
      (*options.environment)[std::string(text.substr(0, equals))] = text.substr(equals + 1);
    }
    // pip's own settings, the way a user points it at a private index: only the test's wheels.
    (*options.environment)["PIP_CONFIG_FILE"] = "/dev/null";
    (*options.environment)["PIP_NO_INDEX"] = "1";
    (*options.environment)["PIP_FIND_LINKS"] = (dir_ / "index").string();
    ASSIGN_OR_RETURN(auto output, run_command(args, options));
    return output.output;
  }

  // The image a build printed (its last line) and its manifest.
  nlohmann::json manifest_of(const std::string& output, std::string* hash) {
    auto end = output.find_last_not_of('\n');
    auto start = output.rfind('\n', end);
    *hash = output.substr(start == std::string::npos ? 0 : start + 1, end - start);
    auto text = read_file(dir_ / "cache/images" / *hash / "image.json");
    EXPECT_TRUE(text) << output;
    return text ? nlohmann::json::parse(*text) : nlohmann::json::object();
  }

  std::filesystem::path dir_;
};

TEST_F(ImageLock, ARebuildInstallsTheLockedVersionsUntilAnUpdateIsAskedFor) {
  add_wheel("1.0");

  // The first build resolves the packages, writes their lock beside the configuration and says
  // so.
  auto first = quarry({"image", "build"});
  ASSERT_TRUE(first) << first.error().message;
  EXPECT_NE(first->find("config.lock had no lock yet"), std::string::npos) << *first;
  auto lock_text = read_file(dir_ / "config.lock");
  ASSERT_TRUE(lock_text);
  auto lock = sandbox::local::parse_python_lock(*lock_text, "config.lock");
  ASSERT_TRUE(lock) << lock.error().message;
  ASSERT_NE(lock->find("quarry-probe"), nullptr);
  EXPECT_EQ(lock->find("quarry-probe")->version, "1.0");
  std::string first_hash;
  auto first_manifest = manifest_of(*first, &first_hash);
  EXPECT_EQ(first_manifest["python_packages"].value("quarry-probe", ""), "1.0") << first_manifest;
  EXPECT_EQ(first_manifest["lock"].value("sha256", ""), lock->sha256());
  EXPECT_NE(first->find(fmt::format("image {}: Python", first_hash)), std::string::npos);
  EXPECT_NE(first->find("quarry-probe 1.0"), std::string::npos) << *first;

  // A newer version on the index changes nothing: a rebuild from the lock installs 1.0 again.
  add_wheel("1.1");
  auto rebuilt = quarry({"image", "build", "--force"});
  ASSERT_TRUE(rebuilt) << rebuilt.error().message;
  std::string rebuilt_hash;
  auto rebuilt_manifest = manifest_of(*rebuilt, &rebuilt_hash);
  EXPECT_EQ(rebuilt_hash, first_hash);
  EXPECT_EQ(rebuilt_manifest["python_packages"], first_manifest["python_packages"]);
  EXPECT_EQ(read_file(dir_ / "config.lock").value_or(""), *lock_text);

  // Asked for, the update takes 1.1, says so, and the lock makes another image.
  auto updated = quarry({"image", "lock"});
  ASSERT_TRUE(updated) << updated.error().message;
  EXPECT_NE(updated->find("quarry-probe 1.0 -> 1.1"), std::string::npos) << *updated;
  auto built = quarry({"image", "build"});
  ASSERT_TRUE(built) << built.error().message;
  std::string updated_hash;
  auto updated_manifest = manifest_of(*built, &updated_hash);
  EXPECT_NE(updated_hash, first_hash);
  EXPECT_EQ(updated_manifest["python_packages"].value("quarry-probe", ""), "1.1");

  // `image ls` shows both, each with its lock and the probe's version.
  auto listed = quarry({"image", "ls"});
  ASSERT_TRUE(listed) << listed.error().message;
  EXPECT_NE(listed->find(first_hash), std::string::npos) << *listed;
  EXPECT_NE(listed->find(first_manifest["lock"].value("sha256", "").substr(0, 12)),
            std::string::npos)
      << *listed;
  EXPECT_NE(listed->find("quarry-probe 1.1"), std::string::npos) << *listed;
}

TEST_F(ImageLock, AWrongLockIsRefusedWithWhatToDo) {
  add_wheel("1.0");
  auto locked = quarry({"image", "lock"});
  ASSERT_TRUE(locked) << locked.error().message;
  auto text = read_file(dir_ / "config.lock");
  ASSERT_TRUE(text);
  auto lock = sandbox::local::parse_python_lock(*text, "config.lock");
  ASSERT_TRUE(lock);

  // A hash that is not the wheel's: neither the cache's file nor the index's is taken.
  auto tampered = *lock;
  tampered.packages.front().sha256 = {std::string(64, '0')};
  ASSERT_TRUE(write_file_atomic(dir_ / "config.lock", tampered.text()));
  auto mismatch = quarry({"image", "build"});
  ASSERT_FALSE(mismatch);
  EXPECT_NE(mismatch.error().message.find("quarry-probe"), std::string::npos)
      << mismatch.error().message;
  EXPECT_NE(mismatch.error().message.find("quarry image lock"), std::string::npos)
      << mismatch.error().message;
  EXPECT_FALSE(std::filesystem::exists(dir_ / "cache/images"));

  // A line that is no pin.
  ASSERT_TRUE(write_file_atomic(dir_ / "config.lock",
                                "# python: 3.11\n# requirements: quarry-probe\nquarry-probe>=1\n"));
  auto malformed = quarry({"image", "build"});
  ASSERT_FALSE(malformed);
  EXPECT_NE(malformed.error().message.find("config.lock:3: 'quarry-probe>=1' is not pinned"),
            std::string::npos)
      << malformed.error().message;

  // Packages that changed since the lock was made.
  ASSERT_TRUE(write_file_atomic(dir_ / "config.lock", lock->text()));
  write_config("sandbox:\n  packages: ['quarry-probe>=1.1']\n");
  auto stale = quarry({"image", "build"});
  ASSERT_FALSE(stale);
  EXPECT_NE(stale.error().message.find("was resolved for the packages [quarry-probe], but "
                                       "sandbox.packages is now [quarry-probe>=1.1]; run: quarry "
                                       "image lock"),
            std::string::npos)
      << stale.error().message;
}

}  // namespace
}  // namespace quarry::testing

// The lock of an image's Python packages: reading it, its checks against sandbox.packages, the
// wheels and what was installed, the built-in lock, and what decides which lock is used.
#include "sandbox/local/python_lock.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include "common/file_util.h"
#include "common/sha256.h"
#include "sandbox/local/image.h"

namespace quarry::sandbox::local {
namespace {

const std::string kHashA(64, 'a');
const std::string kHashB(64, 'b');

std::string lock_text(std::string_view packages, std::string_view requirements = "polars") {
  return fmt::format("# comment\n# python: 3.11\n# requirements: {}\n{}", requirements, packages);
}

TEST(PythonLock, ReadsPinsHashesAndHeader) {
  auto lock = parse_python_lock(
      lock_text(fmt::format("Polars_Runtime.32==1.35.2 \\\n    --hash=sha256:{} \\\n"
                            "    --hash=sha256:{}\n\npolars==1.35.2 --hash=sha256:{}\n",
                            kHashA, kHashB, kHashA),
                "polars==1.35.2"),
      "test.lock");
  ASSERT_TRUE(lock) << lock.error().message;
  EXPECT_EQ(lock->python, "3.11");
  EXPECT_EQ(lock->requirements, std::vector<std::string>{"polars==1.35.2"});
  ASSERT_EQ(lock->packages.size(), 2u);
  EXPECT_EQ(lock->packages[0].name, "polars");
  EXPECT_EQ(lock->packages[1].name, "polars-runtime-32");
  EXPECT_EQ(lock->packages[1].sha256, (std::vector<std::string>{kHashA, kHashB}));
  ASSERT_NE(lock->find("POLARS-runtime_32"), nullptr);

  // What quarry writes reads back the same, and comments do not change its identity.
  auto again = parse_python_lock(lock->text(), "again.lock");
  ASSERT_TRUE(again) << again.error().message;
  EXPECT_EQ(again->text(), lock->text());
  EXPECT_EQ(again->sha256(), lock->sha256());
  auto bumped = *lock;
  bumped.packages[0].version = "1.35.3";
  EXPECT_NE(bumped.sha256(), lock->sha256());
}

TEST(PythonLock, BadLinesNameTheLineAndWhatToDo) {
  struct Case {
    const char* name;
    std::string text;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {"not pinned", lock_text(fmt::format("polars>=1.0 --hash=sha256:{}\n", kHashA)),
       "test.lock:4: 'polars>=1.0 --hash=sha256:" + kHashA + "' is not pinned"},
      {"no hash", lock_text("polars==1.35.2\n"), "test.lock:4: polars==1.35.2 has no --hash"},
      {"short hash", lock_text("polars==1.35.2 --hash=sha256:abc\n"),
       "'--hash=sha256:abc' of polars==1.35.2 is not a sha256 hash"},
      {"other algorithm", lock_text(fmt::format("polars==1.35.2 --hash=md5:{}\n", kHashA)),
       "is not a sha256 hash"},
      {"other option",
       lock_text(fmt::format("polars==1.35.2 --index-url=x --hash=sha256:{}\n", kHashA)),
       "'--index-url=x' after polars==1.35.2: only --hash=sha256:... may follow"},
      {"twice",
       lock_text(fmt::format("polars==1.0 --hash=sha256:{}\nPolars==1.1 --hash=sha256:{}\n", kHashA,
                             kHashB)),
       "test.lock:5: polars is pinned twice"},
      {"bad name", lock_text(fmt::format("-polars==1.0 --hash=sha256:{}\n", kHashA)),
       "'-polars' is not a package name"},
      {"wildcard version", lock_text(fmt::format("polars==1.* --hash=sha256:{}\n", kHashA)),
       "'1.*' is not an exact version of polars"},
      {"dangling continuation", lock_text("polars==1.0 \\\n"),
       "the last line ends with '\\' but nothing follows"},
      {"no python", "# requirements: polars\n", "no '# python: X.Y' line"},
      {"bad python", "# python: three\n# requirements: polars\n",
       "'three' is not a Python version"},
      {"no requirements", "# python: 3.11\n", "no '# requirements: ...' line"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    auto lock = parse_python_lock(c.text, "test.lock");
    ASSERT_FALSE(lock);
    EXPECT_EQ(lock.error().code, ErrorCode::kInvalidArgument);
    EXPECT_NE(lock.error().message.find(c.expected), std::string::npos) << lock.error().message;
    EXPECT_NE(lock.error().message.find("quarry image lock"), std::string::npos)
        << lock.error().message;
  }
}

TEST(PythonLock, MustCoverWhatSandboxPackagesAsksFor) {
  auto lock = parse_python_lock(
      lock_text(fmt::format("polars==1.35.2 --hash=sha256:{}\n", kHashA), "duckdb polars==1.35.2"),
      "config.lock");
  ASSERT_TRUE(lock) << lock.error().message;

  // Another package set: the lock is for other requirements.
  auto changed = check_lock_covers(*lock, {"polars==1.35.2", "pandas"}, "config.lock");
  ASSERT_FALSE(changed);
  EXPECT_EQ(changed.error().code, ErrorCode::kFailedPrecondition);
  EXPECT_NE(changed.error().message.find("config.lock was resolved for the packages [duckdb, "
                                         "polars==1.35.2], but sandbox.packages is now [pandas, "
                                         "polars==1.35.2]; run: quarry image lock"),
            std::string::npos)
      << changed.error().message;

  // The header says duckdb, but no line pins it (a hand-edited lock).
  auto uncovered = check_lock_covers(*lock, {"polars==1.35.2", "duckdb"}, "config.lock");
  ASSERT_FALSE(uncovered);
  EXPECT_NE(uncovered.error().message.find("config.lock does not pin duckdb, which "
                                           "sandbox.packages asks for"),
            std::string::npos)
      << uncovered.error().message;

  // A pin the lock does not keep.
  auto other = parse_python_lock(
      lock_text(fmt::format("polars==1.35.1 --hash=sha256:{}\n", kHashA), "polars==1.35.2"),
      "config.lock");
  ASSERT_TRUE(other);
  auto wrong_version = check_lock_covers(*other, {"polars==1.35.2"}, "config.lock");
  ASSERT_FALSE(wrong_version);
  EXPECT_NE(wrong_version.error().message.find(
                "config.lock pins polars 1.35.1, but sandbox.packages asks for polars==1.35.2"),
            std::string::npos)
      << wrong_version.error().message;

  // Order does not matter; extras and specifiers name the package before them.
  auto covered = parse_python_lock(
      lock_text(fmt::format("polars==1.35.2 --hash=sha256:{}\nduckdb==1.4.5 --hash=sha256:{}\n",
                            kHashA, kHashB),
                "polars[pyarrow]>=1.30 duckdb==1.4.5"),
      "config.lock");
  ASSERT_TRUE(covered) << covered.error().message;
  EXPECT_TRUE(check_lock_covers(*covered, {"duckdb==1.4.5", "polars[pyarrow]>=1.30"}, "x"));
}

TEST(PythonLock, NamesAndWheelFilenames) {
  EXPECT_EQ(normalize_package_name("Polars_Runtime.32"), "polars-runtime-32");
  EXPECT_EQ(normalize_package_name("a--b__c"), "a-b-c");
  EXPECT_EQ(requirement_name("Polars[pyarrow]>=1.30,<2"), "polars");
  EXPECT_EQ(requirement_name("duckdb==1.4.5"), "duckdb");
  auto wheel = parse_wheel_filename(
      "polars_runtime_32-1.35.2-cp39-abi3-manylinux_2_17_x86_64.manylinux2014_x86_64.whl");
  ASSERT_TRUE(wheel);
  EXPECT_EQ(wheel->name, "polars-runtime-32");
  EXPECT_EQ(wheel->version, "1.35.2");
  auto built = parse_wheel_filename("probe-1.0-1-py3-none-any.whl");
  ASSERT_TRUE(built);
  EXPECT_EQ(built->version, "1.0");
  EXPECT_FALSE(parse_wheel_filename("polars-1.35.2.tar.gz"));
  EXPECT_FALSE(parse_wheel_filename("polars-1.35.2.whl"));
}

class WheelDirectory : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / fmt::format("quarry-wheels-{}", ::getpid());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string add(const std::string& name, const std::string& content) {
    EXPECT_TRUE(write_file_atomic(dir_ / name, content));
    return sha256_hex(content);
  }
  std::filesystem::path dir_;
};

TEST_F(WheelDirectory, FindsTheWheelWithTheLockedHash) {
  const auto probe = add("probe-1.0-py3-none-any.whl", "probe 1.0");
  add("probe-1.1-py3-none-any.whl", "probe 1.1");
  auto lock = parse_python_lock(
      lock_text(fmt::format("probe==1.0 --hash=sha256:{}\n", probe), "probe"), "config.lock");
  ASSERT_TRUE(lock) << lock.error().message;
  auto wheels = find_locked_wheels(*lock, dir_);
  EXPECT_TRUE(wheels.missing.empty());
  EXPECT_EQ(wheels.found["probe"], dir_ / "probe-1.0-py3-none-any.whl");
  EXPECT_TRUE(check_wheels_found(wheels, "config.lock", "run quarry image lock"));
}

TEST_F(WheelDirectory, AHashMismatchNamesThePackageAndWhatToDo) {
  const auto changed = add("probe-1.0-py3-none-any.whl", "probe 1.0, changed");
  auto lock = parse_python_lock(
      lock_text(
          fmt::format("probe==1.0 --hash=sha256:{}\nother==2.0 --hash=sha256:{}\n", kHashA, kHashB),
          "probe other"),
      "config.lock");
  ASSERT_TRUE(lock) << lock.error().message;
  auto wheels = find_locked_wheels(*lock, dir_);
  ASSERT_EQ(wheels.missing.size(), 2u);
  auto checked = check_wheels_found(wheels, "config.lock", "run quarry image lock");
  ASSERT_FALSE(checked);
  const auto& message = checked.error().message;
  EXPECT_NE(message.find(fmt::format("probe==1.0: the lock has sha256 {}, but the wheel is "
                                     "probe-1.0-py3-none-any.whl (sha256 {})",
                                     kHashA, changed)),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("other==2.0: no wheel with the lock's sha256"), std::string::npos)
      << message;
  EXPECT_NE(message.find("run quarry image lock"), std::string::npos) << message;
}

TEST(PythonLock, InstalledMustBeWhatTheLockPins) {
  auto lock = parse_python_lock(
      lock_text(fmt::format("polars==1.35.2 --hash=sha256:{}\nnumpy==2.3.5 --hash=sha256:{}\n",
                            kHashA, kHashB)),
      "config.lock");
  ASSERT_TRUE(lock);
  EXPECT_TRUE(check_installed(*lock, "numpy==2.3.5\npip==23.0.1\nPolars==1.35.2\nsetuptools==66\n",
                              "config.lock"));
  auto differs = check_installed(*lock, "numpy==2.4.0\nrich==13\n", "config.lock");
  ASSERT_FALSE(differs);
  for (const char* part : {"numpy is 2.4.0, not 2.3.5", "polars 1.35.2 is not installed",
                           "rich 13 is installed but not in the lock"}) {
    EXPECT_NE(differs.error().message.find(part), std::string::npos) << differs.error().message;
  }
}

// The lock built into quarry is the one of the built-in sandbox.packages: a change of the pins
// in config.h without `quarry image lock --output src/sandbox/local/python.lock` fails here.
TEST(PythonLock, TheBuiltInLockCoversTheBuiltInPackages) {
  auto lock = parse_python_lock(built_in_python_lock(), kBuiltInLock);
  ASSERT_TRUE(lock) << lock.error().message;
  EXPECT_TRUE(check_lock_covers(*lock, SandboxConfig{}.packages, kBuiltInLock));
  for (const auto& requirement : SandboxConfig{}.packages) {
    EXPECT_NE(requirement.find("=="), std::string::npos) << requirement << " is not pinned";
  }
}

TEST(PythonLock, WhichLockAConfigurationUses) {
  const auto dir =
      std::filesystem::temp_directory_path() / fmt::format("quarry-lock-config-{}", ::getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);

  // The built-in packages: the built-in lock, until the configuration has a lock of its own.
  auto plain = parse_config("", (dir / "config.yml").string());
  ASSERT_TRUE(plain);
  EXPECT_EQ(plain->sandbox.lock_file, dir / "config.lock");
  auto file = lock_file_for(plain->sandbox);
  ASSERT_TRUE(file);
  EXPECT_FALSE(*file);
  ASSERT_TRUE(write_file_atomic(dir / "config.lock", "# python: 3.11\n"));
  file = lock_file_for(plain->sandbox);
  ASSERT_TRUE(file && *file);
  EXPECT_EQ(**file, dir / "config.lock");

  // Packages of its own: always the file beside it (made by the first build).
  auto own = parse_config("sandbox:\n  packages: [polars]\n", (dir / "bench.yml").string());
  ASSERT_TRUE(own);
  file = lock_file_for(own->sandbox);
  ASSERT_TRUE(file && *file);
  EXPECT_EQ(**file, dir / "bench.lock");
  auto missing = default_image_definition(own->sandbox);
  if (!missing && missing.error().code == ErrorCode::kNotFound) {
    EXPECT_NE(missing.error().message.find("bench.lock, does not exist yet; run: quarry image "
                                           "build"),
              std::string::npos)
        << missing.error().message;
  }

  // sandbox.lock names it, relative to the configuration.
  auto named = parse_config("sandbox:\n  lock: locks/python.lock\n", (dir / "c.yml").string());
  ASSERT_TRUE(named);
  file = lock_file_for(named->sandbox);
  ASSERT_TRUE(file && *file);
  EXPECT_EQ(**file, dir / "locks/python.lock");
  auto empty = parse_config("sandbox:\n  lock: ''\n", "c.yml");
  ASSERT_FALSE(empty);
  EXPECT_NE(empty.error().message.find("sandbox.lock: must name a file"), std::string::npos)
      << empty.error().message;

  // No configuration file and packages of its own: nowhere to keep a lock.
  SandboxConfig programmatic;
  programmatic.packages = {"polars"};
  auto nowhere = lock_file_for(programmatic);
  ASSERT_FALSE(nowhere);
  EXPECT_NE(nowhere.error().message.find("needs a lock of its own"), std::string::npos);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace quarry::sandbox::local

// Snapshot names, the key of a package set, and which unused snapshots garbage collection takes.
#include "sandbox/local/snapshot.h"

#include <gtest/gtest.h>

namespace quarry::sandbox::local {
namespace {

using std::chrono::hours;
using Time = std::chrono::system_clock::time_point;

TEST(SnapshotName, TakesPlainLowercaseNamesOnly) {
  for (const char* good : {"prepared", "v1.2", "team_a-2024", "0day"}) {
    SCOPED_TRACE(good);
    EXPECT_TRUE(check_snapshot_name(good));
    EXPECT_TRUE(valid_snapshot_name(good));
  }
  for (const char* bad :
       {"", "Prepared", ".hidden", "-x", "a/b", "..", "a b", "a\nb", "ümlaut", "name:tag"}) {
    SCOPED_TRACE(bad);
    auto refused = check_snapshot_name(bad);
    ASSERT_FALSE(refused);
    EXPECT_EQ(refused.error().code, ErrorCode::kInvalidArgument);
    EXPECT_NE(refused.error().message.find("is not a snapshot name"), std::string::npos);
    EXPECT_FALSE(valid_snapshot_name(bad));
  }
  EXPECT_TRUE(check_snapshot_name(std::string(63, 'a')));
  EXPECT_FALSE(check_snapshot_name(std::string(64, 'a')));
  // quarry's own names are stored names, but no one else's.
  EXPECT_TRUE(valid_snapshot_name("packages-0123456789abcdef"));
  auto reserved = check_snapshot_name("packages-mine");
  ASSERT_FALSE(reserved);
  EXPECT_NE(reserved.error().message.find("quarry's own"), std::string::npos);
}

TEST(PackageSet, IsOneSpellingSortedWithoutRepeats) {
  auto canonical = canonical_requirements({"Tabulate >= 0.9", "quarry_probe", "tabulate>=0.9"});
  ASSERT_TRUE(canonical) << canonical.error().message;
  EXPECT_EQ(*canonical, (std::vector<std::string>{"quarry-probe", "tabulate>=0.9"}));
  for (const char* bad :
       {"https://example.invalid/x.whl", "./local", "-e .", "--index-url=x", ""}) {
    SCOPED_TRACE(bad);
    auto refused = canonical_requirements({bad});
    ASSERT_FALSE(refused);
    EXPECT_EQ(refused.error().code, ErrorCode::kInvalidArgument);
  }
}

TEST(PackageSet, SnapshotNameDependsOnImageBaseAndPackages) {
  const std::vector<std::string> probe = {"quarry-probe"};
  const auto name = package_snapshot_name("08728050edfce88e", "", probe);
  EXPECT_TRUE(name.starts_with("packages-"));
  EXPECT_EQ(name.size(), std::string("packages-").size() + 16);
  EXPECT_TRUE(valid_snapshot_name(name));
  EXPECT_EQ(name, package_snapshot_name("08728050edfce88e", "", probe)) << "found again";
  EXPECT_NE(name, package_snapshot_name("cb34ac58489cb77e", "", probe));
  EXPECT_NE(name, package_snapshot_name("08728050edfce88e", "a1b2c3d4e5f6", probe));
  EXPECT_NE(name, package_snapshot_name("08728050edfce88e", "", {"quarry-probe==1.0"}));
}

SnapshotRecord record(std::string name, std::string parent, Time last_used) {
  SnapshotRecord made;
  made.name = std::move(name);
  made.parent = std::move(parent);
  made.created_at = made.last_used_at = last_used;
  return made;
}

TEST(SnapshotCollection, TakesWhatNothingUsesOnceItsSettingHasPassed) {
  const Time now = Time{} + hours(1000);
  const SnapshotConfig policy{.keep_unused = hours(24), .keep_unused_named = std::nullopt};
  const std::vector<SnapshotRecord> snapshots = {
      record("packages-old", "", now - hours(48)),
      record("packages-new", "", now - hours(1)),
      record("packages-used", "", now - hours(48)),
      record("named-old", "", now - hours(480)),
  };
  EXPECT_EQ(collectable_snapshots(snapshots, {"packages-used"}, now, policy),
            std::vector<std::string>{"packages-old"});
  // Named ones too, when a time is set for them.
  const SnapshotConfig both{.keep_unused = hours(24), .keep_unused_named = hours(240)};
  EXPECT_EQ(collectable_snapshots(snapshots, {"packages-used"}, now, both),
            (std::vector<std::string>{"packages-old", "named-old"}));
  // Never.
  EXPECT_TRUE(collectable_snapshots(snapshots, {}, now, {std::nullopt, std::nullopt}).empty());
}

TEST(SnapshotCollection, ASnapshotStaysWhileOneIsMadeOnIt) {
  const Time now = Time{} + hours(1000);
  const SnapshotConfig zero{.keep_unused = hours(0), .keep_unused_named = hours(0)};
  const std::vector<SnapshotRecord> chain = {
      record("base", "", now),
      record("packages-on-base", "base", now),
      record("top", "packages-on-base", now),
  };
  // All unused: the whole chain, top first.
  EXPECT_EQ(collectable_snapshots(chain, {}, now, zero),
            (std::vector<std::string>{"top", "packages-on-base", "base"}));
  // The top in use keeps everything below it.
  EXPECT_TRUE(collectable_snapshots(chain, {"top"}, now, zero).empty());
  // A kept top (named, never collected) keeps what it is made on.
  const SnapshotConfig named_kept{.keep_unused = hours(0), .keep_unused_named = std::nullopt};
  EXPECT_TRUE(collectable_snapshots(chain, {}, now, named_kept).empty());
}

}  // namespace
}  // namespace quarry::sandbox::local

// HostIds: which sandbox id ranges the host's processes use, read from /proc at most once per
// max_age (counted here through a scan of the test's own).
#include <gtest/gtest.h>

#include <algorithm>

#include "sandbox/local/image.h"
#include "sandbox/local/state.h"

namespace quarry::sandbox::local {
namespace {

constexpr uint32_t kRange = kSandboxIdBase + 5 * kSandboxIdCount;

TEST(HostIds, ARangeIsInUseWhenAnyOfItsIdsIs) {
  HostIds ids(std::chrono::hours(1), [] {
    return std::vector<uint32_t>{kSandboxIdBase, kRange + kSandboxIdCount - 1};
  });
  EXPECT_TRUE(ids.in_use(kRange, kSandboxIdCount)) << "its last id";
  EXPECT_TRUE(ids.in_use(kSandboxIdBase, kSandboxIdCount)) << "its first id";
  EXPECT_FALSE(ids.in_use(kRange + kSandboxIdCount, kSandboxIdCount)) << "the range after";
  EXPECT_FALSE(ids.in_use(kRange - kSandboxIdCount, kSandboxIdCount)) << "the range before";
}

TEST(HostIds, TheHostIsReadOncePerMaxAge) {
  int scans = 0;
  std::vector<uint32_t> running;
  const auto scan = [&] {
    ++scans;
    return running;
  };
  HostIds kept(std::chrono::hours(1), scan);
  EXPECT_FALSE(kept.in_use(kRange, kSandboxIdCount));
  running = {kRange + 7};
  EXPECT_FALSE(kept.in_use(kRange, kSandboxIdCount)) << "what was read is kept for max_age";
  EXPECT_EQ(scans, 1);

  HostIds fresh(std::chrono::milliseconds(0), scan);
  EXPECT_TRUE(fresh.in_use(kRange, kSandboxIdCount));
  running.clear();
  EXPECT_FALSE(fresh.in_use(kRange, kSandboxIdCount));
  EXPECT_EQ(scans, 3);
}

// The real host: this test runs as root, so /proc has processes of uid 0; asked from the
// sandboxes' base up, none of them is listed.
TEST(HostIds, ReadsTheOwnersOfTheHostsProcesses) {
  const auto all = host_ids_from(0);
  EXPECT_TRUE(std::is_sorted(all.begin(), all.end()));
  EXPECT_TRUE(std::binary_search(all.begin(), all.end(), 0u));
  for (uint32_t id : host_ids_from(kSandboxIdBase))
    EXPECT_GE(id, kSandboxIdBase);
}

}  // namespace
}  // namespace quarry::sandbox::local

// HostIds: which sandbox id ranges the host's processes use, read from /proc at most once per
// max_age (counted here through a scan of the test's own); and the admission tickets of
// StateStore, by which every process counts the sandboxes being created.
#include <gtest/gtest.h>

#include <algorithm>
#include <thread>

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

// Admission tickets: what every process's admission counts of the sandboxes being created.
class AdmissionTickets : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / fmt::format("quarry-tickets-{}", ::getpid());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::filesystem::path dir_;
};

ResourceLimits limits(double cpus, uint64_t memory) {
  return {.cpus = cpus, .memory_bytes = memory, .disk_bytes = 3, .pids = 1};
}

TEST_F(AdmissionTickets, ATicketCountsItsLimitsAndNamesItsSandboxUntilItEnds) {
  StateStore state(dir_);
  EXPECT_TRUE(state.admitting(std::chrono::minutes(1))->empty()) << "no directory yet";
  auto lock = state.lock_admissions();
  ASSERT_TRUE(lock) << lock.error().message;
  auto first = state.add_ticket(limits(1, 100));
  auto second = state.add_ticket(limits(0.5, 200));
  ASSERT_TRUE(first && second);
  auto counted = state.admitting(std::chrono::minutes(1));
  ASSERT_TRUE(counted) << counted.error().message;
  ASSERT_EQ(counted->size(), 2u);
  EXPECT_EQ((*counted)[0].limits.cpus + (*counted)[1].limits.cpus, 1.5);
  EXPECT_EQ((*counted)[0].limits.memory_bytes + (*counted)[1].limits.memory_bytes, 300u);
  EXPECT_EQ((*counted)[0].sandbox_id + (*counted)[1].sandbox_id, "") << "no id drawn yet";
  lock->reset();

  // Named, it says which sandbox it counts (whose record, once read, counts instead).
  const std::string id = "0123456789ab";
  const std::string named = state.name_ticket(*first, id);
  EXPECT_EQ(named, *first + "-" + id);
  counted = state.admitting(std::chrono::minutes(1));
  ASSERT_EQ(counted->size(), 2u);
  const auto& of_first = (*counted)[0].limits.memory_bytes == 100 ? (*counted)[0] : (*counted)[1];
  EXPECT_EQ(of_first.sandbox_id, id);

  state.remove_ticket(named);
  state.remove_ticket(*second);
  EXPECT_TRUE(state.admitting(std::chrono::minutes(1))->empty());
}

// A ticket renamed while another process counted could be listed by its old name, then found
// gone as if its create had ended, before its record was saved: two creates at once, with room
// for one, could both be admitted. Naming waits for the count to end.
TEST_F(AdmissionTickets, NamingATicketWaitsWhileAnotherAdmissionCounts) {
  StateStore state(dir_);
  auto lock = state.lock_admissions();
  ASSERT_TRUE(lock) << lock.error().message;
  auto ticket = state.add_ticket(limits(1, 100));
  ASSERT_TRUE(ticket);
  const std::string id = "0123456789ab";
  std::string named;
  std::thread naming([&] { named = state.name_ticket(*ticket, id); });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_TRUE(std::filesystem::exists(dir_ / "admitting" / *ticket))
      << "renamed while another admission was counting";
  lock->reset();
  naming.join();
  EXPECT_EQ(named, *ticket + "-" + id);
  EXPECT_TRUE(std::filesystem::exists(dir_ / "admitting" / named));
}

TEST_F(AdmissionTickets, ATicketOfAProcessThatIsGoneOrTooOldCountsNoMoreAndIsRemoved) {
  StateStore state(dir_);
  auto lock = state.lock_admissions();
  ASSERT_TRUE(lock) << lock.error().message;
  auto ticket = state.add_ticket(limits(1, 100));
  ASSERT_TRUE(ticket);
  // A pid no process has (above the kernel's pid_max).
  std::filesystem::rename(dir_ / "admitting" / *ticket, dir_ / "admitting" / "99999999-0");
  EXPECT_TRUE(state.admitting(std::chrono::minutes(1))->empty());
  EXPECT_FALSE(std::filesystem::exists(dir_ / "admitting" / "99999999-0"));

  auto old = state.add_ticket(limits(1, 100));
  ASSERT_TRUE(old);
  std::filesystem::last_write_time(
      dir_ / "admitting" / *old,
      std::filesystem::file_time_type::clock::now() - std::chrono::minutes(11));
  EXPECT_TRUE(state.admitting(std::chrono::minutes(10))->empty());
  EXPECT_FALSE(std::filesystem::exists(dir_ / "admitting" / *old));
}

}  // namespace
}  // namespace quarry::sandbox::local

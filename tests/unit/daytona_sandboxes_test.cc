// The sandboxes of the Daytona-compatible API (server/daytona/sandboxes.h) over a scheduler whose
// provider keeps them in memory: stop and start, and what the reaper does with idle and stopped
// sandboxes, by Daytona's intervals (minutes).
#include <gtest/gtest.h>

#include <limits>

#include "counting_provider.h"
#include "server/daytona/sandboxes.h"

namespace quarry::server::daytona {
namespace {

using namespace std::chrono_literals;
using testing_support::CountingProvider;

class DaytonaSandboxes : public ::testing::Test {
 protected:
  Record make(int64_t auto_stop, int64_t auto_delete, std::string owner = "alice") {
    Record draft;
    draft.owner = std::move(owner);
    draft.auto_stop = auto_stop;
    draft.auto_delete = auto_delete;
    auto created = sandboxes_.create(draft, {});
    EXPECT_TRUE(created) << created.error().message;
    return created.value_or(Record{});
  }
  State state_of(const Record& record) {
    auto found = sandboxes_.get(record.owner, record.id);
    return found ? found->state : State::kDestroyed;
  }

  CountingProvider provider_;
  capacity::Scheduler scheduler_{{{"local", &provider_, 8}}, capacity::SchedulerOptions{}};
  // The reaper's own pass would come in an hour: each test reaps when it means to.
  Sandboxes sandboxes_{scheduler_, provider_, 1h};
};

TEST_F(DaytonaSandboxes, AStoppedSandboxTakesNoToolboxCallUntilStartedAndKeepsItsPlace) {
  const Record sandbox = make(15, -1);
  auto stopped = sandboxes_.stop("alice", sandbox.id);
  ASSERT_TRUE(stopped) << stopped.error().message;
  EXPECT_EQ(stopped->state, State::kStopped);
  EXPECT_GE(provider_.stops(sandbox.id), 1);  // what ran in it was ended

  auto call = sandboxes_.use("alice", sandbox.id);
  ASSERT_FALSE(call);
  EXPECT_EQ(call.error().code, ErrorCode::kFailedPrecondition);
  EXPECT_NE(call.error().message.find("start it first"), std::string::npos);
  auto again = sandboxes_.stop("alice", sandbox.id);
  ASSERT_FALSE(again);
  EXPECT_EQ(again.error().message, "Sandbox is not started");
  // Another user's is unknown to them, stopped or not.
  EXPECT_EQ(sandboxes_.start("bob", sandbox.id).error().code, ErrorCode::kNotFound);
  // Still the same sandbox, holding its place.
  EXPECT_EQ(provider_.existing(), 1u);
  EXPECT_EQ(scheduler_.stats().busy, 1);

  auto started = sandboxes_.start("alice", sandbox.id);
  ASSERT_TRUE(started);
  EXPECT_EQ(started->state, State::kStarted);
  ASSERT_TRUE(sandboxes_.use("alice", sandbox.id));
  sandboxes_.release(sandbox.id);
}

TEST_F(DaytonaSandboxes, AutoStopStopsAnIdleSandboxAndAutoDeleteCountsFromTheStop) {
  const auto now = std::chrono::system_clock::now();
  const Record lasting = make(15, 60);
  const Record never_stops = make(0, 0);
  const Record ephemeral = make(5, 0);
  const Record busy = make(5, -1);
  ASSERT_TRUE(sandboxes_.use("alice", busy.id));  // a command running for longer than 5 min

  sandboxes_.reap(now + 10min);
  EXPECT_EQ(state_of(lasting), State::kStarted);      // idle 10 of its 15 minutes
  EXPECT_EQ(state_of(never_stops), State::kStarted);  // autoStop 0: never
  EXPECT_EQ(state_of(ephemeral), State::kDestroyed);  // autoDelete 0: deleted at its stop
  EXPECT_EQ(state_of(busy), State::kStarted);         // in use is never idle

  sandboxes_.reap(now + 16min);
  EXPECT_EQ(state_of(lasting), State::kStopped);
  EXPECT_EQ(provider_.stops(lasting.id), 1);  // what it left running in the background
  sandboxes_.reap(now + 16min + 59min);
  EXPECT_EQ(state_of(lasting), State::kStopped);  // 59 of its 60 minutes stopped
  sandboxes_.reap(now + 16min + 61min);
  EXPECT_EQ(state_of(lasting), State::kDestroyed);

  std::vector<std::string> destroyed = provider_.destroyed();
  std::sort(destroyed.begin(), destroyed.end());
  std::vector<std::string> expected = {ephemeral.id, lasting.id};
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(destroyed, expected);
  sandboxes_.release(busy.id);
}

// minutes(2^31) in the clock's nanoseconds overflowed: a sandbox asked to last "for ever" this
// way was stopped and deleted by the next pass.
TEST_F(DaytonaSandboxes, TheLongestIntervalsKeepASandboxAsLongAsTheySay) {
  const auto now = std::chrono::system_clock::now();
  const Record lasting = make(2147483647, 2147483647);
  const Record longest = make(std::numeric_limits<int64_t>::max(), -1);
  sandboxes_.reap(now + 24h);
  EXPECT_EQ(state_of(lasting), State::kStarted);
  EXPECT_EQ(state_of(longest), State::kStarted);
  ASSERT_TRUE(sandboxes_.stop("alice", lasting.id));
  sandboxes_.reap(now + 24h * 365);
  EXPECT_EQ(state_of(lasting), State::kStopped);
  EXPECT_TRUE(provider_.destroyed().empty());
}

TEST_F(DaytonaSandboxes, StopWithAutoDeleteZeroDeletes) {
  const Record sandbox = make(15, 0);
  auto stopped = sandboxes_.stop("alice", sandbox.id);
  ASSERT_TRUE(stopped);
  EXPECT_EQ(stopped->state, State::kDestroyed);
  EXPECT_EQ(provider_.existing(), 0u);
  EXPECT_EQ(sandboxes_.get("alice", sandbox.id).error().code, ErrorCode::kNotFound);
}

}  // namespace
}  // namespace quarry::server::daytona

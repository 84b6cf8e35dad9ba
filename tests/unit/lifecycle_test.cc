#include "conversation/lifecycle.h"

#include <gtest/gtest.h>

#include <set>

namespace quarry::conversation {
namespace {

using enum SandboxLifecycle;

constexpr SandboxLifecycle kAll[] = {kNew, kStarting, kAssigned, kBusy, kIdle, kDeleted, kDead};

// The whole table: every pair of states is either in this list or illegal.
TEST(Lifecycle, EveryTransitionIsLegalOrRefused) {
  const std::set<std::pair<SandboxLifecycle, SandboxLifecycle>> legal = {
      {kNew, kStarting},     {kStarting, kAssigned}, {kStarting, kDead}, {kAssigned, kBusy},
      {kAssigned, kDeleted}, {kAssigned, kDead},     {kBusy, kIdle},     {kBusy, kDeleted},
      {kBusy, kDead},        {kIdle, kBusy},         {kIdle, kDeleted},  {kIdle, kDead},
      {kDeleted, kStarting}, {kDead, kStarting},     {kDead, kDeleted},
  };
  for (auto from : kAll) {
    for (auto to : kAll) {
      SCOPED_TRACE(fmt::format("{} -> {}", to_string(from), to_string(to)));
      const bool expected = legal.contains({from, to});
      EXPECT_EQ(can_transition(from, to), expected);
      auto checked = check_transition(from, to);
      EXPECT_EQ(checked.has_value(), expected);
      if (!expected) {
        EXPECT_EQ(checked.error().code, ErrorCode::kFailedPrecondition);
        EXPECT_EQ(checked.error().message, fmt::format("illegal sandbox transition {} -> {}",
                                                       to_string(from), to_string(to)));
      }
    }
  }
}

TEST(Lifecycle, NamesRoundTrip) {
  for (auto state : kAll)
    EXPECT_EQ(lifecycle_from_string(to_string(state)), state);
  EXPECT_FALSE(lifecycle_from_string("hibernating"));
}

TEST(Lifecycle, OnlyAssignedBusyAndIdleHoldASandbox) {
  for (auto state : kAll) {
    EXPECT_EQ(holds_sandbox(state), state == kAssigned || state == kBusy || state == kIdle)
        << to_string(state);
  }
}

}  // namespace
}  // namespace quarry::conversation

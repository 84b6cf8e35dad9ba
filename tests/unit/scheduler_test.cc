// The sandbox scheduler (capacity/scheduler.h) against providers that keep their sandboxes in
// memory and count how many exist at once: limits, fairness, the queue's timeout, eviction and
// the warm pool, with many threads asking at the same time.
#include "capacity/scheduler.h"

#include <gtest/gtest.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <thread>

#include "counting_provider.h"

namespace quarry::capacity {
namespace {

using namespace std::chrono_literals;
using testing_support::CountingProvider;

SchedulerOptions limits(int total, int per_user, std::chrono::milliseconds timeout = 30s) {
  SchedulerOptions options;
  options.max_sandboxes = total;
  options.max_per_user = per_user;
  options.queue_timeout = timeout;
  return options;
}

Request request(std::string user, std::string conversation = "") {
  Request made;
  made.user = std::move(user);
  made.conversation_id = conversation.empty() ? fmt::format("c-{}", made.user) : conversation;
  return made;
}

// Evictions destroy the sandbox, as the ConversationManager's do, and are noted in `evicted`.
void evict_into(Scheduler& scheduler, std::vector<std::string>& evicted) {
  scheduler.set_evict([&](const std::string&, const std::string& sandbox_id) -> Result<bool> {
    evicted.push_back(sandbox_id);
    RETURN_IF_ERROR(scheduler.destroy(sandbox_id));
    return true;
  });
}

// Waits up to 5 s for `condition`.
template <typename Condition>
bool eventually(Condition condition) {
  for (int i = 0; i < 500; ++i) {
    if (condition()) return true;
    std::this_thread::sleep_for(10ms);
  }
  return condition();
}

// Places kept in memory for schedulers in one process, as PostgreSQL keeps them for servers.
class MemoryPlaces final : public SharedPlaces {
 public:
  Result<bool> take_place(const Place& place, const PlaceLimits& limits) override {
    std::lock_guard lock(mutex_);
    if (static_cast<int>(places_.size()) >= limits.max_sandboxes ||
        (!place.user.empty() && count_user(place.user) >= limits.max_per_user)) {
      return false;
    }
    places_[place.key] = place;
    return true;
  }
  Result<void> name_place(std::string_view key, std::string_view sandbox_id) override {
    std::lock_guard lock(mutex_);
    if (auto found = places_.find(std::string(key)); found != places_.end())
      found->second.sandbox_id = std::string(sandbox_id);
    return {};
  }
  Result<void> keep_place(const Place& place) override {
    std::lock_guard lock(mutex_);
    std::erase_if(places_, [&](const auto& entry) {
      return !place.sandbox_id.empty() && entry.second.sandbox_id == place.sandbox_id;
    });
    places_[place.key] = place;
    return {};
  }
  Result<bool> assign_place(std::string_view key, std::string_view user,
                            int max_per_user) override {
    std::lock_guard lock(mutex_);
    auto found = places_.find(std::string(key));
    if (found == places_.end() || count_user(std::string(user)) >= max_per_user) return false;
    found->second.user = std::string(user);
    return true;
  }
  Result<void> free_place(std::string_view key, std::string_view sandbox_id) override {
    std::lock_guard lock(mutex_);
    std::erase_if(places_, [&](const auto& entry) {
      return (!key.empty() && entry.first == key) ||
             (!sandbox_id.empty() && entry.second.sandbox_id == sandbox_id);
    });
    return {};
  }
  Result<PlacesHeld> places_held(std::string_view server) override {
    std::lock_guard lock(mutex_);
    PlacesHeld held;
    for (const auto& [key, place] : places_) {
      if (place.server == server) {
        held.own.insert(key);
        continue;
      }
      ++held.total;
      if (!place.user.empty()) ++held.by_user[place.user];
      ++held.by_account[place.account];
    }
    return held;
  }
  size_t size() {
    std::lock_guard lock(mutex_);
    return places_.size();
  }

 private:
  int count_user(const std::string& user) const {
    return static_cast<int>(std::count_if(places_.begin(), places_.end(), [&](const auto& entry) {
      return entry.second.user == user;
    }));
  }
  std::mutex mutex_;
  std::map<std::string, Place> places_;
};

TEST(Scheduler, LimitsHoldUnderConcurrentDemand) {
  // Two accounts of 3 each, 5 in total, 2 per user; 4 users ask from 24 threads at once.
  CountingProvider first("first-"), second("second-");
  std::atomic<int> together{0}, most_together{0};
  first.share(&together, &most_together);
  second.share(&together, &most_together);
  Scheduler scheduler({{"first", &first, 3}, {"second", &second, 3}}, limits(5, 2));

  std::mutex mutex;
  std::map<std::string, int> held;
  int most_per_user = 0;
  std::atomic<int> granted{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 24; ++i) {
    threads.emplace_back([&, i] {
      const std::string user = fmt::format("user{}", i % 4);
      std::mt19937 random(static_cast<unsigned>(i));
      for (int round = 0; round < 3; ++round) {
        auto grant = scheduler.acquire(request(user, fmt::format("c{}-{}", i, round)));
        ASSERT_TRUE(grant) << grant.error().message;
        {
          std::lock_guard lock(mutex);
          most_per_user = std::max(most_per_user, ++held[user]);
        }
        ++granted;
        std::this_thread::sleep_for(std::chrono::milliseconds(1 + random() % 4));
        {
          std::lock_guard lock(mutex);
          --held[user];
        }
        ASSERT_TRUE(scheduler.destroy(grant->sandbox_id));
      }
    });
  }
  for (auto& thread : threads)
    thread.join();

  EXPECT_EQ(granted.load(), 72);
  EXPECT_LE(first.most(), 3u);
  EXPECT_LE(second.most(), 3u);
  EXPECT_LE(most_together.load(), 5);
  EXPECT_EQ(most_together.load(), 5) << "the limit should have been reached, not only kept";
  EXPECT_LE(most_per_user, 2);
  EXPECT_EQ(first.existing() + second.existing(), 0u);
  auto stats = scheduler.stats();
  EXPECT_EQ(stats.cold_starts, 72u);
  EXPECT_EQ(stats.waiting, 0);
}

TEST(Scheduler, AUserWithFewerSandboxesIsServedBeforeOneWithMore) {
  CountingProvider provider;
  Scheduler scheduler({{"local", &provider, 2}}, limits(2, 4));
  // The heavy user holds both sandboxes and has five more turns waiting before the light
  // user's one arrives.
  auto one = scheduler.acquire(request("heavy", "h1"));
  auto two = scheduler.acquire(request("heavy", "h2"));
  ASSERT_TRUE(one && two);

  std::mutex mutex;
  std::vector<std::string> served;
  std::vector<std::thread> threads;
  auto wait_for_sandbox = [&](std::string user, std::string conversation) {
    auto grant = scheduler.acquire(request(user, conversation));
    ASSERT_TRUE(grant) << grant.error().message;
    {
      std::lock_guard lock(mutex);
      served.push_back(user);
    }
    std::this_thread::sleep_for(20ms);
    (void)scheduler.destroy(grant->sandbox_id);
  };
  for (int i = 0; i < 5; ++i) {
    threads.emplace_back(wait_for_sandbox, "heavy", fmt::format("h{}", i + 3));
  }
  ASSERT_TRUE(eventually([&] { return scheduler.waiting() == 5; }));
  std::atomic<int> light_position{0};
  threads.emplace_back([&] {
    Request light = request("light");
    light.on_queued = [&](const QueuePosition& place) {
      if (light_position == 0) light_position = place.position;
    };
    auto grant = scheduler.acquire(light);
    ASSERT_TRUE(grant);
    std::lock_guard lock(mutex);
    served.push_back("light");
  });
  ASSERT_TRUE(eventually([&] { return scheduler.waiting() == 6; }));
  EXPECT_EQ(light_position.load(), 1) << "the light user's turn goes to the head of the queue";

  ASSERT_TRUE(scheduler.destroy(one->sandbox_id));  // one place frees up
  ASSERT_TRUE(eventually([&] {
    std::lock_guard lock(mutex);
    return !served.empty();
  }));
  {
    std::lock_guard lock(mutex);
    EXPECT_EQ(served, std::vector<std::string>{"light"});
  }
  ASSERT_TRUE(scheduler.destroy(two->sandbox_id));
  for (auto& thread : threads)
    thread.join();
  EXPECT_EQ(served.size(), 6u);
}

TEST(Scheduler, AWaitPastTheQueueTimeoutSaysTheSystemIsBusyAndWhenToRetry) {
  CountingProvider provider;
  Scheduler scheduler({{"local", &provider, 1}}, limits(1, 1, 300ms));
  auto held = scheduler.acquire(request("someone"));
  ASSERT_TRUE(held);

  const auto started = std::chrono::steady_clock::now();
  auto refused = scheduler.acquire(request("other"));
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code, ErrorCode::kResourceExhausted);
  EXPECT_NE(refused.error().message.find("busy"), std::string::npos) << refused.error().message;
  EXPECT_NE(refused.error().message.find("capacity.queue_timeout"), std::string::npos);
  EXPECT_NE(refused.error().message.find("try again in about"), std::string::npos);
  EXPECT_GE(std::chrono::steady_clock::now() - started, 300ms);
  EXPECT_EQ(scheduler.stats().timeouts, 1u);
  EXPECT_EQ(scheduler.waiting(), 0);

  // A user at their own limit is told so.
  auto own = scheduler.acquire(request("someone", "another conversation"));
  ASSERT_FALSE(own);
  EXPECT_NE(own.error().message.find("capacity.max_per_user"), std::string::npos)
      << own.error().message;
}

TEST(Scheduler, WaitFiguresAreOfTheGrants) {
  CountingProvider provider;
  Scheduler scheduler({{"local", &provider, 1}}, limits(1, 2));
  auto first = scheduler.acquire(request("a"));  // no wait
  ASSERT_TRUE(first);
  std::thread release([&] {
    EXPECT_TRUE(eventually([&] { return scheduler.waiting() == 1; }));
    std::this_thread::sleep_for(200ms);
    (void)scheduler.destroy(first->sandbox_id);
  });
  auto second = scheduler.acquire(request("b"));  // waits at least 200 ms
  release.join();
  ASSERT_TRUE(second);
  EXPECT_GE(second->waited, 150ms);
  auto stats = scheduler.stats();
  EXPECT_LT(stats.wait_p50_ms, 100) << "of a wait of 0 and one of 200 ms, the median is 0";
  EXPECT_GE(stats.wait_p99_ms, 150);
  EXPECT_EQ(stats.cold_starts, 2u);
  EXPECT_EQ(stats.warm_starts, 0u);
}

TEST(Scheduler, AWaitEndsWhenTheTurnIsCancelled) {
  CountingProvider provider;
  Scheduler scheduler({{"local", &provider, 1}}, limits(1, 1));
  auto held = scheduler.acquire(request("someone"));
  ASSERT_TRUE(held);
  const int cancel = ::eventfd(0, EFD_CLOEXEC);
  std::thread stop([&] {
    std::this_thread::sleep_for(100ms);
    const uint64_t one = 1;
    ASSERT_EQ(::write(cancel, &one, sizeof one), 8);
  });
  Request waiting = request("other");
  waiting.cancel_fd = cancel;
  auto cancelled = scheduler.acquire(waiting);
  stop.join();
  ::close(cancel);
  ASSERT_FALSE(cancelled);
  EXPECT_EQ(cancelled.error().code, ErrorCode::kCancelled);
  EXPECT_EQ(scheduler.waiting(), 0);
}

TEST(Scheduler, EvictionTakesTheLeastRecentlyUsedIdleSandboxAndNeverABusyOne) {
  CountingProvider provider;
  Scheduler scheduler({{"local", &provider, 3}}, limits(3, 3, 500ms));
  std::vector<std::string> evicted;
  evict_into(scheduler, evicted);
  auto oldest = scheduler.acquire(request("a", "oldest"));
  auto busy = scheduler.acquire(request("b", "busy"));
  auto newer = scheduler.acquire(request("c", "newer"));
  ASSERT_TRUE(oldest && busy && newer);
  scheduler.set_busy(oldest->sandbox_id, false);
  std::this_thread::sleep_for(5ms);
  scheduler.set_busy(newer->sandbox_id, false);  // idle, but used more recently

  auto first = scheduler.acquire(request("d", "first waiter"));
  ASSERT_TRUE(first) << first.error().message;
  ASSERT_EQ(evicted, std::vector<std::string>{oldest->sandbox_id});
  auto second = scheduler.acquire(request("e", "second waiter"));
  ASSERT_TRUE(second) << second.error().message;
  ASSERT_EQ(evicted, (std::vector<std::string>{oldest->sandbox_id, newer->sandbox_id}));

  // Everything left is busy: nothing is evicted, the wait times out.
  auto third = scheduler.acquire(request("f", "third waiter"));
  ASSERT_FALSE(third);
  EXPECT_EQ(third.error().code, ErrorCode::kResourceExhausted);
  EXPECT_EQ(evicted.size(), 2u);
  EXPECT_TRUE(provider.alive(busy->sandbox_id));
  EXPECT_EQ(scheduler.stats().evictions, 2u);
}

// A held sandbox (the Daytona-compatible API's) counts against the limits, is never evicted for
// a waiting turn, and is refused at once, not queued, when there is no room.
TEST(Scheduler, AHeldSandboxCountsAgainstTheLimitsAndIsNeverEvicted) {
  CountingProvider provider;
  SchedulerOptions options = limits(2, 2, 300ms);
  options.spec.labels = {{"quarry.instance", "test"}};
  Scheduler scheduler({{"local", &provider, 2}}, options);
  std::vector<std::string> evicted;
  evict_into(scheduler, evicted);
  sandbox::SandboxSpec spec;
  spec.labels = {{"quarry.daytona.owner", "a"}};
  auto held = scheduler.hold("a", spec);
  ASSERT_TRUE(held) << held.error().message;
  EXPECT_FALSE(held->warm);
  auto second = scheduler.hold("a", spec);
  ASSERT_TRUE(second) << second.error().message;

  auto third = scheduler.hold("a", spec);
  ASSERT_FALSE(third);
  EXPECT_EQ(third.error().code, ErrorCode::kResourceExhausted);
  EXPECT_NE(third.error().message.find("capacity.max_per_user"), std::string::npos);
  // The total is reached too: a turn waits, evicts nothing (held sandboxes are busy), times out.
  auto turn = scheduler.acquire(request("b"));
  ASSERT_FALSE(turn);
  EXPECT_TRUE(evicted.empty());
  EXPECT_EQ(scheduler.stats().busy, 2);

  ASSERT_TRUE(scheduler.destroy(held->sandbox_id));
  auto after = scheduler.acquire(request("b"));
  EXPECT_TRUE(after) << after.error().message;
  EXPECT_EQ(provider.most(), 2u);
}

TEST(Scheduler, AUserAtTheirLimitMakesRoomFromTheirOwnIdleSandbox) {
  CountingProvider provider;
  Scheduler scheduler({{"local", &provider, 10}}, limits(10, 2, 500ms));
  std::vector<std::string> evicted;
  evict_into(scheduler, evicted);
  auto others = scheduler.acquire(request("other", "theirs"));
  auto mine = scheduler.acquire(request("me", "mine 1"));
  auto also_mine = scheduler.acquire(request("me", "mine 2"));
  ASSERT_TRUE(others && mine && also_mine);
  scheduler.set_busy(others->sandbox_id, false);  // the oldest idle one, but not mine
  scheduler.set_busy(mine->sandbox_id, false);
  auto third = scheduler.acquire(request("me", "mine 3"));
  ASSERT_TRUE(third) << third.error().message;
  EXPECT_EQ(evicted, std::vector<std::string>{mine->sandbox_id});
}

TEST(Scheduler, AConversationWithLessNetworkTakesAWarmPlaceButNotItsSandbox) {
  CountingProvider provider;
  SchedulerOptions options = limits(1, 1);
  options.warm_min_idle = 1;
  options.spec.network = {NetworkMode::kAllowlist, {"pypi.org", "*.pythonhosted.org"}};
  Scheduler scheduler({{"local", &provider, 1}}, options);
  scheduler.start_pool();
  ASSERT_TRUE(eventually([&] { return scheduler.stats().warm == 1; }));
  const std::string pooled = provider.ids().front();
  EXPECT_EQ(provider.network_of(pooled).allow.size(), 2u);

  // The only place is the warm sandbox's: it goes, and a sandbox with the narrower network
  // starts in its place, within the limit of one.
  Request narrowed = request("a", "conversation a");
  narrowed.network = NetworkPolicy{NetworkMode::kAllowlist, {"pypi.org"}};
  auto granted = scheduler.acquire(narrowed);
  ASSERT_TRUE(granted) << granted.error().message;
  EXPECT_FALSE(granted->warm);
  EXPECT_NE(granted->sandbox_id, pooled);
  EXPECT_EQ(provider.network_of(granted->sandbox_id).allow, std::vector<std::string>{"pypi.org"});
  const auto destroyed = provider.destroyed();
  EXPECT_NE(std::find(destroyed.begin(), destroyed.end(), pooled), destroyed.end());
  EXPECT_EQ(scheduler.stats().dead_warm, 0u) << "a warm sandbox set aside is not a dead one";
  EXPECT_LE(provider.most(), 1u);

  EXPECT_GE(scheduler.shutdown(), 0);
  ASSERT_TRUE(scheduler.destroy(granted->sandbox_id));
}

TEST(Scheduler, TheWarmPoolRefillsAfterBeingDrainedAndNeverHandsOutADeadSandbox) {
  CountingProvider provider;
  SchedulerOptions options = limits(3, 3);
  options.warm_min_idle = 2;
  Scheduler scheduler({{"local", &provider, 3}}, options);
  scheduler.start_pool();
  ASSERT_TRUE(eventually([&] { return scheduler.stats().warm == 2; }));

  // Drained: two conversations take the two warm sandboxes, the pool refills the one place
  // left (warm sandboxes count against the limit of 3).
  auto first = scheduler.acquire(request("a"));
  auto second = scheduler.acquire(request("b"));
  ASSERT_TRUE(first && second);
  EXPECT_TRUE(first->warm);
  EXPECT_TRUE(second->warm);
  ASSERT_TRUE(eventually([&] { return scheduler.stats().warm == 1; }));
  EXPECT_LE(provider.most(), 3u);
  ASSERT_TRUE(scheduler.destroy(first->sandbox_id));
  ASSERT_TRUE(scheduler.destroy(second->sandbox_id));
  ASSERT_TRUE(eventually([&] { return scheduler.stats().warm == 2; }));

  // Both warm sandboxes die in the pool: neither is handed out.
  const std::vector<std::string> pooled = provider.ids();
  ASSERT_EQ(pooled.size(), 2u);
  for (const auto& id : pooled)
    provider.kill(id);
  auto third = scheduler.acquire(request("c"));
  ASSERT_TRUE(third) << third.error().message;
  EXPECT_TRUE(provider.alive(third->sandbox_id));
  EXPECT_FALSE(third->warm);
  EXPECT_GE(scheduler.stats().dead_warm, 1u);
  const auto destroyed = provider.destroyed();
  EXPECT_NE(std::find(destroyed.begin(), destroyed.end(), pooled.front()), destroyed.end())
      << "the dead pooled sandbox is removed";
  EXPECT_LE(provider.most(), 3u);

  EXPECT_GE(scheduler.shutdown(), 0);
  ASSERT_TRUE(scheduler.destroy(third->sandbox_id));
  EXPECT_EQ(provider.existing(), 0u) << "shutdown destroys the pool";
}

// The pool's sandboxes have no extra packages: a conversation that needs some gets a start of
// its own, in the place of a warm one when that is the only room.
TEST(Scheduler, ARequestForPackagesTakesAWarmSandboxsPlace) {
  CountingProvider provider;
  SchedulerOptions options = limits(2, 2);
  options.warm_min_idle = 1;
  Scheduler scheduler({{"local", &provider, 2}}, options);
  scheduler.start_pool();
  ASSERT_TRUE(eventually([&] { return scheduler.stats().warm == 1; }));

  auto plain = scheduler.acquire(request("a"));
  ASSERT_TRUE(plain) << plain.error().message;
  EXPECT_TRUE(plain->warm);
  ASSERT_TRUE(eventually([&] { return scheduler.stats().warm == 1; }));
  std::string refilled;
  for (const auto& id : provider.ids()) {
    if (id != plain->sandbox_id) refilled = id;
  }

  auto with_packages = request("b");
  with_packages.packages = {"tabulate==0.9.0"};
  auto granted = scheduler.acquire(with_packages);
  ASSERT_TRUE(granted) << granted.error().message;
  EXPECT_FALSE(granted->warm);
  EXPECT_EQ(provider.packages(granted->sandbox_id), with_packages.packages);
  EXPECT_TRUE(provider.packages(plain->sandbox_id).empty());
  const auto destroyed = provider.destroyed();
  EXPECT_NE(std::find(destroyed.begin(), destroyed.end(), refilled), destroyed.end())
      << "the warm sandbox made room";
  EXPECT_LE(provider.most(), 2u);
  EXPECT_EQ(scheduler.stats().dead_warm, 0u) << "it was not dead";

  EXPECT_GE(scheduler.shutdown(), 0);
  ASSERT_TRUE(scheduler.destroy(plain->sandbox_id));
  ASSERT_TRUE(scheduler.destroy(granted->sandbox_id));
}

TEST(Scheduler, NewTurnsAreRefusedWhenTheQueueIsFull) {
  CountingProvider provider;
  SchedulerOptions options = limits(1, 1);
  options.max_queue = 2;
  Scheduler scheduler({{"local", &provider, 1}}, options);
  auto held = scheduler.acquire(request("someone"));
  ASSERT_TRUE(held);
  EXPECT_TRUE(scheduler.admit(1));  // one waiting for a worker: room for one more
  std::vector<std::thread> waiters;
  for (int i = 0; i < 2; ++i) {
    waiters.emplace_back([&, i] {
      auto grant = scheduler.acquire(request(fmt::format("user{}", i)));
      if (grant) (void)scheduler.destroy(grant->sandbox_id);
    });
  }
  ASSERT_TRUE(eventually([&] { return scheduler.waiting() == 2; }));
  std::chrono::seconds retry{0};
  auto refused = scheduler.admit(0, &retry);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code, ErrorCode::kResourceExhausted);
  EXPECT_NE(refused.error().message.find("capacity.max_queue"), std::string::npos);
  EXPECT_GE(retry.count(), 1);
  EXPECT_EQ(scheduler.stats().refused, 1u);
  ASSERT_TRUE(scheduler.destroy(held->sandbox_id));
  for (auto& waiter : waiters)
    waiter.join();
}

TEST(Scheduler, LimitsHoldAcrossSchedulersSharingPlaces) {
  // Two servers' schedulers, each allowed 3 in total and 2 per user, but 3 and 2 over both.
  CountingProvider here("a-"), there("b-");
  std::atomic<int> together{0}, most_together{0};
  here.share(&together, &most_together);
  there.share(&together, &most_together);
  MemoryPlaces places;
  Scheduler a({{"local", &here, 3}}, limits(3, 2)), b({{"local", &there, 3}}, limits(3, 2));
  a.share_limits(places, "a");
  b.share_limits(places, "b");

  std::mutex mutex;
  std::map<std::string, int> held;
  int most_per_user = 0;
  std::atomic<int> granted{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&, i] {
      Scheduler& scheduler = i % 2 == 0 ? a : b;
      const std::string user = fmt::format("user{}", i % 3);
      for (int round = 0; round < 2; ++round) {
        auto grant = scheduler.acquire(request(user, fmt::format("c{}-{}", i, round)));
        ASSERT_TRUE(grant) << grant.error().message;
        {
          std::lock_guard lock(mutex);
          most_per_user = std::max(most_per_user, ++held[user]);
        }
        ++granted;
        std::this_thread::sleep_for(5ms);
        {
          std::lock_guard lock(mutex);
          --held[user];
        }
        ASSERT_TRUE(scheduler.destroy(grant->sandbox_id));
      }
    });
  }
  for (auto& thread : threads)
    thread.join();

  EXPECT_EQ(granted.load(), 16);
  EXPECT_LE(most_together.load(), 3) << "the schedulers together went over the shared limit";
  EXPECT_LE(most_per_user, 2);
  EXPECT_EQ(here.existing() + there.existing(), 0u);
  EXPECT_EQ(places.size(), 0u) << "every destroyed sandbox frees its place";
}

// Shared places whose every take is refused while the look at them says nothing is held: a view
// that stays wrong.
class RefusingPlaces final : public SharedPlaces {
 public:
  Result<bool> take_place(const Place&, const PlaceLimits&) override {
    ++takes;
    return false;
  }
  Result<void> name_place(std::string_view, std::string_view) override { return {}; }
  Result<void> keep_place(const Place&) override { return {}; }
  Result<bool> assign_place(std::string_view, std::string_view, int) override { return false; }
  Result<void> free_place(std::string_view, std::string_view) override { return {}; }
  Result<PlacesHeld> places_held(std::string_view) override { return PlacesHeld{}; }
  std::atomic<int> takes{0};
};

TEST(Scheduler, AWaiterRefusedAPlaceKeepsToItsTimeoutAndItsCancel) {
  CountingProvider provider;
  RefusingPlaces places;
  Scheduler scheduler({{"local", &provider, 1}}, limits(1, 1, 300ms));
  scheduler.share_limits(places, "a");

  auto timed_out = scheduler.acquire(request("alice"));
  ASSERT_FALSE(timed_out);
  EXPECT_EQ(timed_out.error().code, ErrorCode::kResourceExhausted) << timed_out.error().message;
  // It waited between tries rather than asking the shared store as fast as it could.
  EXPECT_LT(places.takes.load(), 20);

  const int cancel = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  ASSERT_GE(cancel, 0);
  Scheduler patient({{"local", &provider, 1}}, limits(1, 1, 1h));
  patient.share_limits(places, "b");
  std::thread canceller([&] {
    std::this_thread::sleep_for(200ms);
    const uint64_t one = 1;
    ASSERT_EQ(::write(cancel, &one, sizeof one), static_cast<ssize_t>(sizeof one));
  });
  Request cancelled = request("bob");
  cancelled.cancel_fd = cancel;
  auto gave_up = patient.acquire(cancelled);
  canceller.join();
  ::close(cancel);
  ASSERT_FALSE(gave_up);
  EXPECT_EQ(gave_up.error().code, ErrorCode::kCancelled) << gave_up.error().message;
  EXPECT_EQ(provider.existing(), 0u);
}

TEST(Scheduler, APlaceThisServerLeftBehindIsFreedAndTheWaiterServed) {
  // A place of server "a" that no sandbox of it holds (its free failed, say), and room for one.
  CountingProvider provider;
  MemoryPlaces places;
  ASSERT_TRUE(places.keep_place(Place{"a/999", "a", "alice", "local", ""}));
  Scheduler scheduler({{"local", &provider, 1}}, limits(1, 1, 5s));
  scheduler.share_limits(places, "a");

  auto grant = scheduler.acquire(request("alice"));
  ASSERT_TRUE(grant) << grant.error().message;
  EXPECT_EQ(places.size(), 1u) << "the left place went, the new sandbox has its own";
  ASSERT_TRUE(scheduler.destroy(grant->sandbox_id));
  EXPECT_EQ(places.size(), 0u);
}

TEST(Scheduler, ASandboxWhoseDestroyFailedStaysCountedUntilATryAgainDestroysIt) {
  CountingProvider provider;
  MemoryPlaces places;
  Scheduler scheduler({{"local", &provider, 1}}, limits(1, 1, 200ms));
  scheduler.share_limits(places, "a");
  auto grant = scheduler.acquire(request("alice"));
  ASSERT_TRUE(grant) << grant.error().message;

  provider.fail_destroys(1);  // the remote provider does not answer: the sandbox may live on
  auto failed = scheduler.destroy(grant->sandbox_id);
  ASSERT_FALSE(failed);
  EXPECT_EQ(failed.error().code, ErrorCode::kUnavailable);
  EXPECT_EQ(provider.existing(), 1u);
  EXPECT_EQ(scheduler.stats().deleting, 1) << "still counted";
  EXPECT_EQ(places.size(), 1u) << "its place is kept";
  auto refused = scheduler.acquire(request("bob"));
  ASSERT_FALSE(refused) << "no second sandbox past max_sandboxes while the first may live";
  EXPECT_EQ(provider.most(), 1u);

  EXPECT_EQ(scheduler.retry_destroys(), 1);
  EXPECT_EQ(provider.existing(), 0u);
  EXPECT_EQ(scheduler.stats().deleting, 0);
  EXPECT_EQ(places.size(), 0u);
  auto next = scheduler.acquire(request("bob"));
  ASSERT_TRUE(next) << next.error().message;
  EXPECT_EQ(scheduler.retry_destroys(), 0) << "nothing left to try again";
}

TEST(Scheduler, AHoldIsRefusedWhenAnotherServerHoldsTheRoom) {
  CountingProvider here("a-"), there("b-");
  MemoryPlaces places;
  Scheduler a({{"local", &here, 2}}, limits(1, 1)), b({{"local", &there, 2}}, limits(1, 1));
  a.share_limits(places, "a");
  b.share_limits(places, "b");
  auto held = a.hold("alice", {});
  ASSERT_TRUE(held) << held.error().message;
  auto refused = b.hold("bob", {});
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code, ErrorCode::kResourceExhausted);
  EXPECT_NE(refused.error().message.find("servers sharing this history"), std::string::npos)
      << refused.error().message;
  EXPECT_EQ(b.stats(true).elsewhere, 1);
  ASSERT_TRUE(a.destroy(held->sandbox_id));
  EXPECT_TRUE(b.hold("bob", {}));
}

// Servers on one provider, as behind a load balancer: a conversation's sandbox made on a goes
// on in a turn on b (b adopts it). It is one sandbox to the limits, counted by b alone once a
// looks again, so the other place of the total is there for others; back on a, it is a's
// again; destroyed through a server that does not hold it, its place goes all the same.
TEST(Scheduler, ASandboxAnotherServerGoesOnWithIsCountedOnceAndFreedByEither) {
  CountingProvider shared("s-");
  MemoryPlaces places;
  Scheduler a({{"local", &shared, 2}}, limits(2, 2, 1s)),
      b({{"local", &shared, 2}}, limits(2, 2, 1s));
  a.share_limits(places, "a");
  b.share_limits(places, "b");
  auto made = a.acquire(request("alice", "moving"));
  ASSERT_TRUE(made) << made.error().message;
  a.set_busy(made->sandbox_id, false);
  b.adopt(made->sandbox_id, "alice", "moving");
  EXPECT_EQ(places.size(), 1u) << "one sandbox holds two places";
  const Stats on_a = a.stats(true), on_b = b.stats(true);
  EXPECT_EQ(on_a.idle + on_a.busy, 0) << "a still counts the sandbox b went on with";
  EXPECT_EQ(on_a.elsewhere, 1);
  EXPECT_EQ(on_b.busy, 1);
  EXPECT_EQ(on_b.elsewhere, 0);
  // Room for one more on a at once: the total of 2 is one sandbox and one free place.
  auto second = a.acquire(request("bob", "second"));
  ASSERT_TRUE(second) << second.error().message;
  ASSERT_TRUE(a.destroy(second->sandbox_id));

  // Back on a: a's again, and b no longer counts it.
  b.set_busy(made->sandbox_id, false);
  a.adopt(made->sandbox_id, "alice", "moving");
  EXPECT_EQ(places.size(), 1u);
  EXPECT_EQ(b.stats(true).idle, 0);
  EXPECT_EQ(a.stats(true).busy, 1);
  a.set_busy(made->sandbox_id, false);
  // On b again, then destroyed through a, which does not hold it: b's place goes.
  b.adopt(made->sandbox_id, "alice", "moving");
  b.set_busy(made->sandbox_id, false);
  ASSERT_TRUE(a.destroy(made->sandbox_id));
  EXPECT_EQ(places.size(), 0u) << "a destroyed sandbox kept its place on the server holding it";
  EXPECT_EQ(b.stats(true).idle, 0);
  EXPECT_EQ(shared.existing(), 0u);
}

// A turn waiting on b while a's idle sandboxes take the shared room asks the other servers
// (here: a, as a NOTIFY would reach it), and a evicts its least recently used idle one, of the
// waiting user's when that user's own limit is what stands in the way; a busy one never.
TEST(Scheduler, AWaiterAsksTheOtherServersAndTheyEvictAnIdleSandbox) {
  CountingProvider here("a-"), there("b-");
  MemoryPlaces places;
  Scheduler a({{"local", &here, 3}}, limits(3, 2, 1s)), b({{"local", &there, 3}}, limits(3, 2, 1s));
  std::vector<std::string> evicted_by_a, evicted_by_b;
  evict_into(a, evicted_by_a);
  evict_into(b, evicted_by_b);
  std::vector<std::string> asked;
  std::mutex asked_mutex;
  a.share_limits(places, "a");
  b.share_limits(places, "b", [&](const std::string& user) {
    {
      std::lock_guard lock(asked_mutex);
      asked.push_back(user);
    }
    a.evict_for_elsewhere(user);
  });
  auto busy = a.acquire(request("alice", "busy"));
  auto older = a.acquire(request("alice", "older"));
  auto newer = a.acquire(request("bob", "newer"));
  ASSERT_TRUE(busy && older && newer);
  a.set_busy(older->sandbox_id, false);
  std::this_thread::sleep_for(5ms);
  a.set_busy(newer->sandbox_id, false);

  // The total is reached: anyone's least recently used idle sandbox goes.
  auto carol = b.acquire(request("carol", "on b"));
  ASSERT_TRUE(carol) << carol.error().message;
  EXPECT_EQ(evicted_by_a, std::vector<std::string>{older->sandbox_id});
  EXPECT_EQ(asked.front(), "");
  ASSERT_TRUE(b.destroy(carol->sandbox_id));

  // Alice, at her limit of 2 with her busy one on a and one on b, asks for one of hers: none of
  // hers is idle, and bob's idle one is no help to her, so nothing goes and the wait times out.
  auto alice_on_b = b.acquire(request("alice", "alice on b"));
  ASSERT_TRUE(alice_on_b) << alice_on_b.error().message;
  auto over = b.acquire(request("alice", "alice over her limit"));
  ASSERT_FALSE(over);
  EXPECT_EQ(over.error().code, ErrorCode::kResourceExhausted);
  {
    std::lock_guard lock(asked_mutex);
    EXPECT_EQ(asked.back(), "alice");
  }
  EXPECT_EQ(evicted_by_a.size(), 1u);
  EXPECT_TRUE(here.alive(busy->sandbox_id)) << "a busy sandbox was evicted for another server";
  EXPECT_TRUE(here.alive(newer->sandbox_id)) << "another user's sandbox was evicted for alice";
  EXPECT_TRUE(evicted_by_b.empty());
}

// With three servers, a request for room is heard by both others, each with an idle sandbox to
// give: only the one that claims the request evicts (as the first DELETE of its row does), so
// one waiting turn costs one sandbox, not one on each server.
TEST(Scheduler, ARequestForRoomEvictsOnOneServerOnly) {
  CountingProvider on_a("a-"), on_b("b-"), on_c("c-");
  MemoryPlaces places;
  Scheduler a({{"local", &on_a, 2}}, limits(2, 2, 5s)), b({{"local", &on_b, 2}}, limits(2, 2, 5s)),
      c({{"local", &on_c, 2}}, limits(2, 2, 5s));
  std::vector<std::string> evicted_by_a, evicted_by_c;
  evict_into(a, evicted_by_a);
  evict_into(c, evicted_by_c);
  std::atomic<int> asked{0}, claims{0};
  a.share_limits(places, "a");
  c.share_limits(places, "c");
  b.share_limits(places, "b", [&](const std::string& user) {
    ++asked;
    // Both hear it at once; the first claim wins.
    auto claimed = std::make_shared<std::atomic<bool>>(false);
    auto claim = [claimed, &claims] {
      ++claims;
      return !claimed->exchange(true);
    };
    std::thread on_c([&] { c.evict_for_elsewhere(user, claim); });
    a.evict_for_elsewhere(user, claim);
    on_c.join();
  });
  auto alice = a.acquire(request("alice"));
  auto bob = c.acquire(request("bob"));
  ASSERT_TRUE(alice && bob);
  a.set_busy(alice->sandbox_id, false);
  c.set_busy(bob->sandbox_id, false);

  auto carol = b.acquire(request("carol"));
  ASSERT_TRUE(carol) << carol.error().message;
  EXPECT_EQ(asked, 1);
  EXPECT_EQ(claims, 2) << "each server with an idle sandbox claims the request";
  EXPECT_EQ(evicted_by_a.size() + evicted_by_c.size(), 1u)
      << "a: " << evicted_by_a.size() << ", c: " << evicted_by_c.size();
  EXPECT_NE(on_a.alive(alice->sandbox_id), on_c.alive(bob->sandbox_id));
  EXPECT_EQ(b.stats(true).elsewhere, 1);
}

}  // namespace
}  // namespace quarry::capacity

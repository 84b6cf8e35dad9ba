// Scheduler: how a limited number of sandboxes is shared. Every sandbox quarry holds is counted
// here, whatever it is doing: warm in the pool, starting, or held by a conversation (busy in a
// turn or idle between turns). A turn that needs a new sandbox asks `acquire`, which hands out a
// warm one, starts one where the limits leave room, or waits in a queue:
//
//   - limits: sandboxes in total, per user, and per provider account;
//   - order: among waiters, the user holding the fewest sandboxes goes first, then the earliest,
//     so one user's fifty conversations do not starve another user's one;
//   - eviction: while a turn waits and nothing is free, the least recently used idle sandbox is
//     deleted (through the Evict callback, which records it in its conversation); a busy one
//     never is;
//   - timeout: a wait longer than `queue_timeout` ends with kResourceExhausted, saying the system
//     is busy and when to retry.
//
// The warm pool keeps `warm_min_idle` sandboxes ready, refilled by a thread of its own while no
// turn waits; a pooled sandbox is checked alive when handed out and a dead one is never given.
//
// Servers sharing one history (share_limits) count each other's sandboxes too: each new sandbox
// first takes a place in SharedPlaces, which the limits must leave room for across every
// server, and a waiter looks at the others' places again while it waits. A waiter that only
// the others' sandboxes stand in the way of asks them for room (AskElsewhere), and one of them,
// the first to claim the request, evicts its least recently used idle sandbox
// (evict_for_elsewhere).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "capacity/shared_places.h"
#include "sandbox/provider.h"

namespace quarry::capacity {

// On sandboxes the warm pool started ("quarry.origin=pool"); the label stays when a conversation
// takes one.
inline constexpr std::string_view kOriginLabel = "quarry.origin";

// A provider account: each has a quota of its own (a remote provider may have several). Sandbox
// ids are unique across accounts.
struct Account {
  std::string name;
  sandbox::SandboxProvider* provider = nullptr;
  int max_sandboxes = 16;
};

struct SchedulerOptions {
  int max_sandboxes = 16;  // in total, over every account
  int max_per_user = 4;    // held by one user's conversations
  int max_queue = 100;     // turns waiting; more are refused (see admit)
  std::chrono::milliseconds queue_timeout = std::chrono::minutes(2);
  int warm_min_idle = 0;         // sandboxes kept ready
  sandbox::SandboxSpec spec;     // of every sandbox (labels included)
  sandbox::PrepareSpec prepare;  // made ready in every new one
};

// Where a waiting turn stands: 1 is next.
struct QueuePosition {
  int position = 0;
  int waiting = 0;
};

struct Request {
  std::string user;
  std::string conversation_id;
  sandbox::Labels labels;  // added to the spec's for a sandbox started for this request
  // Less network than the spec's (the conversation narrowed it): such a request never gets a
  // warm sandbox, which has the spec's; it takes a warm one's place and starts its own.
  std::optional<NetworkPolicy> network;
  // Extra Python packages the sandbox must have (SandboxSpec::packages): a warm sandbox has
  // none, so such a request takes a warm one's place for a start of its own.
  std::vector<std::string> packages;
  int cancel_fd = -1;  // readable: stop waiting, or creating the sandbox (kCancelled)
  // Told, on the acquiring thread, when the request starts waiting and when its place changes.
  std::function<void(const QueuePosition&)> on_queued;
};

struct Grant {
  std::string sandbox_id;
  std::string account;
  bool warm = false;                      // from the pool: no start on this turn's time
  std::chrono::microseconds waited{0};    // in the queue
  std::chrono::microseconds acquired{0};  // after the queue: the handout, or create + prepare
};

// Deletes the idle sandbox `sandbox_id` of a conversation to make room and records why. Returns
// false when it could not, because a turn took the sandbox meanwhile.
using Evict =
    std::function<Result<bool>(const std::string& conversation_id, const std::string& sandbox_id)>;

// Asks the other servers sharing the limits to evict an idle sandbox: one of `user`'s when that
// user's own limit is what stands in the way, anyone's for "".
using AskElsewhere = std::function<void(const std::string& user)>;

struct Stats {
  SchedulerOptions limits;
  struct AccountUse {
    std::string name;
    int max_sandboxes = 0;
    int in_use = 0;
  };
  std::vector<AccountUse> accounts;
  int warm = 0, starting = 0, busy = 0, idle = 0, deleting = 0;  // every sandbox counted
  int elsewhere = 0;  // held by the other servers sharing the limits (share_limits)
  int waiting = 0;
  double longest_wait_ms = 0;  // of the turns waiting now
  uint64_t cold_starts = 0, warm_starts = 0, evictions = 0, timeouts = 0, refused = 0;
  uint64_t dead_warm = 0;  // pooled sandboxes found dead and never handed out
  // Over the last grants (up to 1000): time in the queue, and the acquire after it.
  double wait_p50_ms = 0, wait_p99_ms = 0;
  double cold_p50_ms = 0, warm_p50_ms = 0;
};

class Scheduler {
 public:
  Scheduler(std::vector<Account> accounts, SchedulerOptions options);
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Who deletes idle sandboxes for room (the ConversationManager). Without it nothing is evicted.
  void set_evict(Evict evict);
  // Starts the warm pool's thread (when warm_min_idle > 0).
  void start_pool();

  // A sandbox for `request`'s conversation: warm, newly started, or after a wait.
  // kResourceExhausted after queue_timeout, kCancelled when cancel_fd becomes readable, or the
  // provider's error.
  Result<Grant> acquire(const Request& request);

  // A sandbox held for `user` outside any conversation (the Daytona-compatible API): made now
  // from `spec` with the options' labels and prepare added, counted against every limit like a
  // conversation's and busy until destroy(): never evicted, never a warm one. It does not wait:
  // kResourceExhausted at once when the limits leave no room (or turns wait for one), saying
  // which limit; else the provider's error.
  Result<Grant> hold(const std::string& user, sandbox::SandboxSpec spec);

  // A new turn asks whether it may wait at all: kResourceExhausted (HTTP 429) when `also_waiting`
  // (turns queued before this scheduler, e.g. for a worker) and the turns waiting here reach
  // max_queue. `retry_after` is a guess at when to try again.
  Result<void> admit(int also_waiting, std::chrono::seconds* retry_after = nullptr);

  // A conversation's sandbox that this scheduler did not hand out (an earlier process made it,
  // or another server that went on with the conversation) is counted from now on, busy; with
  // shared limits, its place is this server's from now on (the one another server held for it
  // goes).
  void adopt(std::string_view sandbox_id, std::string_view user, std::string_view conversation_id,
             std::string_view account = {});
  // A held sandbox is in a turn, or idle since now (the least recently used is evicted first).
  void set_busy(std::string_view sandbox_id, bool busy);
  // Destroys a sandbox through its account and frees its place. kNotFound when the provider
  // does not know it (its place is freed all the same). Any other failure leaves it counted
  // (deleting) until retry_destroys gets it.
  Result<void> destroy(std::string_view sandbox_id);
  // Destroys again the sandboxes whose destroy failed (the reaper calls it). How many went.
  int retry_destroys();

  // A guess at when a refused or timed-out turn might succeed: the median recent wait, 1-60 s.
  std::chrono::seconds retry_after() const;
  int waiting() const;
  // `look_elsewhere`: the other servers' sandboxes (share_limits) read now, not as last seen.
  Stats stats(bool look_elsewhere = false);

  // Counts the sandboxes of every server on `places` from now on, this one's as `server` (its
  // boot id): before start_pool and the first acquire. The first waiter in line that no
  // eviction here can help, while the others hold places, calls `ask` (at most once a second).
  void share_limits(SharedPlaces& places, std::string server, AskElsewhere ask = {});
  // Another server's waiter needs room (its AskElsewhere): evicts this server's least recently
  // used idle sandbox (of `user`, unless empty), recorded as any eviction. Whether it did.
  // `claim`, when given, is asked first if there is such a sandbox, without the lock: false when
  // another server answers the request (nothing is evicted here).
  bool evict_for_elsewhere(const std::string& user, const std::function<bool()>& claim = {});

  // Stops the pool and destroys its warm sandboxes. Returns how many.
  int shutdown();

 private:
  enum class Use { kStarting, kWarm, kBusy, kIdle, kEnding };  // Stats counts them in this order
  struct Lease {
    std::string sandbox_id;  // empty while starting
    size_t account = 0;
    Use use = Use::kStarting;
    std::string user;  // empty for the pool's
    std::string conversation_id;
    std::chrono::steady_clock::time_point idle_since;
    std::chrono::steady_clock::time_point skip_until;  // an eviction failed: not again before
    bool placed = false;                               // holds a place in the shared places
    bool undestroyed = false;  // a destroy failed: it may live on, and is tried again
  };
  struct Waiter {
    uint64_t seq = 0;
    std::string user;
    std::chrono::steady_clock::time_point since;
  };
  using LeaseMap = std::map<uint64_t, Lease>;

  // Waiters in the order they are served: fewest sandboxes held by their user, then earliest.
  std::vector<const Waiter*> order() const;
  int held_by(const std::string& user) const;
  bool user_has_room(const std::string& user) const;
  // The account with most room, or -1 when no account (or the total) has room.
  int account_with_room() const;
  bool has_warm() const;
  bool grantable(const Waiter& waiter) const;
  // The idle sandbox whose deletion would let `waiter` go: its user's least recently used when
  // the user is at max_per_user, otherwise anyone's. end() for none.
  LeaseMap::iterator eviction_for(const Waiter& waiter);
  // The least recently used idle sandbox of a conversation (of `user`, when given) not skipped.
  LeaseMap::iterator least_recently_idle(const std::string* user);
  LeaseMap::iterator find(std::string_view sandbox_id);

  using Lock = std::unique_lock<std::mutex>;
  // Why a waiter may wait no longer (shutdown, cancel, its deadline), if it may not.
  Result<void> may_wait(const Request& request, std::chrono::steady_clock::time_point deadline);
  // In the queue until `me` is the first waiter that can be served (or the wait ends: shutdown,
  // timeout, cancel). Reports the place and makes room by eviction meanwhile.
  Result<void> wait_turn(Lock& lock, const Request& request, uint64_t me,
                         std::chrono::steady_clock::time_point deadline);
  // Evicts an idle sandbox if that would help the first waiter it can help and that is `me`.
  // Returns whether it tried.
  bool evict_for(Lock& lock, const std::vector<const Waiter*>& ordered, uint64_t me);
  // Evicts `victim` through evict_ (unlocked meanwhile). Whether it was deleted.
  bool evict(Lock& lock, LeaseMap::iterator victim);
  // Asks the other servers for room if `me` is the first in line and only their sandboxes stand
  // in its way. Returns whether it asked.
  bool ask_elsewhere_for(Lock& lock, const std::vector<const Waiter*>& ordered, uint64_t me);
  // The error of a wait past queue_timeout: the user's own limit, or the system's.
  Error timed_out(const std::string& user) const;
  // The sandbox a request starts: the options' spec with the request's labels added, its
  // network where it narrows the spec's, its packages after the spec's, and its cancel fd.
  sandbox::SandboxSpec spec_for(const Request& request) const;
  // Creates and prepares the sandbox of the starting lease `key` (unlocked meanwhile); the lease
  // is dropped if that fails.
  Result<void> fill(Lock& lock, uint64_t key, const sandbox::SandboxSpec& spec);
  // Creates and prepares a sandbox of `spec` in `account` (without the lock); one that could not
  // be prepared is destroyed.
  Result<std::string> create_prepared(size_t account, const sandbox::SandboxSpec& spec);
  // Takes the pool's sandboxes (those among `only`, if given) out of it, as being deleted;
  // returns their ids for destroy().
  std::vector<std::string> withdraw_warm(
      const std::optional<std::vector<std::string>>& only = std::nullopt);
  void record_grant(const Grant& grant);
  void pool_loop();

  // The shared places of lease `key` (unlocked meanwhile). Without sharing there is always room.
  std::string place_key(uint64_t key) const;
  Result<bool> take_place(Lock& lock, uint64_t key, const std::string& user, size_t account);
  Result<bool> assign_place(Lock& lock, uint64_t key, const std::string& user);
  // Records which sandbox the place of lease `key` is for, once it exists.
  void name_place(Lock& lock, uint64_t key, const std::string& sandbox_id);
  // Frees the place of lease `key` (if given) and any server's place of `sandbox_id` (if not
  // empty).
  void free_place(Lock& lock, std::optional<uint64_t> key, std::string_view sandbox_id);
  // Looks at the other servers' places again if the last look is older than `age`; an idle
  // sandbox whose place another server took (or freed) is no longer counted here.
  void look_elsewhere(Lock& lock, std::chrono::milliseconds age);

  std::vector<Account> accounts_;
  SchedulerOptions options_;
  Evict evict_;

  mutable std::mutex mutex_;
  std::condition_variable changed_;
  LeaseMap leases_;
  uint64_t next_lease_ = 1;
  std::deque<Waiter> waiters_;  // by arrival
  uint64_t next_waiter_ = 1;
  bool evicting_ = false;
  bool stopping_ = false;
  std::thread pool_;

  uint64_t cold_starts_ = 0, warm_starts_ = 0, evictions_ = 0, timeouts_ = 0, refused_ = 0;
  uint64_t dead_warm_ = 0;
  std::deque<double> waits_ms_, cold_ms_, warm_ms_;  // the last 1000 of each

  SharedPlaces* shared_ = nullptr;
  std::string server_;
  PlacesHeld elsewhere_;  // by the last look
  std::chrono::steady_clock::time_point looked_elsewhere_;
  AskElsewhere ask_elsewhere_;
  std::chrono::steady_clock::time_point asked_elsewhere_;
};

}  // namespace quarry::capacity

#include "capacity/scheduler.h"

#include <poll.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <set>

#include "common/units.h"

namespace quarry::capacity {
namespace {

using SteadyClock = std::chrono::steady_clock;

constexpr size_t kKeptSamples = 1000;
// How often a waiter looks at its cancel descriptor and the pool at its sandboxes' health.
constexpr auto kWaitSlice = std::chrono::milliseconds(100);
constexpr auto kPoolSweep = std::chrono::seconds(10);
constexpr auto kPoolBackoff = std::chrono::seconds(5);
constexpr auto kEvictionRetry = std::chrono::milliseconds(250);
constexpr auto kPositionInterval = std::chrono::seconds(1);
// How stale a waiter's view of the other servers' places may be: a place freed elsewhere is
// seen within it.
constexpr auto kElsewhereInterval = std::chrono::milliseconds(500);
// How often a waiter asks the other servers for room.
constexpr auto kAskInterval = std::chrono::seconds(1);

double ms(SteadyClock::duration duration) {
  return std::chrono::duration<double, std::milli>(duration).count();
}

void keep(std::deque<double>& samples, double value) {
  samples.push_back(value);
  if (samples.size() > kKeptSamples) samples.pop_front();
}

// Nearest rank: the smallest sample with at least `fraction` of them at or below it (of 0 and
// 5000, the median is 0).
double percentile(const std::deque<double>& samples, double fraction) {
  if (samples.empty()) return 0;
  std::vector<double> sorted(samples.begin(), samples.end());
  std::sort(sorted.begin(), sorted.end());
  const auto rank = static_cast<size_t>(std::ceil(fraction * static_cast<double>(sorted.size())));
  return sorted[std::clamp<size_t>(rank, 1, sorted.size()) - 1];
}

bool readable(int fd) {
  if (fd < 0) return false;
  pollfd entry{fd, POLLIN, 0};
  return ::poll(&entry, 1, 0) > 0;
}

}  // namespace

Scheduler::Scheduler(std::vector<Account> accounts, SchedulerOptions options)
    : accounts_(std::move(accounts)), options_(std::move(options)) {}

Scheduler::~Scheduler() {
  shutdown();
}

void Scheduler::set_evict(Evict evict) {
  std::lock_guard lock(mutex_);
  evict_ = std::move(evict);
}

void Scheduler::start_pool() {
  std::lock_guard lock(mutex_);
  if (options_.warm_min_idle > 0 && !pool_.joinable() && !stopping_) {
    pool_ = std::thread([this] { pool_loop(); });
  }
}

int Scheduler::held_by(const std::string& user) const {
  const auto here = std::count_if(leases_.begin(), leases_.end(),
                                  [&](const auto& entry) { return entry.second.user == user; });
  const auto elsewhere = elsewhere_.by_user.find(user);
  return static_cast<int>(here) + (elsewhere == elsewhere_.by_user.end() ? 0 : elsewhere->second);
}

bool Scheduler::user_has_room(const std::string& user) const {
  return held_by(user) < options_.max_per_user;
}

int Scheduler::account_with_room() const {
  if (static_cast<int>(leases_.size()) + elsewhere_.total >= options_.max_sandboxes) return -1;
  std::vector<int> used(accounts_.size(), 0);
  for (const auto& [key, lease] : leases_)
    ++used[lease.account];
  for (size_t i = 0; i < accounts_.size(); ++i) {
    auto elsewhere = elsewhere_.by_account.find(accounts_[i].name);
    if (elsewhere != elsewhere_.by_account.end()) used[i] += elsewhere->second;
  }
  int best = -1;
  int best_room = 0;
  for (size_t i = 0; i < accounts_.size(); ++i) {
    const int room = accounts_[i].max_sandboxes - used[i];
    if (room > best_room) {
      best = static_cast<int>(i);
      best_room = room;
    }
  }
  return best;
}

bool Scheduler::has_warm() const {
  return std::any_of(leases_.begin(), leases_.end(),
                     [](const auto& entry) { return entry.second.use == Use::kWarm; });
}

bool Scheduler::grantable(const Waiter& waiter) const {
  return user_has_room(waiter.user) && (has_warm() || account_with_room() >= 0);
}

std::vector<const Scheduler::Waiter*> Scheduler::order() const {
  std::map<std::string, int> held;
  for (const auto& waiter : waiters_)
    held.emplace(waiter.user, held_by(waiter.user));
  std::vector<const Waiter*> ordered;
  for (const auto& waiter : waiters_)
    ordered.push_back(&waiter);
  std::stable_sort(ordered.begin(), ordered.end(), [&](const Waiter* a, const Waiter* b) {
    return held[a->user] < held[b->user];  // arrival order within the same count
  });
  return ordered;
}

Scheduler::LeaseMap::iterator Scheduler::eviction_for(const Waiter& waiter) {
  return least_recently_idle(user_has_room(waiter.user) ? nullptr : &waiter.user);
}

Scheduler::LeaseMap::iterator Scheduler::least_recently_idle(const std::string* user) {
  const auto now = SteadyClock::now();
  auto victim = leases_.end();
  for (auto it = leases_.begin(); it != leases_.end(); ++it) {
    const Lease& lease = it->second;
    if (lease.use != Use::kIdle || lease.conversation_id.empty() || lease.skip_until > now)
      continue;
    if (user && lease.user != *user) continue;
    if (victim == leases_.end() || lease.idle_since < victim->second.idle_since) victim = it;
  }
  return victim;
}

Scheduler::LeaseMap::iterator Scheduler::find(std::string_view sandbox_id) {
  return std::find_if(leases_.begin(), leases_.end(),
                      [&](const auto& entry) { return entry.second.sandbox_id == sandbox_id; });
}

sandbox::SandboxSpec Scheduler::spec_for(const Request& request) const {
  sandbox::SandboxSpec spec = options_.spec;
  spec.cancel_fd = request.cancel_fd;
  if (request.network) spec.network = *request.network;
  for (const auto& [key, value] : request.labels)
    spec.labels[key] = value;
  spec.packages.insert(spec.packages.end(), request.packages.begin(), request.packages.end());
  return spec;
}

Result<std::string> Scheduler::create_prepared(size_t account, const sandbox::SandboxSpec& spec) {
  sandbox::SandboxProvider& provider = *accounts_[account].provider;
  ASSIGN_OR_RETURN(auto created, provider.create(spec));
  if (auto prepared = provider.prepare(created.id, options_.prepare); !prepared) {
    (void)provider.destroy(created.id);
    return std::unexpected(prepared.error().with_context("preparing a sandbox"));
  }
  return created.id;
}

void Scheduler::record_grant(const Grant& grant) {
  keep(waits_ms_, std::chrono::duration<double, std::milli>(grant.waited).count());
  keep(grant.warm ? warm_ms_ : cold_ms_,
       std::chrono::duration<double, std::milli>(grant.acquired).count());
  ++(grant.warm ? warm_starts_ : cold_starts_);
}

Result<Grant> Scheduler::acquire(const Request& request) {
  const auto since = SteadyClock::now();
  Lock lock(mutex_);
  const uint64_t me = next_waiter_++;
  waiters_.push_back({me, request.user, since});
  auto leave_queue = [&] {
    std::erase_if(waiters_, [&](const Waiter& waiter) { return waiter.seq == me; });
    changed_.notify_all();
  };
  // Served: a warm sandbox if the pool has one, else a new one in a lease of its own. With
  // shared limits it needs a place too; another server may have taken the last meanwhile, and
  // then this waits again, in the same place in the queue.
  uint64_t key = 0;
  bool from_pool = false;
  const auto deadline = since + options_.queue_timeout;
  for (;;) {
    if (auto waited = wait_turn(lock, request, me, deadline); !waited) {
      leave_queue();
      return std::unexpected(waited.error());
    }
    auto warm = std::find_if(leases_.begin(), leases_.end(),
                             [](const auto& entry) { return entry.second.use == Use::kWarm; });
    from_pool = warm != leases_.end();
    if (from_pool) {
      key = warm->first;
      Lease& lease = warm->second;
      lease.use = Use::kStarting;
      lease.user = request.user;
      lease.conversation_id = request.conversation_id;
    } else {
      key = next_lease_++;
      Lease lease;
      lease.account = static_cast<size_t>(std::max(account_with_room(), 0));
      lease.user = request.user;
      lease.conversation_id = request.conversation_id;
      leases_.emplace(key, std::move(lease));
    }
    auto placed = from_pool && leases_.at(key).placed
                      ? assign_place(lock, key, request.user)
                      : take_place(lock, key, request.user, leases_.at(key).account);
    if (placed && *placed) break;
    if (from_pool) {
      Lease& lease = leases_.at(key);
      lease.use = Use::kWarm;
      lease.user.clear();
      lease.conversation_id.clear();
    } else {
      leases_.erase(key);
    }
    if (!placed) {
      leave_queue();
      return std::unexpected(placed.error());
    }
    // Refused though the view here had room: another server took the last place, or the view
    // is wrong. Look again, and wait a slice before trying, so a view that stays wrong makes
    // this wait (to its timeout or cancel), not spin on the shared store.
    look_elsewhere(lock, std::chrono::milliseconds(0));
    if (auto may = may_wait(request, deadline); !may) {
      leave_queue();
      return std::unexpected(may.error());
    }
    changed_.wait_until(lock, std::min(deadline, SteadyClock::now() + kWaitSlice));
  }
  leave_queue();

  const auto served = SteadyClock::now();
  Grant grant;
  grant.waited = std::chrono::duration_cast<std::chrono::microseconds>(served - since);
  auto handed_out = [&](uint64_t key, bool warm) {
    Lease& mine = leases_.at(key);
    mine.use = Use::kBusy;
    grant.sandbox_id = mine.sandbox_id;
    grant.account = accounts_[mine.account].name;
    grant.warm = warm;
    grant.acquired =
        std::chrono::duration_cast<std::chrono::microseconds>(SteadyClock::now() - served);
    record_grant(grant);
    return grant;
  };
  if (from_pool) {
    Lease& lease = leases_.at(key);
    const std::string id = lease.sandbox_id;
    sandbox::SandboxProvider& provider = *accounts_[lease.account].provider;
    lock.unlock();
    // A warm sandbox has the spec's network and no extra packages: a request that narrows the
    // one or asks for the other takes its place, which is destroyed, for a start of its own.
    const bool fits = !request.network && request.packages.empty();
    auto alive = fits ? provider.is_alive(id) : Result<bool>(false);
    const bool live = alive && *alive;
    if (!live) {
      // Died in the pool: never handed out. Its place becomes this request's cold start.
      if (fits) spdlog::warn("warm sandbox {} was found dead in the pool; starting another", id);
      (void)provider.destroy(id);
    }
    lock.lock();
    if (live) return handed_out(key, true);
    if (fits) ++dead_warm_;
    leases_.at(key).sandbox_id.clear();
  }
  RETURN_IF_ERROR(fill(lock, key, spec_for(request)));
  return handed_out(key, false);
}

Result<Grant> Scheduler::hold(const std::string& user, sandbox::SandboxSpec spec) {
  const auto since = SteadyClock::now();
  Lock lock(mutex_);
  // It does not wait, so what the other servers hold is read now, not as last seen.
  look_elsewhere(lock, std::chrono::milliseconds(0));
  if (stopping_) {
    return make_error(ErrorCode::kUnavailable,
                      "the server is shutting down and starts no more sandboxes");
  }
  const std::string_view where = shared_ ? " on the servers sharing this history" : "";
  auto refusal = [&]() -> Result<Grant> {
    if (!user_has_room(user)) {
      return make_error(ErrorCode::kResourceExhausted,
                        "you already hold {} sandboxes{}, the most one user may have "
                        "(capacity.max_per_user); delete one first",
                        options_.max_per_user, where);
    }
    return make_error(ErrorCode::kResourceExhausted,
                      "the system is busy: all {} sandboxes (capacity.max_sandboxes) are in "
                      "use{}{}; try again in about {} s",
                      options_.max_sandboxes, where,
                      waiters_.empty() ? "" : " and turns are waiting for one",
                      retry_after().count());
  };
  const int account = waiters_.empty() ? account_with_room() : -1;
  if (!user_has_room(user) || account < 0) return refusal();
  const uint64_t key = next_lease_++;
  Lease lease;
  lease.account = static_cast<size_t>(account);
  lease.user = user;
  leases_.emplace(key, std::move(lease));
  // Another server may have taken the room since the look.
  auto placed = take_place(lock, key, user, static_cast<size_t>(account));
  if (!placed || !*placed) {
    leases_.erase(key);
    changed_.notify_all();
    if (!placed) return std::unexpected(placed.error());
    look_elsewhere(lock, std::chrono::milliseconds(0));
    return refusal();
  }
  lock.unlock();
  for (const auto& [name, value] : options_.spec.labels)
    spec.labels.emplace(name, value);
  auto made = create_prepared(static_cast<size_t>(account), spec);
  lock.lock();
  if (!made) {
    leases_.erase(key);
    changed_.notify_all();
    free_place(lock, key, "");
    return std::unexpected(made.error());
  }
  Lease& held = leases_.at(key);
  held.sandbox_id = *made;
  held.use = Use::kBusy;
  name_place(lock, key, *made);
  Grant grant;
  grant.sandbox_id = *made;
  grant.account = accounts_[held.account].name;
  grant.acquired =
      std::chrono::duration_cast<std::chrono::microseconds>(SteadyClock::now() - since);
  record_grant(grant);
  return grant;
}

Result<void> Scheduler::may_wait(const Request& request,
                                 std::chrono::steady_clock::time_point deadline) {
  if (stopping_) {
    return make_error(ErrorCode::kUnavailable,
                      "the server is shutting down and starts no more sandboxes; send it again "
                      "to the server when it is back");
  }
  if (readable(request.cancel_fd)) {
    return make_error(ErrorCode::kCancelled, "cancelled while waiting for a sandbox");
  }
  if (SteadyClock::now() >= deadline) {
    ++timeouts_;
    return std::unexpected(timed_out(request.user));
  }
  return {};
}

Result<void> Scheduler::wait_turn(Lock& lock, const Request& request, uint64_t me,
                                  std::chrono::steady_clock::time_point deadline) {
  QueuePosition told;
  SteadyClock::time_point told_at;
  for (;;) {
    // Checked first: a turn cancelled or out of time neither evicts nor starts a sandbox.
    RETURN_IF_ERROR(may_wait(request, deadline));
    const auto ordered = order();
    const auto first = std::find_if(ordered.begin(), ordered.end(),
                                    [&](const Waiter* waiter) { return grantable(*waiter); });
    if (first != ordered.end() && (*first)->seq == me) return {};

    const int position =
        static_cast<int>(std::find_if(ordered.begin(), ordered.end(),
                                      [&](const Waiter* waiter) { return waiter->seq == me; }) -
                         ordered.begin() + 1);
    const auto now = SteadyClock::now();
    if (request.on_queued && position != told.position &&
        (told.position == 0 || position == 1 || now - told_at >= kPositionInterval)) {
      told = {position, static_cast<int>(ordered.size())};
      told_at = now;
      lock.unlock();
      request.on_queued(told);
      lock.lock();
      continue;  // things may have moved meanwhile
    }
    if (evict_for(lock, ordered, me)) continue;  // look again before waiting
    if (ask_elsewhere_for(lock, ordered, me)) continue;
    if (shared_ && SteadyClock::now() - looked_elsewhere_ >= kElsewhereInterval) {
      look_elsewhere(lock, kElsewhereInterval);  // another server may have freed a place
      continue;
    }
    changed_.wait_until(lock, std::min(deadline, SteadyClock::now() + kWaitSlice));
  }
}

bool Scheduler::evict_for(Lock& lock, const std::vector<const Waiter*>& ordered, uint64_t me) {
  if (!evict_ || evicting_) return false;
  // The first waiter an eviction would help does it, one eviction at a time.
  const auto helped = std::find_if(ordered.begin(), ordered.end(), [&](const Waiter* waiter) {
    return !grantable(*waiter) && eviction_for(*waiter) != leases_.end();
  });
  if (helped == ordered.end() || (*helped)->seq != me) return false;
  evict(lock, eviction_for(**helped));
  return true;
}

bool Scheduler::evict(Lock& lock, LeaseMap::iterator victim) {
  const std::string conversation = victim->second.conversation_id;
  const std::string sandbox_id = victim->second.sandbox_id;
  evicting_ = true;
  lock.unlock();
  auto evicted = evict_(conversation, sandbox_id);
  lock.lock();
  evicting_ = false;
  const bool done = evicted && *evicted;
  if (done) {
    ++evictions_;
  } else {
    if (!evicted) {
      spdlog::warn("could not evict sandbox {} of conversation {}: {}", sandbox_id, conversation,
                   evicted.error().message);
    }
    if (auto still = find(sandbox_id); still != leases_.end()) {
      still->second.skip_until = SteadyClock::now() + kEvictionRetry;
    }
  }
  changed_.notify_all();
  return done;
}

bool Scheduler::ask_elsewhere_for(Lock& lock, const std::vector<const Waiter*>& ordered,
                                  uint64_t me) {
  if (!shared_ || !ask_elsewhere_ || ordered.empty() || ordered.front()->seq != me) return false;
  const auto now = SteadyClock::now();
  const Waiter& waiter = *ordered.front();
  if (now - asked_elsewhere_ < kAskInterval || grantable(waiter) ||
      eviction_for(waiter) != leases_.end()) {
    return false;
  }
  // Only what the others hold can make room: the user's own, when that limit is the one reached.
  const bool own = !user_has_room(waiter.user);
  const auto theirs = elsewhere_.by_user.find(waiter.user);
  if (own ? theirs == elsewhere_.by_user.end() || theirs->second == 0 : elsewhere_.total == 0) {
    return false;
  }
  asked_elsewhere_ = now;
  const std::string user = own ? waiter.user : "";
  const AskElsewhere ask = ask_elsewhere_;
  lock.unlock();
  ask(user);
  lock.lock();
  // Look at their places again soon: a place freed there is taken here.
  looked_elsewhere_ = now - kElsewhereInterval + kWaitSlice;
  return true;
}

bool Scheduler::evict_for_elsewhere(const std::string& user, const std::function<bool()>& claim) {
  const std::string* of = user.empty() ? nullptr : &user;
  Lock lock(mutex_);
  if (!evict_ || evicting_ || stopping_ || least_recently_idle(of) == leases_.end()) return false;
  if (claim) {
    // Unlocked, as an eviction in progress: no other starts meanwhile. The victim is chosen
    // after it, as a turn may have taken this one.
    evicting_ = true;
    lock.unlock();
    const bool mine = claim();
    lock.lock();
    evicting_ = false;
    changed_.notify_all();
    if (!mine || stopping_) return false;
  }
  auto victim = least_recently_idle(of);
  if (victim == leases_.end()) return false;
  return evict(lock, victim);
}

Error Scheduler::timed_out(const std::string& user) const {
  if (!user_has_room(user)) {
    return Error{ErrorCode::kResourceExhausted,
                 fmt::format("your conversations already hold {} sandboxes, the most one user may "
                             "have (capacity.max_per_user), and all of them stayed in use for {} "
                             "(capacity.queue_timeout); try again when one of your other turns "
                             "has ended",
                             options_.max_per_user, format_duration(options_.queue_timeout))};
  }
  return Error{
      ErrorCode::kResourceExhausted,
      fmt::format("the system is busy: all {} sandboxes (capacity.max_sandboxes) stayed "
                  "in use{} while this turn waited {} (capacity.queue_timeout); try "
                  "again in about {} s",
                  options_.max_sandboxes, shared_ ? " on the servers sharing this history" : "",
                  format_duration(options_.queue_timeout), retry_after().count())};
}

Result<void> Scheduler::fill(Lock& lock, uint64_t key, const sandbox::SandboxSpec& spec) {
  const size_t account = leases_.at(key).account;
  lock.unlock();
  auto started = create_prepared(account, spec);
  lock.lock();
  if (!started) {
    const bool placed = leases_.at(key).placed;
    leases_.erase(key);
    changed_.notify_all();
    if (placed) free_place(lock, key, "");
    return std::unexpected(started.error());
  }
  leases_.at(key).sandbox_id = *started;
  name_place(lock, key, *started);
  return {};
}

Result<void> Scheduler::admit(int also_waiting, std::chrono::seconds* retry_after_out) {
  std::lock_guard lock(mutex_);
  const int waiting = also_waiting + static_cast<int>(waiters_.size());
  if (waiting < options_.max_queue) return {};
  ++refused_;
  const auto retry = retry_after();
  if (retry_after_out) *retry_after_out = retry;
  return make_error(ErrorCode::kResourceExhausted,
                    "the system is busy: {} turns are already waiting for a sandbox "
                    "(capacity.max_queue); try again in about {} s",
                    waiting, retry.count());
}

void Scheduler::adopt(std::string_view sandbox_id, std::string_view user,
                      std::string_view conversation_id, std::string_view account) {
  Lock lock(mutex_);
  uint64_t key = 0;
  if (auto known = find(sandbox_id); known != leases_.end()) {
    known->second.use = Use::kBusy;
    key = known->first;
  } else {
    Lease lease;
    lease.sandbox_id = std::string(sandbox_id);
    lease.use = Use::kBusy;
    lease.user = std::string(user);
    lease.conversation_id = std::string(conversation_id);
    for (size_t i = 0; i < accounts_.size(); ++i) {
      if (accounts_[i].name == account) lease.account = i;
    }
    key = next_lease_++;
    leases_.emplace(key, std::move(lease));
  }
  if (!shared_) return;
  // It exists already, whatever the limits say now: counted, here, so the others see it. Known
  // here or not, another server may have gone on with it since (its conversation's turns went
  // there): the place comes back here, as one place.
  SharedPlaces* shared = shared_;
  const Lease& lease = leases_.at(key);
  const Place place{place_key(key), server_, lease.user, accounts_[lease.account].name,
                    std::string(sandbox_id)};
  lock.unlock();
  auto kept = shared->keep_place(place);
  lock.lock();
  if (!kept) {
    spdlog::warn("sandbox {} is not counted by the other servers: {}", sandbox_id,
                 kept.error().message);
  } else if (auto still = leases_.find(key); still != leases_.end()) {
    still->second.placed = true;
  } else {
    free_place(lock, key, "");  // destroyed meanwhile
  }
}

void Scheduler::set_busy(std::string_view sandbox_id, bool busy) {
  std::lock_guard lock(mutex_);
  auto lease = find(sandbox_id);
  if (lease == leases_.end()) return;
  lease->second.use = busy ? Use::kBusy : Use::kIdle;
  if (!busy) {
    lease->second.idle_since = SteadyClock::now();
    changed_.notify_all();  // a waiter may evict it now
  }
}

Result<void> Scheduler::destroy(std::string_view sandbox_id) {
  std::unique_lock lock(mutex_);
  auto lease = find(sandbox_id);
  const size_t account = lease == leases_.end() ? 0 : lease->second.account;
  // Counted until it is gone, so a new one never overlaps it beyond the limits.
  if (lease != leases_.end()) lease->second.use = Use::kEnding;
  lock.unlock();
  Result<void> destroyed = make_error(ErrorCode::kNotFound, "no sandbox {}", sandbox_id);
  if (lease != leases_.end() || accounts_.size() == 1) {
    destroyed = accounts_[account].provider->destroy(sandbox_id);
  } else {
    // Not handed out by this scheduler: whichever account knows it.
    for (const auto& candidate : accounts_) {
      destroyed = candidate.provider->destroy(sandbox_id);
      if (destroyed || destroyed.error().code != ErrorCode::kNotFound) break;
    }
  }
  lock.lock();
  auto gone = find(sandbox_id);
  if (gone != leases_.end() && !destroyed && destroyed.error().code != ErrorCode::kNotFound) {
    // It may live on (the provider did not answer): counted until it is surely gone, and tried
    // again (retry_destroys).
    gone->second.undestroyed = true;
    spdlog::warn("destroying sandbox {} failed (it stays counted and is tried again): {}",
                 sandbox_id, destroyed.error().message);
  } else if (gone != leases_.end()) {
    const uint64_t key = gone->first;
    const bool placed = gone->second.placed;
    leases_.erase(gone);
    if (placed) free_place(lock, key, sandbox_id);
  } else if (shared_ && (destroyed || destroyed.error().code == ErrorCode::kNotFound)) {
    // Not held here: the place another server holds for it goes with it.
    free_place(lock, std::nullopt, sandbox_id);
  }
  changed_.notify_all();
  return destroyed;
}

int Scheduler::retry_destroys() {
  std::vector<std::string> ids;
  {
    std::lock_guard lock(mutex_);
    for (const auto& [key, lease] : leases_) {
      if (lease.undestroyed) ids.push_back(lease.sandbox_id);
    }
  }
  int destroyed = 0;
  for (const auto& id : ids) {
    auto done = destroy(id);
    if (done || done.error().code == ErrorCode::kNotFound) {
      spdlog::info("sandbox {}, whose destroy had failed, is gone", id);
      ++destroyed;
    }
  }
  return destroyed;
}

std::chrono::seconds Scheduler::retry_after() const {
  const double median_s = percentile(waits_ms_, 0.5) / 1000;
  return std::chrono::seconds(std::clamp<int64_t>(std::llround(std::ceil(median_s)), 1, 60));
}

int Scheduler::waiting() const {
  std::lock_guard lock(mutex_);
  return static_cast<int>(waiters_.size());
}

Stats Scheduler::stats(bool look_elsewhere) {
  Lock lock(mutex_);
  if (look_elsewhere) this->look_elsewhere(lock, std::chrono::milliseconds(0));
  Stats stats;
  stats.limits = options_;
  for (const auto& account : accounts_)
    stats.accounts.push_back({account.name, account.max_sandboxes, 0});
  int* by_use[] = {&stats.starting, &stats.warm, &stats.busy, &stats.idle, &stats.deleting};
  for (const auto& [key, lease] : leases_) {
    ++stats.accounts[lease.account].in_use;
    ++*by_use[static_cast<size_t>(lease.use)];  // in the order of Use
  }
  stats.elsewhere = elsewhere_.total;
  stats.waiting = static_cast<int>(waiters_.size());
  const auto now = SteadyClock::now();
  for (const auto& waiter : waiters_)
    stats.longest_wait_ms = std::max(stats.longest_wait_ms, ms(now - waiter.since));
  stats.cold_starts = cold_starts_;
  stats.warm_starts = warm_starts_;
  stats.evictions = evictions_;
  stats.timeouts = timeouts_;
  stats.refused = refused_;
  stats.dead_warm = dead_warm_;
  stats.wait_p50_ms = percentile(waits_ms_, 0.5);
  stats.wait_p99_ms = percentile(waits_ms_, 0.99);
  stats.cold_p50_ms = percentile(cold_ms_, 0.5);
  stats.warm_p50_ms = percentile(warm_ms_, 0.5);
  return stats;
}

void Scheduler::pool_loop() {
  std::unique_lock lock(mutex_);
  auto next_sweep = SteadyClock::now() + kPoolSweep;
  auto backoff_until = SteadyClock::time_point{};
  while (!stopping_) {
    const auto now = SteadyClock::now();
    const int pooled =
        static_cast<int>(std::count_if(leases_.begin(), leases_.end(), [](const auto& entry) {
          const Lease& lease = entry.second;
          return lease.use == Use::kWarm || (lease.use == Use::kStarting && lease.user.empty() &&
                                             lease.conversation_id.empty());
        }));
    const int account = account_with_room();
    if (pooled < options_.warm_min_idle && waiters_.empty() && account >= 0 &&
        now >= backoff_until) {
      const uint64_t key = next_lease_++;
      Lease lease;
      lease.account = static_cast<size_t>(account);
      leases_.emplace(key, std::move(lease));
      auto placed = take_place(lock, key, "", static_cast<size_t>(account));
      if (!placed || !*placed) {
        // Another server holds the room: the pool waits for it as it does after a failure.
        leases_.erase(key);
        backoff_until = SteadyClock::now() + kPoolBackoff;
        if (!placed) {
          spdlog::warn("the warm pool could not take a place (trying again in {}): {}",
                       format_duration(kPoolBackoff), placed.error().message);
        }
        look_elsewhere(lock, std::chrono::milliseconds(0));
        continue;
      }
      Request warm;
      warm.labels = {{std::string(kOriginLabel), "pool"}};
      if (auto filled = fill(lock, key, spec_for(warm)); filled) {
        leases_.at(key).use = Use::kWarm;
      } else {
        backoff_until = SteadyClock::now() + kPoolBackoff;
        spdlog::warn("the warm pool could not start a sandbox (trying again in {}): {}",
                     format_duration(kPoolBackoff), filled.error().message);
      }
      changed_.notify_all();
      continue;
    }
    if (now >= next_sweep) {
      // A pooled sandbox may die (killed, the host's OOM killer): found here, not at handout.
      std::vector<std::pair<std::string, size_t>> pooled_ids;
      for (const auto& [key, lease] : leases_) {
        if (lease.use == Use::kWarm) pooled_ids.emplace_back(lease.sandbox_id, lease.account);
      }
      lock.unlock();
      std::vector<std::string> dead;
      for (const auto& [id, index] : pooled_ids) {
        auto alive = accounts_[index].provider->is_alive(id);
        if (!alive || !*alive) dead.push_back(id);
      }
      lock.lock();
      const auto gone = withdraw_warm(dead);
      lock.unlock();
      for (const auto& id : gone) {
        spdlog::warn("warm sandbox {} was found dead in the pool; replacing it", id);
        (void)destroy(id);
      }
      lock.lock();
      dead_warm_ += gone.size();
      next_sweep = SteadyClock::now() + kPoolSweep;
      continue;
    }
    changed_.wait_until(lock,
                        std::min({next_sweep, std::max(backoff_until, now + kWaitSlice * 10)}));
  }
}

void Scheduler::share_limits(SharedPlaces& places, std::string server, AskElsewhere ask) {
  std::lock_guard lock(mutex_);
  shared_ = &places;
  server_ = std::move(server);
  ask_elsewhere_ = std::move(ask);
}

std::string Scheduler::place_key(uint64_t key) const {
  return fmt::format("{}/{}", server_, key);
}

Result<bool> Scheduler::take_place(Lock& lock, uint64_t key, const std::string& user,
                                   size_t account) {
  if (!shared_) return true;
  SharedPlaces* shared = shared_;
  const Place place{place_key(key), server_, user, accounts_[account].name, ""};
  const PlaceLimits limits{options_.max_sandboxes, options_.max_per_user,
                           accounts_[account].max_sandboxes};
  lock.unlock();
  auto taken = shared->take_place(place, limits);
  lock.lock();
  if (!taken) return std::unexpected(std::move(taken).error());
  auto lease = leases_.find(key);
  if (*taken && lease != leases_.end()) lease->second.placed = true;
  return *taken;
}

Result<bool> Scheduler::assign_place(Lock& lock, uint64_t key, const std::string& user) {
  if (!shared_) return true;
  SharedPlaces* shared = shared_;
  const std::string place = place_key(key);
  const int max_per_user = options_.max_per_user;
  lock.unlock();
  auto assigned = shared->assign_place(place, user, max_per_user);
  lock.lock();
  return assigned;
}

void Scheduler::name_place(Lock& lock, uint64_t key, const std::string& sandbox_id) {
  if (!shared_ || !leases_.at(key).placed) return;
  SharedPlaces* shared = shared_;
  const std::string place = place_key(key);
  lock.unlock();
  if (auto named = shared->name_place(place, sandbox_id); !named) {
    // Counted all the same; only another server going on with it would count it twice.
    spdlog::warn("naming the sandbox of the shared place {} failed: {}", place,
                 named.error().message);
  }
  lock.lock();
}

void Scheduler::free_place(Lock& lock, std::optional<uint64_t> key, std::string_view sandbox_id) {
  if (!shared_) return;
  SharedPlaces* shared = shared_;
  const std::string place = key ? place_key(*key) : "";
  const std::string sandbox(sandbox_id);
  lock.unlock();
  if (auto freed = shared->free_place(place, sandbox); !freed) {
    // Left to the servers' registry: freed when this server leaves or is taken over.
    spdlog::warn("freeing the shared place {} of sandbox {} failed: {}", place, sandbox,
                 freed.error().message);
  }
  lock.lock();
  changed_.notify_all();
}

void Scheduler::look_elsewhere(Lock& lock, std::chrono::milliseconds age) {
  if (!shared_ || SteadyClock::now() - looked_elsewhere_ < age) return;
  SharedPlaces* shared = shared_;
  const std::string server = server_;
  looked_elsewhere_ = SteadyClock::now();
  lock.unlock();
  auto held = shared->places_held(server);
  lock.lock();
  if (!held) {
    spdlog::warn("reading the other servers' sandboxes failed: {}", held.error().message);
    return;
  }
  // An idle sandbox whose place is gone went on in another server's turn (its conversation's
  // turns went there) or was destroyed by one: that server counts it, or nobody does.
  std::erase_if(leases_, [&](const auto& entry) {
    const auto& [key, lease] = entry;
    const bool moved =
        lease.placed && lease.use == Use::kIdle && !held->own.contains(place_key(key));
    if (moved) spdlog::debug("sandbox {} is no longer this server's to count", lease.sandbox_id);
    return moved;
  });
  // A place of this server's that no lease holds was left behind: a free that failed, or a take
  // whose answer was lost after it was made. Counted for nobody here, it would refuse every
  // take while this server's view says there is room; it goes. (A lease freeing its place
  // meanwhile frees it twice, which is harmless.)
  std::set<std::string> leased;
  for (const auto& [key, lease] : leases_)
    leased.insert(place_key(key));
  std::vector<std::string> left;
  std::set_difference(held->own.begin(), held->own.end(), leased.begin(), leased.end(),
                      std::back_inserter(left));
  elsewhere_ = std::move(*held);
  if (!left.empty()) {
    lock.unlock();
    for (const auto& place : left) {
      spdlog::info("freeing the shared place {}, which no sandbox of this server holds", place);
      if (auto freed = shared->free_place(place, ""); !freed) {
        spdlog::warn("freeing the shared place {} failed: {}", place, freed.error().message);
      }
    }
    lock.lock();
  }
  changed_.notify_all();
}

int Scheduler::shutdown() {
  std::unique_lock lock(mutex_);
  stopping_ = true;
  changed_.notify_all();
  lock.unlock();
  if (pool_.joinable()) pool_.join();
  lock.lock();
  const auto pooled = withdraw_warm();
  lock.unlock();
  int destroyed = 0;
  for (const auto& id : pooled)
    destroyed += destroy(id).has_value();
  return destroyed;
}

std::vector<std::string> Scheduler::withdraw_warm(
    const std::optional<std::vector<std::string>>& only) {
  std::vector<std::string> withdrawn;
  for (auto& [key, lease] : leases_) {
    if (lease.use != Use::kWarm) continue;
    if (only && std::find(only->begin(), only->end(), lease.sandbox_id) == only->end()) continue;
    lease.use = Use::kEnding;
    withdrawn.push_back(lease.sandbox_id);
  }
  return withdrawn;
}

}  // namespace quarry::capacity

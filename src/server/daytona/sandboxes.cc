#include "server/daytona/sandboxes.h"

#include <spdlog/spdlog.h>

#include <algorithm>

namespace quarry::server::daytona {

std::string_view state_name(State state) {
  switch (state) {
    case State::kStarted:
      return "started";
    case State::kStopped:
      return "stopped";
    case State::kDestroyed:
      return "destroyed";
  }
  return "unknown";
}

Sandboxes::Sandboxes(capacity::Scheduler& scheduler, sandbox::SandboxProvider& provider,
                     std::chrono::milliseconds reap_interval)
    : scheduler_(scheduler),
      provider_(provider),
      reaper_([this, reap_interval] { reap_loop(reap_interval); }) {}

Sandboxes::~Sandboxes() {
  shutdown();
}

std::map<std::string, Record>::iterator Sandboxes::find(std::string_view owner,
                                                        std::string_view id_or_name) {
  auto found = records_.find(std::string(id_or_name));
  if (found == records_.end()) {
    found = std::find_if(records_.begin(), records_.end(), [&](const auto& entry) {
      return entry.second.owner == owner && entry.second.name == id_or_name;
    });
  }
  if (found != records_.end() && found->second.owner != owner) return records_.end();
  return found;
}

Result<Record> Sandboxes::not_found(std::string_view id_or_name) const {
  return make_error(ErrorCode::kNotFound, "Sandbox with ID or name {} not found", id_or_name);
}

Result<Record> Sandboxes::create(Record draft, sandbox::SandboxSpec spec) {
  {
    std::lock_guard lock(mutex_);
    if (stopping_) {
      return make_error(ErrorCode::kUnavailable, "the server is shutting down");
    }
    if (!draft.name.empty() && find(draft.owner, draft.name) != records_.end()) {
      return make_error(ErrorCode::kAlreadyExists, "Sandbox with name {} already exists",
                        draft.name);
    }
  }
  spec.labels[std::string(kOwnerLabel)] = draft.owner;
  spec.resources = draft.resources;
  ASSIGN_OR_RETURN(auto grant, scheduler_.hold(draft.owner, spec));
  std::unique_lock lock(mutex_);
  if (stopping_ || (!draft.name.empty() && find(draft.owner, draft.name) != records_.end())) {
    // Shut down, or the same name taken by a create that ran meanwhile.
    const bool stopping = stopping_;
    lock.unlock();
    (void)scheduler_.destroy(grant.sandbox_id);
    if (stopping) return make_error(ErrorCode::kUnavailable, "the server is shutting down");
    return make_error(ErrorCode::kAlreadyExists, "Sandbox with name {} already exists", draft.name);
  }
  draft.id = grant.sandbox_id;
  if (draft.name.empty()) draft.name = draft.id;
  draft.created_at = draft.updated_at = draft.last_activity = std::chrono::system_clock::now();
  draft.sequence = next_sequence_++;
  records_[draft.id] = draft;
  return draft;
}

Result<Record> Sandboxes::get(std::string_view owner, std::string_view id_or_name) {
  std::lock_guard lock(mutex_);
  auto found = find(owner, id_or_name);
  if (found == records_.end()) return not_found(id_or_name);
  return found->second;
}

std::vector<Record> Sandboxes::list(std::string_view owner) {
  std::lock_guard lock(mutex_);
  std::vector<Record> mine;
  for (const auto& [id, record] : records_) {
    if (record.owner == owner) mine.push_back(record);
  }
  std::sort(mine.begin(), mine.end(),
            [](const Record& a, const Record& b) { return a.sequence > b.sequence; });
  return mine;
}

Result<Record> Sandboxes::update(std::string_view owner, std::string_view id_or_name,
                                 const std::function<void(Record&)>& change) {
  std::lock_guard lock(mutex_);
  auto found = find(owner, id_or_name);
  if (found == records_.end()) return not_found(id_or_name);
  change(found->second);
  found->second.updated_at = found->second.last_activity = std::chrono::system_clock::now();
  return found->second;
}

Result<Record> Sandboxes::remove(std::string_view owner, std::string_view id_or_name) {
  Record removed;
  {
    std::lock_guard lock(mutex_);
    auto found = find(owner, id_or_name);
    if (found == records_.end()) return not_found(id_or_name);
    removed = std::move(found->second);
    records_.erase(found);
  }
  released_.notify_all();
  if (auto destroyed = scheduler_.destroy(removed.id);
      !destroyed && destroyed.error().code != ErrorCode::kNotFound) {
    return std::unexpected(destroyed.error());
  }
  removed.state = State::kDestroyed;
  removed.updated_at = std::chrono::system_clock::now();
  return removed;
}

Result<Record> Sandboxes::stop(std::string_view owner, std::string_view id_or_name) {
  Record stopped;
  {
    std::lock_guard lock(mutex_);
    auto found = find(owner, id_or_name);
    if (found == records_.end()) return not_found(id_or_name);
    Record& record = found->second;
    if (record.state != State::kStarted) {
      return make_error(ErrorCode::kFailedPrecondition, "Sandbox is not started");
    }
    record.state = State::kStopped;
    record.stopped_at = record.updated_at = std::chrono::system_clock::now();
    stopped = record;
  }
  if (stopped.auto_delete == 0) return remove(owner, stopped.id);
  end_commands(stopped.id);
  spdlog::info("stopped sandbox {} of {} (Daytona API)", stopped.id, stopped.owner);
  return stopped;
}

Result<Record> Sandboxes::start(std::string_view owner, std::string_view id_or_name) {
  std::lock_guard lock(mutex_);
  auto found = find(owner, id_or_name);
  if (found == records_.end()) return not_found(id_or_name);
  Record& record = found->second;
  if (record.state == State::kStopped) {
    record.state = State::kStarted;
    record.updated_at = record.last_activity = std::chrono::system_clock::now();
  }
  return record;
}

void Sandboxes::kill_commands(const std::string& id) {
  // kNotFound: deleted meanwhile, nothing left to end.
  if (auto ended = provider_.stop_commands(id);
      !ended && ended.error().code != ErrorCode::kNotFound) {
    spdlog::warn("ending the commands of stopped sandbox {} failed: {}", id, ended.error().message);
  }
}

void Sandboxes::end_commands(const std::string& id) {
  kill_commands(id);
  {
    std::unique_lock lock(mutex_);
    released_.wait(lock, [&] {
      auto found = records_.find(id);
      return found == records_.end() || found->second.in_use == 0;
    });
  }
  kill_commands(id);
}

Result<Record> Sandboxes::use(std::string_view owner, std::string_view id) {
  std::lock_guard lock(mutex_);
  auto found = records_.find(std::string(id));  // the toolbox names sandboxes by id only
  if (found == records_.end() || found->second.owner != owner) return not_found(id);
  if (found->second.state != State::kStarted) {
    return make_error(ErrorCode::kFailedPrecondition,
                      "Sandbox {} is stopped: start it first (POST /sandbox/{}/start; "
                      "sandbox.start() in the SDK)",
                      id, id);
  }
  ++found->second.in_use;
  found->second.last_activity = std::chrono::system_clock::now();
  return found->second;
}

void Sandboxes::release(std::string_view id) {
  {
    std::lock_guard lock(mutex_);
    auto found = records_.find(std::string(id));
    if (found == records_.end()) return;
    --found->second.in_use;
    found->second.last_activity = std::chrono::system_clock::now();
  }
  released_.notify_all();
}

void Sandboxes::reap_loop(std::chrono::milliseconds interval) {
  std::unique_lock lock(mutex_);
  while (!stop_.wait_for(lock, interval, [this] { return stopping_; })) {
    lock.unlock();
    reap(std::chrono::system_clock::now());
    lock.lock();
  }
}

namespace {

// Whether `minutes` have passed from `since` to `now`, for any interval a client may set:
// counted in minutes, as minutes(2^31) in the clock's nanoseconds would overflow.
bool minutes_passed(std::chrono::system_clock::time_point since,
                    std::chrono::system_clock::time_point now, int64_t minutes) {
  return std::chrono::duration_cast<std::chrono::minutes>(now - since).count() >= minutes;
}

}  // namespace

void Sandboxes::reap(std::chrono::system_clock::time_point now) {
  std::vector<Record> stopped, expired;
  {
    std::lock_guard lock(mutex_);
    for (auto it = records_.begin(); it != records_.end();) {
      Record& record = it->second;
      const bool idle = record.state == State::kStarted && record.auto_stop > 0 &&
                        record.in_use == 0 &&
                        minutes_passed(record.last_activity, now, record.auto_stop);
      if (idle) {
        record.state = State::kStopped;
        record.stopped_at = record.updated_at = now;
        spdlog::info(
            "stopped sandbox {} of {} (Daytona API): idle longer than its autoStopInterval of "
            "{} min",
            record.id, record.owner, record.auto_stop);
        if (record.auto_delete != 0) stopped.push_back(record);
      }
      if (record.state == State::kStopped && record.auto_delete >= 0 &&
          minutes_passed(record.stopped_at, now, record.auto_delete)) {
        expired.push_back(record);
        it = records_.erase(it);
      } else {
        ++it;
      }
    }
  }
  // Nothing was in use: only what their commands left running in the background.
  for (const auto& record : stopped)
    kill_commands(record.id);
  for (const auto& record : expired) {
    auto destroyed = scheduler_.destroy(record.id);
    if (destroyed) {
      spdlog::info(
          "deleted sandbox {} of {} (Daytona API): stopped longer than its "
          "autoDeleteInterval of {} min",
          record.id, record.owner, record.auto_delete);
    } else {
      spdlog::warn("deleting stopped sandbox {} (Daytona API) failed: {}", record.id,
                   destroyed.error().message);
    }
  }
}

int Sandboxes::shutdown() {
  std::vector<std::string> ids;
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    for (const auto& [id, record] : records_)
      ids.push_back(id);
    records_.clear();
  }
  stop_.notify_all();
  released_.notify_all();
  if (reaper_.joinable()) reaper_.join();
  int destroyed = 0;
  for (const auto& id : ids)
    destroyed += scheduler_.destroy(id).has_value();
  return destroyed;
}

}  // namespace quarry::server::daytona

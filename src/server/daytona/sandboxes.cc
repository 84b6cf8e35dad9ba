#include "server/daytona/sandboxes.h"

#include <spdlog/spdlog.h>

#include <algorithm>

namespace quarry::server::daytona {

Sandboxes::Sandboxes(capacity::Scheduler& scheduler, std::chrono::milliseconds reap_interval)
    : scheduler_(scheduler), reaper_([this, reap_interval] { reap_loop(reap_interval); }) {}

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
  if (auto destroyed = scheduler_.destroy(removed.id);
      !destroyed && destroyed.error().code != ErrorCode::kNotFound) {
    return std::unexpected(destroyed.error());
  }
  return removed;
}

Result<Record> Sandboxes::use(std::string_view owner, std::string_view id) {
  std::lock_guard lock(mutex_);
  auto found = records_.find(std::string(id));  // the toolbox names sandboxes by id only
  if (found == records_.end() || found->second.owner != owner) return not_found(id);
  ++found->second.in_use;
  found->second.last_activity = std::chrono::system_clock::now();
  return found->second;
}

void Sandboxes::release(std::string_view id) {
  std::lock_guard lock(mutex_);
  auto found = records_.find(std::string(id));
  if (found == records_.end()) return;
  --found->second.in_use;
  found->second.last_activity = std::chrono::system_clock::now();
}

void Sandboxes::reap_loop(std::chrono::milliseconds interval) {
  std::unique_lock lock(mutex_);
  while (!stop_.wait_for(lock, interval, [this] { return stopping_; })) {
    const auto now = std::chrono::system_clock::now();
    std::vector<Record> idle;
    for (auto it = records_.begin(); it != records_.end();) {
      const Record& record = it->second;
      if (record.auto_stop > 0 && record.in_use == 0 &&
          now - record.last_activity >= std::chrono::minutes(record.auto_stop)) {
        idle.push_back(record);
        it = records_.erase(it);
      } else {
        ++it;
      }
    }
    lock.unlock();
    for (const auto& record : idle) {
      auto destroyed = scheduler_.destroy(record.id);
      if (destroyed) {
        spdlog::info(
            "deleted sandbox {} of {} (Daytona API): idle longer than its "
            "autoStopInterval of {} min",
            record.id, record.owner, record.auto_stop);
      } else {
        spdlog::warn("deleting idle sandbox {} (Daytona API) failed: {}", record.id,
                     destroyed.error().message);
      }
    }
    lock.lock();
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
  if (reaper_.joinable()) reaper_.join();
  int destroyed = 0;
  for (const auto& id : ids)
    destroyed += scheduler_.destroy(id).has_value();
  return destroyed;
}

}  // namespace quarry::server::daytona

// A sandbox provider for unit tests whose sandboxes are names in a set: what the scheduler and
// the rooms above it ask of a provider, counted, without kernel isolation.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "sandbox/provider.h"

namespace quarry::testing_support {

// A provider whose sandboxes are names in a set. It counts the most that ever existed at once,
// and a sandbox can be killed behind the scheduler's back.
class CountingProvider final : public sandbox::SandboxProvider {
 public:
  // Ids are unique across providers, as a real provider's are (`name` starts them).
  explicit CountingProvider(std::string name = "sb") : name_(std::move(name)) {}

  Result<sandbox::SandboxInfo> create(const sandbox::SandboxSpec& spec) override {
    std::this_thread::sleep_for(
        std::chrono::milliseconds(1));  // long enough for others to come in meanwhile
    std::lock_guard lock(mutex_);
    sandbox::SandboxInfo info;
    info.id = fmt::format("{}{}", name_, next_++);
    info.labels = spec.labels;
    info.network = spec.network;
    networks_[info.id] = spec.network;
    packages_[info.id] = spec.packages;
    alive_.insert(info.id);
    existing_.insert(info.id);
    most_ = std::max(most_, existing_.size());
    if (shared_) {
      *shared_ += 1;
      shared_most_->store(std::max(shared_most_->load(), shared_->load()));
    }
    return info;
  }
  Result<void> prepare(std::string_view, const sandbox::PrepareSpec&) override { return {}; }
  Result<sandbox::ExecResult> exec(std::string_view, const sandbox::ExecRequest&) override {
    return sandbox::ExecResult{};
  }
  Result<int> stop_commands(std::string_view id) override {
    std::lock_guard lock(mutex_);
    if (!existing_.contains(std::string(id))) return make_error(ErrorCode::kNotFound, "no {}", id);
    ++stopped_[std::string(id)];
    return 0;
  }
  Result<void> write_file(std::string_view, std::string_view, std::istream&, int) override {
    return {};
  }
  Result<uint64_t> read_file(std::string_view, std::string_view, std::ostream&, uint64_t,
                             int) override {
    return 0;
  }
  Result<std::vector<sandbox::FileInfo>> list_files(std::string_view, std::string_view) override {
    return std::vector<sandbox::FileInfo>{};
  }
  Result<bool> is_directory(std::string_view, std::string_view) override { return false; }
  Result<void> destroy(std::string_view id) override {
    std::lock_guard lock(mutex_);
    if (failing_destroys_ > 0) {
      --failing_destroys_;
      return make_error(ErrorCode::kUnavailable, "the provider answered 503 for {}", id);
    }
    if (!existing_.erase(std::string(id))) return make_error(ErrorCode::kNotFound, "no {}", id);
    alive_.erase(std::string(id));
    destroyed_.push_back(std::string(id));
    if (shared_) *shared_ -= 1;
    return {};
  }
  Result<bool> is_alive(std::string_view id) override {
    std::lock_guard lock(mutex_);
    if (!existing_.contains(std::string(id))) return make_error(ErrorCode::kNotFound, "no {}", id);
    return alive_.contains(std::string(id));
  }
  Result<std::vector<sandbox::SandboxInfo>> find(const sandbox::Labels&) override {
    return std::vector<sandbox::SandboxInfo>{};
  }

  NetworkPolicy network_of(const std::string& id) {
    std::lock_guard lock(mutex_);
    return networks_.at(id);
  }
  void kill(const std::string& id) {
    std::lock_guard lock(mutex_);
    alive_.erase(id);
  }
  bool alive(const std::string& id) {
    std::lock_guard lock(mutex_);
    return alive_.contains(id);
  }
  size_t most() {
    std::lock_guard lock(mutex_);
    return most_;
  }
  std::vector<std::string> ids() {
    std::lock_guard lock(mutex_);
    return {existing_.begin(), existing_.end()};
  }
  size_t existing() {
    std::lock_guard lock(mutex_);
    return existing_.size();
  }
  std::vector<std::string> destroyed() {
    std::lock_guard lock(mutex_);
    return destroyed_;
  }
  // The extra packages sandbox `id` was created with.
  std::vector<std::string> packages(const std::string& id) {
    std::lock_guard lock(mutex_);
    return packages_[id];
  }
  // How many times stop_commands was called on `id`.
  int stops(const std::string& id) {
    std::lock_guard lock(mutex_);
    return stopped_[id];
  }
  // The next `count` destroys fail as a remote provider's do when it is unavailable.
  void fail_destroys(int count) {
    std::lock_guard lock(mutex_);
    failing_destroys_ = count;
  }
  // Counts shared with other providers: sandboxes of every account at once.
  void share(std::atomic<int>* count, std::atomic<int>* most) {
    shared_ = count;
    shared_most_ = most;
  }

 private:
  std::string name_;
  std::mutex mutex_;
  int next_ = 1;
  std::set<std::string> alive_, existing_;
  std::map<std::string, NetworkPolicy> networks_;
  std::vector<std::string> destroyed_;
  std::map<std::string, std::vector<std::string>> packages_;
  std::map<std::string, int> stopped_;
  int failing_destroys_ = 0;
  size_t most_ = 0;
  std::atomic<int>* shared_ = nullptr;
  std::atomic<int>* shared_most_ = nullptr;
};

}  // namespace quarry::testing_support

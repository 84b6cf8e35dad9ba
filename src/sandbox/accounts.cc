#include "sandbox/accounts.h"

namespace quarry::sandbox {

ProviderAccounts::ProviderAccounts(std::vector<Account> accounts)
    : accounts_(std::move(accounts)) {}

std::vector<std::pair<std::string, SandboxProvider*>> ProviderAccounts::accounts() {
  std::vector<std::pair<std::string, SandboxProvider*>> named;
  for (const auto& account : accounts_)
    named.emplace_back(account.name, account.provider.get());
  return named;
}

void ProviderAccounts::remember(std::string_view id, SandboxProvider* provider) {
  std::lock_guard lock(mutex_);
  owners_.insert_or_assign(std::string(id), provider);
}

Result<SandboxProvider*> ProviderAccounts::owner(std::string_view id,
                                                 std::optional<bool>* alive_now) {
  {
    std::lock_guard lock(mutex_);
    if (auto known = owners_.find(id); known != owners_.end()) return known->second;
  }
  // Asked without the lock: each is a call to the remote engine.
  for (const auto& account : accounts_) {
    auto alive = account.provider->is_alive(id);
    if (!alive && alive.error().code == ErrorCode::kNotFound) continue;
    if (!alive) {
      return std::unexpected(alive.error().with_context(
          fmt::format("finding which account has sandbox {} (account {})", id, account.name)));
    }
    remember(id, account.provider.get());
    if (alive_now) *alive_now = *alive;
    return account.provider.get();
  }
  return make_error(ErrorCode::kNotFound, "no account has a sandbox {}", id);
}

Result<Runtime> ProviderAccounts::runtime() {
  return accounts_.front().provider->runtime();
}

Result<SandboxInfo> ProviderAccounts::create(const SandboxSpec& spec) {
  Result<SandboxInfo> created = make_error(ErrorCode::kResourceExhausted, "no account");
  for (const auto& account : accounts_) {
    created = account.provider->create(spec);
    if (created) {
      remember(created->id, account.provider.get());
      return created;
    }
    if (created.error().code != ErrorCode::kResourceExhausted) return created;
  }
  return created;
}

Result<void> ProviderAccounts::prepare(std::string_view id, const PrepareSpec& spec) {
  ASSIGN_OR_RETURN(auto* provider, owner(id));
  return provider->prepare(id, spec);
}

Result<ExecResult> ProviderAccounts::exec(std::string_view id, const ExecRequest& request) {
  ASSIGN_OR_RETURN(auto* provider, owner(id));
  return provider->exec(id, request);
}

Result<std::unique_ptr<Process>> ProviderAccounts::start(std::string_view id,
                                                         const ExecRequest& request) {
  ASSIGN_OR_RETURN(auto* provider, owner(id));
  return provider->start(id, request);
}

Result<void> ProviderAccounts::stop_process(std::string_view id, std::string_view process) {
  ASSIGN_OR_RETURN(auto* provider, owner(id));
  return provider->stop_process(id, process);
}

Result<int> ProviderAccounts::stop_commands(std::string_view id) {
  ASSIGN_OR_RETURN(auto* provider, owner(id));
  return provider->stop_commands(id);
}

Result<void> ProviderAccounts::write_file(std::string_view id, std::string_view path,
                                          std::istream& content, int cancel_fd) {
  ASSIGN_OR_RETURN(auto* provider, owner(id));
  return provider->write_file(id, path, content, cancel_fd);
}

Result<uint64_t> ProviderAccounts::read_file(std::string_view id, std::string_view path,
                                             std::ostream& out, uint64_t max_bytes, int cancel_fd) {
  ASSIGN_OR_RETURN(auto* provider, owner(id));
  return provider->read_file(id, path, out, max_bytes, cancel_fd);
}

Result<std::vector<FileInfo>> ProviderAccounts::list_files(std::string_view id,
                                                           std::string_view directory) {
  ASSIGN_OR_RETURN(auto* provider, owner(id));
  return provider->list_files(id, directory);
}

Result<bool> ProviderAccounts::is_directory(std::string_view id, std::string_view path) {
  ASSIGN_OR_RETURN(auto* provider, owner(id));
  return provider->is_directory(id, path);
}

Result<void> ProviderAccounts::destroy(std::string_view id) {
  ASSIGN_OR_RETURN(auto* provider, owner(id));
  RETURN_IF_ERROR(provider->destroy(id));
  std::lock_guard lock(mutex_);
  if (auto known = owners_.find(id); known != owners_.end()) owners_.erase(known);
  return {};
}

Result<bool> ProviderAccounts::is_alive(std::string_view id) {
  std::optional<bool> alive;  // set when finding the owner asked it already
  ASSIGN_OR_RETURN(auto* provider, owner(id, &alive));
  if (alive) return *alive;
  return provider->is_alive(id);
}

Result<std::vector<SandboxInfo>> ProviderAccounts::find(const Labels& labels) {
  std::vector<SandboxInfo> found;
  for (const auto& account : accounts_) {
    ASSIGN_OR_RETURN(
        auto in_account,
        with_context(account.provider->find(labels),
                     fmt::format("listing the sandboxes of account {}", account.name)));
    for (auto& info : in_account) {
      remember(info.id, account.provider.get());
      found.push_back(std::move(info));
    }
  }
  return found;
}

}  // namespace quarry::sandbox

// Several accounts of one remote provider (Daytona organisations, or keys with quotas of their
// own) as one SandboxProvider. The scheduler makes each sandbox in the account with most room,
// through that account itself (accounts()); everything after is asked of this one and goes to
// the account the sandbox is in: known from find, else learnt by asking the accounts in turn
// the first time an id is used (a key sees only its own account's sandboxes, the others say
// kNotFound), so a server restarted with only ids in its history finds them too.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "sandbox/provider.h"

namespace quarry::sandbox {

class ProviderAccounts final : public SandboxProvider {
 public:
  struct Account {
    std::string name;
    std::unique_ptr<SandboxProvider> provider;
  };
  // At least one account; names unique.
  explicit ProviderAccounts(std::vector<Account> accounts);

  std::vector<std::pair<std::string, SandboxProvider*>> accounts() override;

  Result<Runtime> runtime() override;
  // In the first account that has room (the scheduler picks an account itself).
  Result<SandboxInfo> create(const SandboxSpec& spec) override;
  Result<void> prepare(std::string_view id, const PrepareSpec& spec) override;
  Result<ExecResult> exec(std::string_view id, const ExecRequest& request) override;
  Result<std::unique_ptr<Process>> start(std::string_view id, const ExecRequest& request) override;
  Result<void> stop_process(std::string_view id, std::string_view process) override;
  Result<int> stop_commands(std::string_view id) override;
  Result<void> write_file(std::string_view id, std::string_view path, std::istream& content,
                          int cancel_fd) override;
  Result<uint64_t> read_file(std::string_view id, std::string_view path, std::ostream& out,
                             uint64_t max_bytes, int cancel_fd) override;
  Result<bool> is_directory(std::string_view id, std::string_view path) override;
  Result<std::vector<FileInfo>> list_files(std::string_view id,
                                           std::string_view directory) override;
  Result<void> destroy(std::string_view id) override;
  Result<bool> is_alive(std::string_view id) override;
  // Over every account.
  Result<std::vector<SandboxInfo>> find(const Labels& labels) override;

 private:
  // The account sandbox `id` is in; kNotFound when none has it. Where the accounts had to be
  // asked, `alive_now` (if given) is set to what the owner said of the sandbox.
  Result<SandboxProvider*> owner(std::string_view id, std::optional<bool>* alive_now = nullptr);
  void remember(std::string_view id, SandboxProvider* provider);

  std::vector<Account> accounts_;
  std::mutex mutex_;
  std::map<std::string, SandboxProvider*, std::less<>> owners_;
};

}  // namespace quarry::sandbox

// The history in one SQLite file (<state>/history.db): WAL, one transaction per write,
// versioned schema migrations. A file it does not recognise, a damaged one, or one written by
// a newer quarry is refused with a message and never modified.
#pragma once

#include <filesystem>
#include <memory>
#include <mutex>

#include "conversation/history_store.h"

struct sqlite3;

namespace quarry::conversation {

class SqliteHistoryStore final : public HistoryStore {
 public:
  // The schema version this build writes; older databases are migrated on open.
  static constexpr int kSchemaVersion = 6;

  static Result<std::unique_ptr<SqliteHistoryStore>> open(const std::filesystem::path& path,
                                                          const Clock& clock);
  ~SqliteHistoryStore() override;

  Result<std::unique_ptr<TurnLock>> try_lock_turn(std::string_view conversation_id) override;
  Result<Conversation> create_conversation(
      std::string_view title, std::string_view owner = kLocalUser,
      const std::optional<NetworkPolicy>& network = std::nullopt,
      const std::vector<std::string>& packages = {}) override;
  Result<Conversation> conversation(std::string_view id) override;
  Result<std::vector<Conversation>> conversations(const ConversationQuery& query = {}) override;
  Result<void> name_conversation(std::string_view id, std::string_view title) override;
  Result<void> delete_conversation(std::string_view id) override;
  Result<int> begin_turn(std::string_view conversation_id, TurnKind kind) override;
  Result<void> finish_turn(std::string_view conversation_id, int turn, TurnStatus status,
                           std::string_view error) override;
  Result<std::vector<TurnRecord>> turns(std::string_view conversation_id) override;
  Result<std::vector<std::pair<std::string, TurnRecord>>> unfinished_turns() override;
  Result<Message> append_message(std::string_view conversation_id, Message message) override;
  Result<Event> record_event(std::string_view conversation_id, Event event) override;
  Result<ExecRecord> record_exec(std::string_view conversation_id, ExecRecord exec) override;
  Result<Artifact> record_artifact(std::string_view conversation_id, Artifact artifact) override;
  Result<std::vector<Message>> messages(std::string_view conversation_id) override;
  Result<std::vector<Event>> events(std::string_view conversation_id) override;
  Result<std::vector<ExecRecord>> execs(std::string_view conversation_id) override;
  Result<std::vector<Artifact>> artifacts(std::string_view conversation_id) override;
  Result<std::pair<std::string, Artifact>> artifact(int64_t id) override;
  Result<std::vector<std::pair<std::string, ExecRecord>>> find_execs(
      const ExecQuery& query) override;
  Result<ExecTotals> exec_totals(const ExecQuery& query) override;
  Result<void> append_stream_event(std::string_view conversation_id,
                                   const StreamEvent& event) override;
  Result<std::vector<StreamEvent>> stream_events(std::string_view conversation_id, int turn,
                                                 int64_t after_seq) override;
  Result<SandboxReference> sandbox_reference(std::string_view conversation_id) override;
  Result<void> set_sandbox_reference(std::string_view conversation_id,
                                     const SandboxReference& reference) override;
  Result<std::vector<std::pair<std::string, SandboxReference>>> sandbox_references(
      const std::optional<std::string>& owner = std::nullopt) override;

 private:
  SqliteHistoryStore(sqlite3* db, std::filesystem::path path, const Clock& clock);
  Result<void> migrate();
  Result<void> touch(std::string_view conversation_id, int64_t now_ms);
  std::unexpected<Error> sql_error(int rc, std::string_view what) const;
  template <typename Bind>
  Result<int64_t> insert(std::string_view conversation_id, std::string_view what,
                         std::string_view sql, Clock::time_point now, Bind&& bind);
  template <typename T, typename Read>
  Result<std::vector<T>> select_all(std::string_view conversation_id, std::string_view what,
                                    std::string_view sql, Read&& read);

  sqlite3* db_;
  std::filesystem::path path_;
  const Clock& clock_;
  std::mutex mutex_;  // one statement at a time on the connection
};

}  // namespace quarry::conversation

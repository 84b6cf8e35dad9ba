// The history in PostgreSQL (conversations.store: postgres), so several quarry servers can share
// it: the same HistoryStore as SqliteHistoryStore, with versioned migrations that servers
// starting at once run one after another, and turn locks that hold across servers.
//
// Connections: a small pool. A call takes an idle connection (or opens one) and gives it back;
// at most kMaxConnections calls run at once, the rest wait, so the server's pool of handler
// threads and its turn workers never queue behind one another on a single connection, and
// the database sees a bounded number of sessions per server. A connection that broke, or was
// left inside a transaction, is closed instead of being given back; the next call opens
// another. A turn lock is a session advisory lock (pg_try_advisory_lock) held by a connection
// of its own for as long as the TurnLock lives, outside the limit (a long turn never takes a
// place from the calls); PostgreSQL releases it when that session ends, so a server that dies
// (or whose connection is terminated) leaves no conversation locked.
//
// Text: PostgreSQL's text holds UTF-8 without NUL bytes, while a command's output may hold any
// bytes. Such text is stored with U+FFFD in place of each byte that is not UTF-8 and of each
// NUL, as the API and the model see it anyway (the SQLite store keeps the bytes as they are).
// Times are Unix milliseconds (bigint), as in the SQLite store.
//
// Artifacts: each one's bytes are a bytea row of artifact_contents, inserted in the statement
// that records it. libpq holds a whole value in memory (sent from one string, received in one
// result), so recording or restoring one costs about twice its size for a moment; the
// artifact limits (sandbox.artifacts.max_file, at most 1000 MiB here) bound that.
//
// It is also the registry of the servers sharing it (a `servers` table, times by the database's
// clock), and tells each server of the stream events recorded: an INSERT into stream_events
// sends a NOTIFY on the channel quarry_stream_events ("<conversation> <turn> <seq>") in the
// same statement, which a connection of the listener's, LISTENing, receives; a cancel asked
// through any server is a NOTIFY on quarry_turn_cancels ("<conversation> <turn>"), heard by
// the same connection. And it holds the
// place of every server's sandboxes (`sandbox_places`), so the capacity limits hold across
// servers: a place is taken by one INSERT that counts the others', under a transaction-scoped
// advisory lock, so two servers never both take the last one.
//
// A database whose schema is newer than this build's is refused and never modified, and so is
// one that already has tables of these names but no quarry schema_version.
#pragma once

#include <memory>
#include <string>

#include "conversation/history_store.h"

namespace quarry::conversation {

class PostgresConnections;

class PostgresHistoryStore final : public HistoryStore,
                                   public ServerRegistry,
                                   public capacity::SharedPlaces {
 public:
  // The schema version this build writes. Version 5 is created at once, the same tables as the
  // SQLite store's version 5 (the PostgreSQL store began there); 6 adds the servers, which only
  // a shared history has, so from there the two numbers go their own ways; 7 adds the servers'
  // sandbox places, 8 keeps artifacts' bytes (artifact_contents), so any server can serve what
  // another collected, 9 the requests for room, 10 the conversations deleted in the last 30
  // days (for the servers that did not hear of the delete), 11 the sandbox of each place.
  static constexpr int kSchemaVersion = 12;
  // Calls running on the database at once (each on a connection of its own).
  static constexpr size_t kMaxConnections = 8;

  // `url` is a libpq URL or key=value string (conversations.url); it is never put in a message,
  // as it may hold a password. Migrates the schema under an advisory lock.
  static Result<std::unique_ptr<PostgresHistoryStore>> open(const std::string& url,
                                                            const Clock& clock);
  ~PostgresHistoryStore() override;

  // The advisory lock key of a conversation's turn lock: the first 8 bytes of the SHA-256 of
  // "quarry turn <id>", so keys spread over all 64 bits and other applications' locks (small
  // numbers, hashtext) are unlikely to meet them.
  static int64_t turn_lock_key(std::string_view conversation_id);

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
  Result<bool> restore_artifact(int64_t id, const std::filesystem::path& to) override;
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
  ServerRegistry* registry() override { return this; }

  Result<void> enter(const ServerRecord& server) override;
  Result<bool> beat(std::string_view boot_id) override;
  Result<void> leave(std::string_view boot_id) override;
  Result<std::vector<ServerRecord>> servers() override;
  Result<std::optional<TakeOver>> claim(std::string_view boot_id,
                                        std::chrono::milliseconds timeout) override;
  Result<void> taken_over(const TakeOver& claim) override;
  Result<void> request_cancel(std::string_view conversation_id, int turn) override;
  Result<void> request_room(std::string_view server, std::string_view user) override;
  Result<bool> claim_room(int64_t id) override;
  Result<std::vector<std::string>> deleted_among(
      const std::vector<std::string>& conversation_ids) override;
  Result<std::unique_ptr<Subscription>> listen(Listeners listeners) override;

  capacity::SharedPlaces* places() override { return this; }
  // A server's places go with its record: when it leaves, and when a live server took it over.
  Result<bool> take_place(const capacity::Place& place,
                          const capacity::PlaceLimits& limits) override;
  Result<void> name_place(std::string_view key, std::string_view sandbox_id) override;
  Result<void> keep_place(const capacity::Place& place) override;
  Result<bool> assign_place(std::string_view key, std::string_view user, int max_per_user) override;
  Result<void> free_place(std::string_view key, std::string_view sandbox_id) override;
  Result<capacity::PlacesHeld> places_held(std::string_view server) override;

 private:
  PostgresHistoryStore(std::shared_ptr<PostgresConnections> connections, const Clock& clock,
                       std::string url);
  Result<void> migrate();

  // Shared with the turn locks handed out, which may outlive the store.
  std::shared_ptr<PostgresConnections> connections_;
  const Clock& clock_;
  std::string url_;
};

}  // namespace quarry::conversation

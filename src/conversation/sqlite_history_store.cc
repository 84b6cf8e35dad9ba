#include "conversation/sqlite_history_store.h"

#include <fcntl.h>
#include <sqlite3.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <fstream>
#include <limits>
#include <vector>

#include "common/file_util.h"
#include "common/random_id.h"
#include "common/unique_fd.h"
#include "conversation/history_columns.h"
#include "sandbox/metering.h"

namespace quarry::conversation {
namespace {

// 'qrry': marks the file as quarry's history, so another application's SQLite file is refused.
constexpr int kApplicationId = 0x71727279;

// Migration N takes the schema from version N-1 to N. Append only; never edit a shipped one.
constexpr std::array<std::string_view, 6> kMigrations = {R"sql(
CREATE TABLE conversations (
  id TEXT PRIMARY KEY,
  title TEXT NOT NULL,
  turns INTEGER NOT NULL DEFAULT 0,
  created_at INTEGER NOT NULL,
  updated_at INTEGER NOT NULL
);
CREATE TABLE messages (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  conversation_id TEXT NOT NULL REFERENCES conversations(id),
  turn INTEGER NOT NULL,
  role TEXT NOT NULL CHECK (role IN ('user', 'assistant', 'tool')),
  content TEXT NOT NULL,
  tool_calls TEXT,
  tool_call_id TEXT,
  created_at INTEGER NOT NULL
);
CREATE INDEX messages_by_conversation ON messages (conversation_id, id);
CREATE TABLE events (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  conversation_id TEXT NOT NULL REFERENCES conversations(id),
  turn INTEGER NOT NULL,
  kind TEXT NOT NULL,
  sandbox_id TEXT NOT NULL,
  reason TEXT NOT NULL,
  details TEXT NOT NULL,
  created_at INTEGER NOT NULL
);
CREATE INDEX events_by_conversation ON events (conversation_id, id);
CREATE TABLE execs (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  conversation_id TEXT NOT NULL REFERENCES conversations(id),
  turn INTEGER NOT NULL,
  sandbox_id TEXT NOT NULL,
  command TEXT NOT NULL,
  exit_code INTEGER NOT NULL,
  signal INTEGER,
  stdout TEXT NOT NULL,
  stderr TEXT NOT NULL,
  truncated INTEGER NOT NULL,
  run_ms REAL NOT NULL,
  cpu_ms REAL NOT NULL,
  peak_memory_bytes INTEGER NOT NULL,
  memory_limit_bytes INTEGER NOT NULL,
  overhead_ms REAL NOT NULL,
  oom INTEGER NOT NULL,
  timed_out INTEGER NOT NULL,
  message TEXT,
  started_at INTEGER NOT NULL
);
CREATE INDEX execs_by_conversation ON execs (conversation_id, id);
CREATE TABLE artifacts (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  conversation_id TEXT NOT NULL REFERENCES conversations(id),
  turn INTEGER NOT NULL,
  name TEXT NOT NULL,
  type TEXT NOT NULL,
  size_bytes INTEGER NOT NULL,
  location TEXT NOT NULL,
  created_at INTEGER NOT NULL
);
CREATE INDEX artifacts_by_conversation ON artifacts (conversation_id, id);
CREATE TABLE sandbox_references (
  conversation_id TEXT PRIMARY KEY REFERENCES conversations(id),
  state TEXT NOT NULL,
  sandbox_id TEXT NOT NULL,
  last_used_at INTEGER,
  files TEXT NOT NULL
);
)sql",
                                                         R"sql(
ALTER TABLE conversations ADD COLUMN owner TEXT NOT NULL DEFAULT 'local';
CREATE INDEX conversations_by_owner ON conversations (owner, updated_at, id);
CREATE TABLE turns (
  conversation_id TEXT NOT NULL REFERENCES conversations(id),
  number INTEGER NOT NULL,
  kind TEXT NOT NULL CHECK (kind IN ('ask', 'cell')),
  status TEXT NOT NULL
    CHECK (status IN ('running', 'completed', 'failed', 'cancelled', 'interrupted')),
  error TEXT NOT NULL DEFAULT '',
  started_at INTEGER NOT NULL,
  finished_at INTEGER,
  PRIMARY KEY (conversation_id, number)
) WITHOUT ROWID;
CREATE INDEX turns_running ON turns (status) WHERE status = 'running';
-- Turns begun before turns were recorded: how each ended is not known, only that it did.
INSERT INTO turns (conversation_id, number, kind, status, error, started_at, finished_at)
  SELECT conversation_id, turn, 'ask', 'completed', '', min(created_at), max(created_at)
  FROM messages GROUP BY conversation_id, turn;
ALTER TABLE messages ADD COLUMN details TEXT;
ALTER TABLE execs ADD COLUMN tool_call_id TEXT NOT NULL DEFAULT '';
ALTER TABLE execs ADD COLUMN tool TEXT NOT NULL DEFAULT '';
ALTER TABLE artifacts ADD COLUMN tool_call_id TEXT NOT NULL DEFAULT '';
CREATE TABLE stream_events (
  conversation_id TEXT NOT NULL REFERENCES conversations(id),
  turn INTEGER NOT NULL,
  seq INTEGER NOT NULL,
  type TEXT NOT NULL,
  data TEXT NOT NULL,
  PRIMARY KEY (conversation_id, turn, seq)
) WITHOUT ROWID;
)sql",
                                                         R"sql(
-- Version 3: what a sandbox's Python kernel holds, told when it is gone.
ALTER TABLE sandbox_references ADD COLUMN kernel_names TEXT NOT NULL DEFAULT '[]';
)sql",
                                                         R"sql(
-- Version 4: the connections each exec's sandbox refused it (network allowlist).
ALTER TABLE execs ADD COLUMN denied_connections INTEGER NOT NULL DEFAULT 0;
ALTER TABLE execs ADD COLUMN denials TEXT NOT NULL DEFAULT '[]';
-- NULL: the server's sandbox.network; 'none'; or the allowed domains, separated by spaces.
ALTER TABLE conversations ADD COLUMN network TEXT;
)sql",
                                                         R"sql(
-- Version 5: the extra Python packages a conversation's sandboxes have.
ALTER TABLE conversations ADD COLUMN packages TEXT NOT NULL DEFAULT '[]';
)sql",
                                                         R"sql(
-- Version 6: which process is the sandbox's Python kernel, so that another quarry process
-- sharing this history knows it did not start it.
ALTER TABLE sandbox_references ADD COLUMN kernel TEXT NOT NULL DEFAULT '';
)sql"};

static_assert(kMigrations.size() == SqliteHistoryStore::kSchemaVersion,
              "one migration per schema version");

// Every table holding rows of a conversation, children before the conversations table.
constexpr std::array<std::string_view, 7> kConversationTables = {
    "stream_events", "turns", "messages", "events", "execs", "artifacts", "sandbox_references"};

// BEGIN IMMEDIATE ... COMMIT, rolled back if not committed: several statements become one
// atomic write.
class Transaction {
 public:
  explicit Transaction(sqlite3* db) : db_(db) {
    rc_ = sqlite3_exec(db_, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr);
  }
  ~Transaction() {
    if (rc_ == SQLITE_OK && !committed_) sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
  }
  int begin_result() const { return rc_; }
  // A COMMIT that fails (the database busy or full) leaves the transaction to be rolled back.
  int commit() {
    const int rc = sqlite3_exec(db_, "COMMIT", nullptr, nullptr, nullptr);
    committed_ = rc == SQLITE_OK;
    return rc;
  }

 private:
  sqlite3* db_;
  int rc_;
  bool committed_ = false;
};

// A prepared statement that finalizes itself; bind and column indexes are 1- and 0-based as in
// SQLite.
class Statement {
 public:
  Statement(sqlite3* db, std::string_view sql) : db_(db) {
    rc_ = sqlite3_prepare_v2(db, sql.data(), static_cast<int>(sql.size()), &statement_, nullptr);
  }
  ~Statement() { sqlite3_finalize(statement_); }
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;

  int prepare_result() const { return rc_; }
  Statement& bind(int index, std::string_view text) {
    // An empty view may have no data: bound as NULL, which NOT NULL columns refuse.
    sqlite3_bind_text(statement_, index, text.empty() ? "" : text.data(),
                      static_cast<int>(text.size()), SQLITE_TRANSIENT);
    return *this;
  }
  Statement& bind(int index, int64_t value) {
    sqlite3_bind_int64(statement_, index, value);
    return *this;
  }
  Statement& bind(int index, double value) {
    sqlite3_bind_double(statement_, index, value);
    return *this;
  }
  Statement& bind_null(int index) {
    sqlite3_bind_null(statement_, index);
    return *this;
  }
  // NULL when there is no value.
  template <typename T>
  Statement& bind(int index, const std::optional<T>& value) {
    return value ? bind(index, *value) : bind_null(index);
  }
  // SQLITE_ROW, SQLITE_DONE or an error code.
  int step() { return sqlite3_step(statement_); }

  std::string text(int column) const {
    auto* data = reinterpret_cast<const char*>(sqlite3_column_text(statement_, column));
    return data ? std::string(data, static_cast<size_t>(sqlite3_column_bytes(statement_, column)))
                : std::string();
  }
  int64_t integer(int column) const { return sqlite3_column_int64(statement_, column); }
  double real(int column) const { return sqlite3_column_double(statement_, column); }
  bool boolean(int column) const { return integer(column) != 0; }
  bool is_null(int column) const { return sqlite3_column_type(statement_, column) == SQLITE_NULL; }

 private:
  sqlite3* db_;
  sqlite3_stmt* statement_ = nullptr;
  int rc_ = SQLITE_OK;
};

// flock on a file per conversation: works across processes, and the kernel releases it when
// the holder dies, so a crashed turn never leaves its conversation locked.
class FileTurnLock final : public TurnLock {
 public:
  explicit FileTurnLock(UniqueFd fd) : fd_(std::move(fd)) {}

 private:
  UniqueFd fd_;
};

// The executions an ExecQuery selects: FROM and WHERE over execs e joined with conversations c,
// naming only the filters the query has (so SQLite can use the indexes); parameters 1 to 3 are
// the owner, the conversation and the id bound.
std::string exec_filter(const ExecQuery& query) {
  std::string sql = "FROM execs e JOIN conversations c ON c.id = e.conversation_id WHERE 1";
  if (query.owner) sql += " AND c.owner = ?1";
  if (query.conversation_id) sql += " AND e.conversation_id = ?2";
  if (query.before_id) sql += " AND e.id < ?3";
  return sql;
}

void bind_exec_filter(Statement& statement, const ExecQuery& query) {
  if (query.owner) statement.bind(1, *query.owner);
  if (query.conversation_id) statement.bind(2, *query.conversation_id);
  if (query.before_id) statement.bind(3, *query.before_id);
}

// SQLite's LIMIT for "at most `limit`", where 0 means no limit.
int64_t sql_limit(size_t limit) {
  return limit == 0 ? -1 : static_cast<int64_t>(limit);
}

}  // namespace

std::unexpected<Error> SqliteHistoryStore::sql_error(int rc, std::string_view what) const {
  const bool damaged = rc == SQLITE_CORRUPT || rc == SQLITE_NOTADB;
  const ErrorCode code = damaged             ? ErrorCode::kFailedPrecondition
                         : rc == SQLITE_BUSY ? ErrorCode::kUnavailable
                         : rc == SQLITE_FULL ? ErrorCode::kResourceExhausted
                                             : ErrorCode::kInternal;
  return make_error(code, "{} in the history database '{}' failed: {}{}", what, path_.string(),
                    sqlite3_errstr(rc),
                    damaged ? " (the file is damaged; quarry left it as it is: move it aside to "
                              "start a new history, or restore a backup)"
                            : "");
}

SqliteHistoryStore::SqliteHistoryStore(sqlite3* db, std::filesystem::path path, const Clock& clock)
    : db_(db), path_(std::move(path)), clock_(clock) {}

SqliteHistoryStore::~SqliteHistoryStore() {
  sqlite3_close_v2(db_);
}

Result<std::unique_ptr<SqliteHistoryStore>> SqliteHistoryStore::open(
    const std::filesystem::path& path, const Clock& clock) {
  // Refuse a file that is not SQLite at all before SQLite gets a chance to touch it.
  std::error_code error;
  if (std::filesystem::exists(path, error) && std::filesystem::file_size(path, error) > 0) {
    std::ifstream file(path, std::ios::binary);
    char header[16] = {};
    file.read(header, sizeof header);
    if (std::string_view(header, sizeof header) != std::string_view("SQLite format 3\0", 16)) {
      return make_error(ErrorCode::kFailedPrecondition,
                        "'{}' is not a quarry history database (it is not an SQLite file); "
                        "quarry left it as it is: move it aside or choose another --state-dir",
                        path.string());
    }
  }
  // Only its owner may read it (SQLite gives its -wal and -shm files the same mode): made so,
  // and so made again if an older quarry left it readable to all.
  if (UniqueFd made(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
      !made && errno == EEXIST) {
    if (::chmod(path.c_str(), 0600) != 0) return errno_error("chmod '{}'", path.string());
  }
  sqlite3* db = nullptr;
  int rc =
      sqlite3_open_v2(path.c_str(), &db,
                      SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX, nullptr);
  std::unique_ptr<SqliteHistoryStore> store(new SqliteHistoryStore(db, path, clock));
  if (rc != SQLITE_OK) return store->sql_error(rc, "opening");
  sqlite3_busy_timeout(db, 5000);
  RETURN_IF_ERROR(store->migrate());
  return store;
}

Result<void> SqliteHistoryStore::migrate() {
  auto pragma_number = [&](std::string_view pragma) -> Result<int64_t> {
    Statement statement(db_, fmt::format("PRAGMA {}", pragma));
    if (statement.prepare_result() != SQLITE_OK) {
      return sql_error(statement.prepare_result(), "reading the schema version");
    }
    int rc = statement.step();
    if (rc != SQLITE_ROW) return sql_error(rc, "reading the schema version");
    return statement.integer(0);
  };
  ASSIGN_OR_RETURN(int64_t version, pragma_number("user_version"));
  ASSIGN_OR_RETURN(int64_t application, pragma_number("application_id"));
  ASSIGN_OR_RETURN(int64_t pages, pragma_number("page_count"));
  if (version > kSchemaVersion) {
    return make_error(ErrorCode::kFailedPrecondition,
                      "the history database '{}' has schema version {}, newer than this quarry "
                      "understands ({}); quarry left it as it is: upgrade quarry, or use another "
                      "--state-dir",
                      path_.string(), version, kSchemaVersion);
  }
  if (application != kApplicationId && (version != 0 || pages > 0)) {
    return make_error(ErrorCode::kFailedPrecondition,
                      "'{}' is an SQLite database of another application, not quarry's history; "
                      "quarry left it as it is: move it aside or choose another --state-dir",
                      path_.string());
  }
  if (version > 0) {
    Statement check(db_, "PRAGMA quick_check");
    int rc = check.step();
    if (rc != SQLITE_ROW) return sql_error(rc, "checking");
    if (check.text(0) != "ok") {
      return make_error(ErrorCode::kFailedPrecondition,
                        "the history database '{}' is damaged ({}); quarry left it as it is: "
                        "move it aside to start a new history, or restore a backup",
                        path_.string(), check.text(0));
    }
  }
  char* message = nullptr;
  auto exec = [&](std::string_view sql, std::string_view what) -> Result<void> {
    int rc = sqlite3_exec(db_, std::string(sql).c_str(), nullptr, nullptr, &message);
    if (rc != SQLITE_OK) {
      std::string detail = message ? message : sqlite3_errstr(rc);
      sqlite3_free(message);
      return make_error(ErrorCode::kInternal, "{} in the history database '{}' failed: {}", what,
                        path_.string(), detail);
    }
    return {};
  };
  // WAL: readers do not block the writer, and a killed writer leaves the last committed state.
  RETURN_IF_ERROR(
      exec("PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; "
           "PRAGMA foreign_keys=ON",
           "configuring"));
  for (int64_t next = version + 1; next <= kSchemaVersion; ++next) {
    // One transaction a version: a migration is applied whole or not at all.
    Transaction transaction(db_);
    if (transaction.begin_result() != SQLITE_OK) {
      return sql_error(transaction.begin_result(), "starting a migration");
    }
    RETURN_IF_ERROR(exec(kMigrations[static_cast<size_t>(next - 1)],
                         fmt::format("migrating to schema version {}", next)));
    RETURN_IF_ERROR(
        exec(fmt::format("PRAGMA user_version={}; PRAGMA application_id={}", next, kApplicationId),
             "recording the schema version"));
    if (int rc = transaction.commit(); rc != SQLITE_OK) {
      return sql_error(rc, "finishing a migration");
    }
  }
  return {};
}

Result<std::unique_ptr<TurnLock>> SqliteHistoryStore::try_lock_turn(
    std::string_view conversation_id) {
  if (!valid_conversation_id(conversation_id)) {
    return make_error(ErrorCode::kInvalidArgument, "bad conversation id '{}'", conversation_id);
  }
  auto directory = path_.parent_path() / "turn-locks";
  RETURN_IF_ERROR(make_directories(directory, 0700));
  auto file = directory / fmt::format("{}.lock", conversation_id);
  UniqueFd fd(::open(file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
  if (!fd) return errno_error("open '{}'", file.string());
  if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK) {
      return make_error(ErrorCode::kAborted,
                        "conversation {} already has a turn running; wait for it to finish, "
                        "then send this message again",
                        conversation_id);
    }
    return errno_error("flock '{}'", file.string());
  }
  return std::make_unique<FileTurnLock>(std::move(fd));
}

Result<Conversation> SqliteHistoryStore::create_conversation(
    std::string_view title, std::string_view owner, const std::optional<NetworkPolicy>& network,
    const std::vector<std::string>& packages) {
  std::lock_guard lock(mutex_);
  Conversation conversation{random_id(),  std::string(title), 0,       clock_.now(),
                            clock_.now(), std::string(owner), network, packages};
  Statement insert(db_,
                   "INSERT INTO conversations (id, title, turns, created_at, updated_at, owner, "
                   "network, packages) VALUES (?, ?, 0, ?, ?, ?, ?, ?)");
  insert.bind(1, conversation.id)
      .bind(2, conversation.title)
      .bind(3, to_unix_ms(conversation.created_at))
      .bind(4, to_unix_ms(conversation.updated_at))
      .bind(5, conversation.owner)
      .bind(7, json_text(conversation.packages));
  if (network) {
    insert.bind(6, network_text(*network));
  } else {
    insert.bind_null(6);
  }
  if (int rc = insert.step(); rc != SQLITE_DONE) return sql_error(rc, "creating a conversation");
  return conversation;
}

Result<Conversation> SqliteHistoryStore::conversation(std::string_view id) {
  std::lock_guard lock(mutex_);
  Statement select(db_,
                   fmt::format("SELECT {} FROM conversations WHERE id = ?", kConversationColumns));
  select.bind(1, id);
  int rc = select.step();
  if (rc == SQLITE_DONE) {
    return make_error(ErrorCode::kNotFound, "no conversation '{}' (see quarry conversations ls)",
                      id);
  }
  if (rc != SQLITE_ROW) return sql_error(rc, "reading a conversation");
  return conversation_from(select);
}

Result<std::vector<Conversation>> SqliteHistoryStore::conversations(
    const ConversationQuery& query) {
  std::lock_guard lock(mutex_);
  // One owner's page is a range of the index (owner, updated_at, id).
  Statement select(db_, fmt::format("SELECT {} FROM conversations WHERE {}(updated_at, id) < (?2, "
                                    "?3) ORDER BY updated_at DESC, id DESC LIMIT ?4",
                                    kConversationColumns, query.owner ? "owner = ?1 AND " : ""));
  if (query.owner) select.bind(1, *query.owner);
  if (query.after) {
    select.bind(2, to_unix_ms(query.after->first)).bind(3, query.after->second);
  } else {
    select.bind(2, std::numeric_limits<int64_t>::max()).bind(3, std::string_view());
  }
  select.bind(4, sql_limit(query.limit));
  std::vector<Conversation> list;
  int rc;
  while ((rc = select.step()) == SQLITE_ROW)
    list.push_back(conversation_from(select));
  if (rc != SQLITE_DONE) return sql_error(rc, "listing conversations");
  return list;
}

Result<void> SqliteHistoryStore::name_conversation(std::string_view id, std::string_view title) {
  std::lock_guard lock(mutex_);
  Statement update(db_, "UPDATE conversations SET title = ? WHERE id = ? AND title = ''");
  update.bind(1, title).bind(2, id);
  if (int rc = update.step(); rc != SQLITE_DONE) return sql_error(rc, "naming a conversation");
  return {};
}

Result<void> SqliteHistoryStore::delete_conversation(std::string_view id) {
  std::lock_guard lock(mutex_);
  Transaction transaction(db_);
  if (transaction.begin_result() != SQLITE_OK) {
    return sql_error(transaction.begin_result(), "deleting a conversation");
  }
  for (std::string_view table : kConversationTables) {
    Statement remove(db_, fmt::format("DELETE FROM {} WHERE conversation_id = ?", table));
    remove.bind(1, id);
    if (int rc = remove.step(); rc != SQLITE_DONE) return sql_error(rc, "deleting a conversation");
  }
  Statement remove(db_, "DELETE FROM conversations WHERE id = ?");
  remove.bind(1, id);
  if (int rc = remove.step(); rc != SQLITE_DONE) return sql_error(rc, "deleting a conversation");
  if (sqlite3_changes(db_) == 0) {
    return make_error(ErrorCode::kNotFound, "no conversation '{}'", id);
  }
  if (int rc = transaction.commit(); rc != SQLITE_OK) {
    return sql_error(rc, "deleting a conversation");
  }
  // The caller holds the turn lock; a process that opens the file after this makes a new one
  // and then finds no conversation.
  ::unlink((path_.parent_path() / "turn-locks" / fmt::format("{}.lock", id)).c_str());
  return {};
}

Result<void> SqliteHistoryStore::touch(std::string_view conversation_id, int64_t now_ms) {
  Statement update(db_, "UPDATE conversations SET updated_at = ? WHERE id = ?");
  update.bind(1, now_ms).bind(2, conversation_id);
  if (int rc = update.step(); rc != SQLITE_DONE) return sql_error(rc, "updating a conversation");
  if (sqlite3_changes(db_) == 0) {
    return make_error(ErrorCode::kNotFound, "no conversation '{}'", conversation_id);
  }
  return {};
}

Result<int> SqliteHistoryStore::begin_turn(std::string_view conversation_id, TurnKind kind) {
  std::lock_guard lock(mutex_);
  Transaction transaction(db_);
  if (transaction.begin_result() != SQLITE_OK) {
    return sql_error(transaction.begin_result(), "starting a turn");
  }
  const int64_t now = to_unix_ms(clock_.now());
  int turn = 0;
  {
    Statement update(db_,
                     "UPDATE conversations SET turns = turns + 1, updated_at = ? WHERE id = ? "
                     "RETURNING turns");
    update.bind(1, now).bind(2, conversation_id);
    int rc = update.step();
    if (rc == SQLITE_DONE) {
      return make_error(ErrorCode::kNotFound, "no conversation '{}' (see quarry conversations ls)",
                        conversation_id);
    }
    if (rc != SQLITE_ROW) return sql_error(rc, "starting a turn");
    turn = static_cast<int>(update.integer(0));
    update.step();
  }
  Statement insert(db_,
                   "INSERT INTO turns (conversation_id, number, kind, status, started_at) "
                   "VALUES (?, ?, ?, 'running', ?)");
  insert.bind(1, conversation_id).bind(2, int64_t{turn}).bind(3, to_string(kind)).bind(4, now);
  if (int rc = insert.step(); rc != SQLITE_DONE) return sql_error(rc, "starting a turn");
  if (int rc = transaction.commit(); rc != SQLITE_OK) return sql_error(rc, "starting a turn");
  return turn;
}

Result<void> SqliteHistoryStore::finish_turn(std::string_view conversation_id, int turn,
                                             TurnStatus status, std::string_view error) {
  std::lock_guard lock(mutex_);
  Statement update(db_,
                   "UPDATE turns SET status = ?, error = ?, finished_at = ? "
                   "WHERE conversation_id = ? AND number = ?");
  update.bind(1, to_string(status))
      .bind(2, error)
      .bind(3, to_unix_ms(clock_.now()))
      .bind(4, conversation_id)
      .bind(5, int64_t{turn});
  if (int rc = update.step(); rc != SQLITE_DONE) return sql_error(rc, "finishing a turn");
  if (sqlite3_changes(db_) == 0) {
    return make_error(ErrorCode::kNotFound, "conversation '{}' has no turn {}", conversation_id,
                      turn);
  }
  return {};
}

Result<std::vector<std::pair<std::string, TurnRecord>>> SqliteHistoryStore::unfinished_turns() {
  std::lock_guard lock(mutex_);
  Statement select(db_, fmt::format("SELECT conversation_id, {} FROM turns "
                                    "WHERE status = 'running' ORDER BY conversation_id, number",
                                    kTurnColumns));
  std::vector<std::pair<std::string, TurnRecord>> list;
  int rc;
  while ((rc = select.step()) == SQLITE_ROW)
    list.emplace_back(select.text(0), turn_from(select, 1));
  if (rc != SQLITE_DONE) return sql_error(rc, "reading unfinished turns");
  return list;
}

// One INSERT of a conversation's row, in a transaction with the conversation's updated_at
// (kNotFound for an unknown conversation). `bind` fills the statement's parameters.
template <typename Bind>
Result<int64_t> SqliteHistoryStore::insert(std::string_view conversation_id, std::string_view what,
                                           std::string_view sql, Clock::time_point now,
                                           Bind&& bind) {
  std::lock_guard lock(mutex_);
  Transaction transaction(db_);
  if (transaction.begin_result() != SQLITE_OK) return sql_error(transaction.begin_result(), what);
  RETURN_IF_ERROR(touch(conversation_id, to_unix_ms(now)));
  Statement statement(db_, sql);
  bind(statement);
  if (int rc = statement.step(); rc != SQLITE_DONE) return sql_error(rc, what);
  const int64_t id = sqlite3_last_insert_rowid(db_);
  if (int rc = transaction.commit(); rc != SQLITE_OK) return sql_error(rc, what);
  return id;
}

Result<Message> SqliteHistoryStore::append_message(std::string_view conversation_id,
                                                   Message message) {
  message.created_at = clock_.now();
  ASSIGN_OR_RETURN(message.id,
                   insert(conversation_id, "recording a message",
                          "INSERT INTO messages (conversation_id, turn, role, content, tool_calls, "
                          "tool_call_id, details, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                          message.created_at, [&](Statement& insert) {
                            insert.bind(1, conversation_id)
                                .bind(2, int64_t{message.turn})
                                .bind(3, to_string(message.role))
                                .bind(4, message.content);
                            if (message.tool_calls.is_null()) {
                              insert.bind_null(5);
                            } else {
                              insert.bind(5, json_text(message.tool_calls));
                            }
                            if (message.tool_call_id.empty()) {
                              insert.bind_null(6);
                            } else {
                              insert.bind(6, message.tool_call_id);
                            }
                            if (message.details.is_null()) {
                              insert.bind_null(7);
                            } else {
                              insert.bind(7, json_text(message.details));
                            }
                            insert.bind(8, to_unix_ms(message.created_at));
                          }));
  return message;
}

Result<Event> SqliteHistoryStore::record_event(std::string_view conversation_id, Event event) {
  event.created_at = clock_.now();
  ASSIGN_OR_RETURN(
      event.id,
      insert(conversation_id, "recording an event",
             "INSERT INTO events (conversation_id, turn, kind, sandbox_id, reason, details, "
             "created_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
             event.created_at, [&](Statement& insert) {
               insert.bind(1, conversation_id)
                   .bind(2, int64_t{event.turn})
                   .bind(3, event.kind)
                   .bind(4, event.sandbox_id)
                   .bind(5, event.reason)
                   .bind(6, event.details.is_null() ? std::string("{}") : event.details.dump())
                   .bind(7, to_unix_ms(event.created_at));
             }));
  return event;
}

Result<ExecRecord> SqliteHistoryStore::record_exec(std::string_view conversation_id,
                                                   ExecRecord exec) {
  const auto& r = exec.result;
  ASSIGN_OR_RETURN(
      exec.id,
      insert(conversation_id, "recording an exec",
             "INSERT INTO execs (conversation_id, turn, tool_call_id, tool, sandbox_id, command, "
             "exit_code, signal, stdout, stderr, truncated, run_ms, cpu_ms, peak_memory_bytes, "
             "memory_limit_bytes, overhead_ms, oom, timed_out, message, started_at, "
             "denied_connections, denials) "
             "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
             clock_.now(), [&](Statement& insert) {
               insert.bind(1, conversation_id)
                   .bind(2, int64_t{exec.turn})
                   .bind(3, exec.tool_call_id)
                   .bind(4, exec.tool)
                   .bind(5, exec.sandbox_id)
                   .bind(6, exec.command)
                   .bind(7, int64_t{r.exit_code});
               if (r.signal) {
                 insert.bind(8, int64_t{*r.signal});
               } else {
                 insert.bind_null(8);
               }
               insert.bind(9, r.stdout_text)
                   .bind(10, r.stderr_text)
                   .bind(11, int64_t{r.truncated})
                   .bind(12, r.run_ms)
                   .bind(13, r.cpu_ms)
                   .bind(14, static_cast<int64_t>(r.peak_memory_bytes))
                   .bind(15, static_cast<int64_t>(r.memory_limit_bytes))
                   .bind(16, r.overhead_ms)
                   .bind(17, int64_t{r.oom})
                   .bind(18, int64_t{r.timed_out})
                   .bind(19, r.message)
                   .bind(20, to_unix_ms(exec.started_at))
                   .bind(21, static_cast<int64_t>(r.denied_connections))
                   .bind(22, sandbox::denials_json(r.denials).dump());
             }));
  return exec;
}

Result<Artifact> SqliteHistoryStore::record_artifact(std::string_view conversation_id,
                                                     Artifact artifact) {
  artifact.created_at = clock_.now();
  ASSIGN_OR_RETURN(
      artifact.id,
      insert(conversation_id, "recording an artifact",
             "INSERT INTO artifacts (conversation_id, turn, tool_call_id, name, type, size_bytes, "
             "location, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
             artifact.created_at, [&](Statement& insert) {
               insert.bind(1, conversation_id)
                   .bind(2, int64_t{artifact.turn})
                   .bind(3, artifact.tool_call_id)
                   .bind(4, artifact.name)
                   .bind(5, artifact.type)
                   .bind(6, static_cast<int64_t>(artifact.size_bytes))
                   .bind(7, artifact.location)
                   .bind(8, to_unix_ms(artifact.created_at));
             }));
  return artifact;
}

// Every row a SELECT over one conversation returns (its only parameter is the conversation's
// id), each turned into a T by `read`.
template <typename T, typename Read>
Result<std::vector<T>> SqliteHistoryStore::select_all(std::string_view conversation_id,
                                                      std::string_view what, std::string_view sql,
                                                      Read&& read) {
  std::lock_guard lock(mutex_);
  Statement select(db_, sql);
  select.bind(1, conversation_id);
  std::vector<T> rows;
  int rc;
  while ((rc = select.step()) == SQLITE_ROW)
    rows.push_back(read(select));
  if (rc != SQLITE_DONE) return sql_error(rc, what);
  return rows;
}

Result<std::vector<TurnRecord>> SqliteHistoryStore::turns(std::string_view conversation_id) {
  return select_all<TurnRecord>(
      conversation_id, "reading turns",
      fmt::format("SELECT {} FROM turns WHERE conversation_id = ? ORDER BY number", kTurnColumns),
      [](const Statement& row) { return turn_from(row, 0); });
}

Result<std::vector<Message>> SqliteHistoryStore::messages(std::string_view conversation_id) {
  return select_all<Message>(
      conversation_id, "reading messages",
      fmt::format("SELECT {} FROM messages WHERE conversation_id = ? ORDER BY id", kMessageColumns),
      message_from<Statement>);
}

Result<std::vector<Event>> SqliteHistoryStore::events(std::string_view conversation_id) {
  return select_all<Event>(
      conversation_id, "reading events",
      fmt::format("SELECT {} FROM events WHERE conversation_id = ? ORDER BY id", kEventColumns),
      event_from<Statement>);
}

Result<std::vector<ExecRecord>> SqliteHistoryStore::execs(std::string_view conversation_id) {
  return select_all<ExecRecord>(conversation_id, "reading execs",
                                fmt::format("SELECT {} FROM execs WHERE conversation_id = ? "
                                            "ORDER BY id",
                                            exec_columns(true)),
                                [](const Statement& row) { return exec_from(row, 0); });
}

Result<std::vector<Artifact>> SqliteHistoryStore::artifacts(std::string_view conversation_id) {
  return select_all<Artifact>(
      conversation_id, "reading artifacts",
      fmt::format("SELECT {} FROM artifacts WHERE conversation_id = ? ORDER BY id",
                  kArtifactColumns),
      [](const Statement& row) { return artifact_from(row, 0); });
}

Result<std::pair<std::string, Artifact>> SqliteHistoryStore::artifact(int64_t id) {
  std::lock_guard lock(mutex_);
  Statement select(
      db_, fmt::format("SELECT conversation_id, {} FROM artifacts WHERE id = ?", kArtifactColumns));
  select.bind(1, id);
  int rc = select.step();
  if (rc == SQLITE_DONE) return make_error(ErrorCode::kNotFound, "no artifact {}", id);
  if (rc != SQLITE_ROW) return sql_error(rc, "reading an artifact");
  return std::pair{select.text(0), artifact_from(select, 1)};
}

Result<std::vector<std::pair<std::string, ExecRecord>>> SqliteHistoryStore::find_execs(
    const ExecQuery& query) {
  std::lock_guard lock(mutex_);
  Statement select(db_, fmt::format("SELECT e.conversation_id, {} {} ORDER BY e.id DESC LIMIT ?4",
                                    exec_columns(false, "e."), exec_filter(query)));
  bind_exec_filter(select, query);
  select.bind(4, sql_limit(query.limit));
  std::vector<std::pair<std::string, ExecRecord>> list;
  int rc;
  while ((rc = select.step()) == SQLITE_ROW)
    list.emplace_back(select.text(0), exec_from(select, 1));
  if (rc != SQLITE_DONE) return sql_error(rc, "reading execs");
  return list;
}

Result<ExecTotals> SqliteHistoryStore::exec_totals(const ExecQuery& query) {
  std::lock_guard lock(mutex_);
  Statement select(db_, fmt::format("SELECT count(*), total(e.run_ms), total(e.cpu_ms), "
                                    "total(e.overhead_ms), coalesce(max(e.peak_memory_bytes), 0), "
                                    "total(e.oom), total(e.timed_out), total(e.exit_code != 0) {}",
                                    exec_filter(query)));
  bind_exec_filter(select, query);
  if (int rc = select.step(); rc != SQLITE_ROW) return sql_error(rc, "adding up execs");
  return ExecTotals{select.integer(0),
                    select.real(1),
                    select.real(2),
                    select.real(3),
                    static_cast<uint64_t>(select.integer(4)),
                    static_cast<int64_t>(select.real(5)),
                    static_cast<int64_t>(select.real(6)),
                    static_cast<int64_t>(select.real(7))};
}

Result<void> SqliteHistoryStore::append_stream_event(std::string_view conversation_id,
                                                     const StreamEvent& event) {
  std::lock_guard lock(mutex_);
  Statement insert(db_,
                   "INSERT INTO stream_events (conversation_id, turn, seq, type, data) "
                   "VALUES (?, ?, ?, ?, ?)");
  insert.bind(1, conversation_id)
      .bind(2, int64_t{event.turn})
      .bind(3, event.seq)
      .bind(4, event.type)
      .bind(5, event.data);
  if (int rc = insert.step(); rc != SQLITE_DONE) return sql_error(rc, "recording a stream event");
  return {};
}

Result<std::vector<StreamEvent>> SqliteHistoryStore::stream_events(std::string_view conversation_id,
                                                                   int turn, int64_t after_seq) {
  std::lock_guard lock(mutex_);
  Statement select(db_,
                   "SELECT turn, seq, type, data FROM stream_events WHERE conversation_id = ? "
                   "AND (turn, seq) > (?, ?) ORDER BY turn, seq");
  select.bind(1, conversation_id).bind(2, int64_t{turn}).bind(3, after_seq);
  std::vector<StreamEvent> list;
  int rc;
  while ((rc = select.step()) == SQLITE_ROW) {
    list.push_back(
        {static_cast<int>(select.integer(0)), select.integer(1), select.text(2), select.text(3)});
  }
  if (rc != SQLITE_DONE) return sql_error(rc, "reading stream events");
  return list;
}

Result<SandboxReference> SqliteHistoryStore::sandbox_reference(std::string_view conversation_id) {
  std::lock_guard lock(mutex_);
  Statement select(db_, fmt::format("SELECT {} FROM sandbox_references WHERE conversation_id = ?",
                                    kReferenceColumns));
  select.bind(1, conversation_id);
  int rc = select.step();
  if (rc == SQLITE_DONE) return SandboxReference{};  // never had a sandbox: "new"
  if (rc != SQLITE_ROW) return sql_error(rc, "reading a sandbox reference");
  return reference_from(select, 0);
}

Result<void> SqliteHistoryStore::set_sandbox_reference(std::string_view conversation_id,
                                                       const SandboxReference& reference) {
  std::lock_guard lock(mutex_);
  Statement upsert(db_,
                   "INSERT INTO sandbox_references (conversation_id, state, sandbox_id, "
                   "last_used_at, files, kernel_names, kernel) VALUES (?, ?, ?, ?, ?, ?, ?) "
                   "ON CONFLICT (conversation_id) DO UPDATE SET state = excluded.state, "
                   "sandbox_id = excluded.sandbox_id, last_used_at = excluded.last_used_at, "
                   "files = excluded.files, kernel_names = excluded.kernel_names, "
                   "kernel = excluded.kernel");
  upsert.bind(1, conversation_id).bind(2, reference.state).bind(3, reference.sandbox_id);
  if (reference.last_used_at) {
    upsert.bind(4, to_unix_ms(*reference.last_used_at));
  } else {
    upsert.bind_null(4);
  }
  upsert.bind(5, nlohmann::json(reference.files).dump());
  upsert.bind(6, nlohmann::json(reference.kernel_names).dump());
  upsert.bind(7, reference.kernel);
  if (int rc = upsert.step(); rc != SQLITE_DONE) {
    return sql_error(rc, "recording a sandbox reference");
  }
  return {};
}

Result<std::vector<std::pair<std::string, SandboxReference>>>
SqliteHistoryStore::sandbox_references(const std::optional<std::string>& owner) {
  std::lock_guard lock(mutex_);
  Statement select(db_, fmt::format("SELECT r.conversation_id, {} FROM sandbox_references r "
                                    "JOIN conversations c ON c.id = r.conversation_id {}"
                                    "ORDER BY r.conversation_id",
                                    kReferenceColumns, owner ? "WHERE c.owner = ?1 " : ""));
  if (owner) select.bind(1, *owner);
  std::vector<std::pair<std::string, SandboxReference>> list;
  int rc;
  while ((rc = select.step()) == SQLITE_ROW) {
    list.emplace_back(select.text(0), reference_from(select, 1));
  }
  if (rc != SQLITE_DONE) return sql_error(rc, "reading sandbox references");
  return list;
}

}  // namespace quarry::conversation

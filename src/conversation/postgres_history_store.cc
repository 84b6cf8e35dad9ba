#include "conversation/postgres_history_store.h"

#include <fmt/ranges.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "common/file_util.h"
#include "common/random_id.h"
#include "common/sha256.h"
#include "common/unique_fd.h"
#include "conversation/history_columns.h"
#include "data/connection.h"
#include "sandbox/metering.h"

namespace quarry::conversation {

using Param = std::optional<std::string>;

// Connections to the history's database: idle ones kept for the next call, at most
// kMaxConnections counted calls at once (turn locks are not counted).
class PostgresConnections : public std::enable_shared_from_this<PostgresConnections> {
 public:
  // A connection taken from the pool, given back when the lease ends.
  class Lease {
   public:
    Lease(std::shared_ptr<PostgresConnections> owner, data::Connection connection, bool counted)
        : owner_(std::move(owner)), connection_(std::move(connection)), counted_(counted) {}
    Lease(Lease&&) = default;
    Lease& operator=(Lease&&) = delete;
    ~Lease() {
      if (owner_) owner_->give_back(std::move(*connection_), counted_, reusable_);
    }
    data::Connection* operator->() { return &*connection_; }
    data::Connection& operator*() { return *connection_; }
    // Closes the connection at the end instead of keeping it (its session holds something).
    void discard() { reusable_ = false; }

   private:
    std::shared_ptr<PostgresConnections> owner_;  // null once moved from
    std::optional<data::Connection> connection_;
    bool counted_;
    bool reusable_ = true;
  };

  explicit PostgresConnections(std::string url) : url_(std::move(url)) {}

  // Waits for a place when `counted` and kMaxConnections calls are running.
  Result<Lease> take(bool counted) {
    std::optional<data::Connection> connection;
    {
      std::unique_lock lock(mutex_);
      if (counted) {
        freed_.wait(lock, [&] { return busy_ < PostgresHistoryStore::kMaxConnections; });
        ++busy_;
      }
      if (!idle_.empty()) {
        connection.emplace(std::move(idle_.back()));
        idle_.pop_back();
      }
    }
    if (!connection) {
      auto opened = data::Connection::open(url_);
      if (!opened) {
        release_place(counted);
        return std::unexpected(
            opened.error().with_context("opening the history in PostgreSQL (conversations.url)"));
      }
      connection.emplace(std::move(*opened));
    }
    return Lease(shared_from_this(), std::move(*connection), counted);
  }

 private:
  void give_back(data::Connection connection, bool counted, bool reusable) {
    // A broken connection, or one left in a transaction (a failed ROLLBACK), is closed.
    const bool healthy = reusable && PQstatus(connection.get()) == CONNECTION_OK &&
                         PQtransactionStatus(connection.get()) == PQTRANS_IDLE;
    {
      std::lock_guard lock(mutex_);
      if (healthy && idle_.size() < PostgresHistoryStore::kMaxConnections) {
        idle_.push_back(std::move(connection));
      }
      if (counted) --busy_;
    }
    if (counted) freed_.notify_one();
  }

  void release_place(bool counted) {
    if (!counted) return;
    {
      std::lock_guard lock(mutex_);
      --busy_;
    }
    freed_.notify_one();
  }

  const std::string url_;
  std::mutex mutex_;
  std::condition_variable freed_;
  std::vector<data::Connection> idle_;
  size_t busy_ = 0;
};

namespace {

using Lease = PostgresConnections::Lease;
using Format = data::Connection::Format;

// Migration N takes the schema to version N from the one before it; the first one creates
// version 5 from nothing. Append only; never edit a shipped one. Ids of conversations compare
// bytewise (COLLATE "C"), as in SQLite, whatever the database's collation.
const std::map<int, std::string_view> kMigrations = {{5, R"sql(
CREATE TABLE conversations (
  id text COLLATE "C" PRIMARY KEY,
  title text NOT NULL,
  turns integer NOT NULL DEFAULT 0,
  created_at bigint NOT NULL,
  updated_at bigint NOT NULL,
  owner text NOT NULL DEFAULT 'local',
  -- NULL: the server's sandbox.network; 'none'; or the allowed domains, separated by spaces.
  network text,
  packages text NOT NULL DEFAULT '[]'
);
CREATE INDEX conversations_by_owner ON conversations (owner, updated_at, id);
CREATE INDEX conversations_by_activity ON conversations (updated_at, id);
CREATE TABLE turns (
  conversation_id text COLLATE "C" NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
  number integer NOT NULL,
  kind text NOT NULL CHECK (kind IN ('ask', 'cell')),
  status text NOT NULL
    CHECK (status IN ('running', 'completed', 'failed', 'cancelled', 'interrupted')),
  error text NOT NULL DEFAULT '',
  started_at bigint NOT NULL,
  finished_at bigint,
  PRIMARY KEY (conversation_id, number)
);
CREATE INDEX turns_running ON turns (conversation_id, number) WHERE status = 'running';
CREATE TABLE messages (
  id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  conversation_id text COLLATE "C" NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
  turn integer NOT NULL,
  role text NOT NULL CHECK (role IN ('user', 'assistant', 'tool')),
  content text NOT NULL,
  tool_calls text,
  tool_call_id text,
  details text,
  created_at bigint NOT NULL
);
CREATE INDEX messages_by_conversation ON messages (conversation_id, id);
CREATE TABLE events (
  id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  conversation_id text COLLATE "C" NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
  turn integer NOT NULL,
  kind text NOT NULL,
  sandbox_id text NOT NULL,
  reason text NOT NULL,
  details text NOT NULL,
  created_at bigint NOT NULL
);
CREATE INDEX events_by_conversation ON events (conversation_id, id);
CREATE TABLE execs (
  id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  conversation_id text COLLATE "C" NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
  turn integer NOT NULL,
  tool_call_id text NOT NULL DEFAULT '',
  tool text NOT NULL DEFAULT '',
  sandbox_id text NOT NULL,
  command text NOT NULL,
  exit_code integer NOT NULL,
  signal integer,
  stdout text NOT NULL,
  stderr text NOT NULL,
  truncated boolean NOT NULL,
  run_ms double precision NOT NULL,
  cpu_ms double precision NOT NULL,
  peak_memory_bytes bigint NOT NULL,
  memory_limit_bytes bigint NOT NULL,
  overhead_ms double precision NOT NULL,
  oom boolean NOT NULL,
  timed_out boolean NOT NULL,
  message text,
  started_at bigint NOT NULL,
  denied_connections bigint NOT NULL DEFAULT 0,
  denials text NOT NULL DEFAULT '[]'
);
CREATE INDEX execs_by_conversation ON execs (conversation_id, id);
CREATE TABLE artifacts (
  id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  conversation_id text COLLATE "C" NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
  turn integer NOT NULL,
  tool_call_id text NOT NULL DEFAULT '',
  name text NOT NULL,
  type text NOT NULL,
  size_bytes bigint NOT NULL,
  location text NOT NULL,
  created_at bigint NOT NULL
);
CREATE INDEX artifacts_by_conversation ON artifacts (conversation_id, id);
CREATE TABLE sandbox_references (
  conversation_id text COLLATE "C" PRIMARY KEY REFERENCES conversations(id) ON DELETE CASCADE,
  state text NOT NULL,
  sandbox_id text NOT NULL,
  last_used_at bigint,
  files text NOT NULL,
  kernel_names text NOT NULL DEFAULT '[]'
);
CREATE TABLE stream_events (
  conversation_id text COLLATE "C" NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
  turn integer NOT NULL,
  seq bigint NOT NULL,
  type text NOT NULL,
  data text NOT NULL,
  PRIMARY KEY (conversation_id, turn, seq)
);
)sql"},
                                                     {6, R"sql(
CREATE TABLE servers (
  boot_id text COLLATE "C" PRIMARY KEY,
  instance_id text NOT NULL,
  url text NOT NULL,
  started_at bigint NOT NULL,
  heartbeat_at bigint NOT NULL
);
)sql"},
                                                     {7, R"sql(
CREATE TABLE sandbox_places (
  key text COLLATE "C" PRIMARY KEY,
  server text COLLATE "C" NOT NULL,
  user_name text NOT NULL,
  account text NOT NULL,
  taken_at bigint NOT NULL
);
CREATE INDEX sandbox_places_by_server ON sandbox_places (server);
)sql"},
                                                     {8, R"sql(
-- The bytes of each artifact, so any server can serve what another collected (the artifact's
-- location is a path on the machine of the server that collected it). Artifacts recorded
-- before version 8 have no row here.
CREATE TABLE artifact_contents (
  artifact_id bigint PRIMARY KEY REFERENCES artifacts(id) ON DELETE CASCADE,
  content bytea NOT NULL
);
)sql"},
                                                     {9, R"sql(
-- Requests for room (request_room): every other server hears each, and the one that deletes its
-- row (claim_room) evicts, so one request costs one idle sandbox, not one on every server.
CREATE TABLE room_requests (
  id bigserial PRIMARY KEY,
  server text COLLATE "C" NOT NULL,
  user_name text NOT NULL,
  asked_at bigint NOT NULL
);
)sql"},
                                                     {10, R"sql(
-- The conversations deleted in the last 30 days: a server that was down when one was deleted
-- (and so did not hear it) removes its copies of the conversation's artifacts when it starts.
CREATE TABLE deleted_conversations (
  id text COLLATE "C" PRIMARY KEY,
  deleted_at bigint NOT NULL
);
)sql"},
                                                     {11, R"sql(
-- The sandbox each place is for, once it exists: a conversation whose turns go to another
-- server takes its sandbox's place along (keep_place), and whichever server destroys a sandbox
-- frees its place, so each sandbox is counted once.
ALTER TABLE sandbox_places ADD COLUMN sandbox_id text COLLATE "C" NOT NULL DEFAULT '';
CREATE INDEX sandbox_places_by_sandbox ON sandbox_places (sandbox_id) WHERE sandbox_id <> '';
)sql"},
                                                     {12, R"sql(
-- Which process is the sandbox's Python kernel (the provider's id for it), so that a server
-- that did not start it stops it before starting its own.
ALTER TABLE sandbox_references ADD COLUMN kernel text NOT NULL DEFAULT '';
)sql"}};

// The tables of the schema: one of them without schema_version is another application's.
constexpr std::string_view kTables =
    "{schema_version,conversations,turns,messages,events,execs,artifacts,sandbox_references,"
    "stream_events,servers,sandbox_places,artifact_contents,room_requests,deleted_conversations}";

// A 64-bit advisory lock key from a name.
int64_t advisory_key(std::string_view name) {
  const std::string hex = sha256_hex(name);
  uint64_t key = 0;
  std::from_chars(hex.data(), hex.data() + 16, key, 16);
  return static_cast<int64_t>(key);
}

// The channels of NOTIFY: stream events recorded, and cancels asked through any server.
constexpr std::string_view kStreamEventsChannel = "quarry_stream_events";
constexpr std::string_view kCancelsChannel = "quarry_turn_cancels";
constexpr std::string_view kRoomChannel = "quarry_room_requests";
constexpr std::string_view kDeletedChannel = "quarry_conversations_deleted";

// The database's clock in Unix milliseconds, so every server measures heartbeats alike.
constexpr std::string_view kNowMs = "(extract(epoch FROM clock_timestamp()) * 1000)::bigint";
// How long a request for room may be claimed: its turn asks again every second while it waits.
constexpr int64_t kRoomRequestLifetimeMs = 60'000;
// How long a deleted conversation is remembered for the servers that did not hear of it.
constexpr int64_t kDeletedLifetimeMs = 30LL * 24 * 3600 * 1000;

// Serialises the migrations of every server opening the same database.
const int64_t kMigrationLockKey = advisory_key("quarry history migrations");
// Serialises the taking of sandbox places, so each counts every place taken before it.
const int64_t kPlacesLockKey = advisory_key("quarry sandbox places");

// Text as PostgreSQL's text can hold it: valid UTF-8 without NUL bytes (each byte that is not
// part of a well-formed sequence, and each NUL, becomes U+FFFD).
std::string storable(std::string_view text) {
  constexpr std::string_view kReplacement = "\xEF\xBF\xBD";
  std::string out;
  out.reserve(text.size());
  size_t i = 0;
  while (i < text.size()) {
    const auto byte = static_cast<unsigned char>(text[i]);
    size_t length = 0;  // of the sequence it starts; 0 for NUL and bytes no sequence starts with
    if (byte != 0 && byte < 0x80) {
      length = 1;
    } else if (byte >= 0xC2 && byte <= 0xDF) {
      length = 2;
    } else if (byte >= 0xE0 && byte <= 0xEF) {
      length = 3;
    } else if (byte >= 0xF0 && byte <= 0xF4) {
      length = 4;
    }
    bool valid = length > 0 && i + length <= text.size();
    for (size_t k = 1; valid && k < length; ++k) {
      const auto next = static_cast<unsigned char>(text[i + k]);
      unsigned char low = 0x80, high = 0xBF;
      if (k == 1) {  // no overlong forms, no surrogates, nothing past U+10FFFF
        if (byte == 0xE0) low = 0xA0;
        if (byte == 0xED) high = 0x9F;
        if (byte == 0xF0) low = 0x90;
        if (byte == 0xF4) high = 0x8F;
      }
      valid = next >= low && next <= high;
    }
    if (valid) {
      out.append(text.substr(i, length));
      i += length;
    } else {
      out.append(kReplacement);
      ++i;
    }
  }
  return out;
}

Param text(std::string_view value) {
  return storable(value);
}
Param number(int64_t value) {
  return std::to_string(value);
}
Param real(double value) {
  return fmt::format("{}", value);
}
Param boolean(bool value) {
  return value ? "t" : "f";
}
template <typename T>
Param optional(const std::optional<T>& value) {
  if (!value) return std::nullopt;
  if constexpr (std::is_arithmetic_v<T>) {
    return number(static_cast<int64_t>(*value));
  } else {
    return text(*value);
  }
}

// One row of a result, columns read from `first` on.
class Row {
 public:
  Row(const PGresult* result, int row) : result_(result), row_(row) {}
  bool is_null(int column) const { return PQgetisnull(result_, row_, column) != 0; }
  std::string text(int column) const {
    return std::string(PQgetvalue(result_, row_, column),
                       static_cast<size_t>(PQgetlength(result_, row_, column)));
  }
  int64_t integer(int column) const {
    int64_t value = 0;
    const char* begin = PQgetvalue(result_, row_, column);
    std::from_chars(begin, begin + PQgetlength(result_, row_, column), value);
    return value;
  }
  double real(int column) const { return std::strtod(PQgetvalue(result_, row_, column), nullptr); }
  bool boolean(int column) const { return PQgetvalue(result_, row_, column)[0] == 't'; }

 private:
  const PGresult* result_;
  int row_;
};

// The number of rows an UPDATE or DELETE changed.
int64_t changed(const data::PgResult& result) {
  return std::atoll(PQcmdTuples(result.get()));
}

Error history_error(Error error, std::string_view what) {
  return std::move(error).with_context(
      fmt::format("{} in the PostgreSQL history (conversations.url)", what));
}

std::unexpected<Error> no_conversation(std::string_view id) {
  return make_error(ErrorCode::kNotFound, "no conversation '{}' (see quarry conversations ls)", id);
}

// Runs one statement on a connection of the pool, with each parameter's format and the
// result's (data::Connection::exec).
Result<data::PgResult> run(PostgresConnections& connections, std::string_view what,
                           std::string_view sql, std::span<const Param> params,
                           std::span<const Format> formats, Format result_format) {
  ASSIGN_OR_RETURN(auto lease, connections.take(true));
  auto result = lease->exec(sql, params, formats, result_format);
  if (!result) return std::unexpected(history_error(std::move(result).error(), what));
  return result;
}

// The same, all in text.
Result<data::PgResult> run(PostgresConnections& connections, std::string_view what,
                           std::string_view sql, std::span<const Param> params) {
  const std::vector<Format> formats(params.size(), Format::kText);
  return run(connections, what, sql, params, formats, Format::kText);
}

Result<data::PgResult> run(PostgresConnections& connections, std::string_view what,
                           std::string_view sql, std::initializer_list<Param> params = {}) {
  return run(connections, what, sql, std::span(params.begin(), params.size()));
}

// Every row of a result, each turned into a T by `read`.
template <typename T, typename Read>
std::vector<T> rows(const data::PgResult& result, Read&& read) {
  std::vector<T> list;
  const int count = PQntuples(result.get());
  list.reserve(static_cast<size_t>(count));
  for (int i = 0; i < count; ++i)
    list.push_back(read(Row(result.get(), i)));
  return list;
}

// BEGIN ... COMMIT on a leased connection, rolled back if not committed.
class Transaction {
 public:
  explicit Transaction(Lease& lease) : lease_(lease) {}
  ~Transaction() {
    if (begun_ && !committed_ && !lease_->exec("ROLLBACK")) lease_.discard();
  }
  Result<void> begin() {
    RETURN_IF_ERROR(lease_->exec("BEGIN"));
    begun_ = true;
    return {};
  }
  Result<void> commit() {
    RETURN_IF_ERROR(lease_->exec("COMMIT"));
    committed_ = true;
    return {};
  }

 private:
  Lease& lease_;
  bool begun_ = false;
  bool committed_ = false;
};

// A session advisory lock, held by a connection of its own until the lock is destroyed. When
// watched, a thread waits on the session's socket, which is silent while the session lives: the
// server's goodbye (FATAL, then the end of the stream), or the keepalives giving up on a dead
// network, means the lock is gone.
class AdvisoryTurnLock final : public TurnLock {
 public:
  AdvisoryTurnLock(Lease lease, int64_t key) : lease_(std::move(lease)), key_(key) {}
  ~AdvisoryTurnLock() override {
    if (watcher_.joinable()) {
      const uint64_t one = 1;
      if (::write(stop_.get(), &one, sizeof one) < 0) {
        // Cannot happen with a valid eventfd (the count is far from its limit).
      }
      watcher_.join();
    }
    // Unlocked explicitly so the next holder can take it at once (closing the session would
    // release it only when the server notices); a session that may still hold it is closed.
    auto unlocked = lease_->exec("SELECT pg_advisory_unlock($1)", {number(key_)});
    if (!unlocked || Row(unlocked->get(), 0).text(0) != "t") lease_.discard();
  }

  void watch(std::function<void()> lost) override {
    if (watcher_.joinable()) return;
    stop_.reset(::eventfd(0, EFD_CLOEXEC));
    if (!stop_) {
      spdlog::error("cannot watch a turn lock: eventfd: {}", std::strerror(errno));
      return;
    }
    watcher_ = std::thread([this, lost = std::move(lost)] {
      if (wait_for_loss()) lost();
    });
  }

 private:
  // Whether the session ended before the lock was destroyed.
  bool wait_for_loss() {
    PGconn* pg = lease_->get();
    for (;;) {
      const auto waited = data::wait_readable(PQsocket(pg), stop_.get(), std::nullopt);
      if (waited == data::Wait::kFailed) {
        spdlog::error("cannot watch a turn lock: poll: {}", std::strerror(errno));
      }
      if (waited != data::Wait::kReady) return false;
      // Anything else the server says while the session lives (a NOTICE, a changed setting) is
      // read and dropped.
      if (PQconsumeInput(pg) == 0 || PQstatus(pg) != CONNECTION_OK) {
        std::string why = PQerrorMessage(pg);
        why.erase(why.find_last_not_of(" \n") + 1);
        spdlog::warn("the PostgreSQL history ended the session holding a turn lock: {}", why);
        return true;
      }
    }
  }

  Lease lease_;
  int64_t key_;
  UniqueFd stop_;
  std::thread watcher_;
};

// The executions an ExecQuery selects: FROM and WHERE over execs e joined with conversations c;
// parameters 1 to 3 are the owner, the conversation and the id bound, each NULL when not asked.
constexpr std::string_view kExecFilter =
    "FROM execs e JOIN conversations c ON c.id = e.conversation_id "
    "WHERE ($1::text IS NULL OR c.owner = $1) AND ($2::text IS NULL OR e.conversation_id = $2) "
    "AND ($3::bigint IS NULL OR e.id < $3)";

std::vector<Param> exec_filter_params(const ExecQuery& query) {
  return {optional(query.owner), optional(query.conversation_id), optional(query.before_id)};
}

// LIMIT for "at most `limit`", where 0 (NULL: LIMIT ALL) means no limit.
Param sql_limit(size_t limit) {
  return limit == 0 ? std::nullopt : number(static_cast<int64_t>(limit));
}

// One INSERT of a conversation's row, in the same statement as the conversation's updated_at
// (no row, kNotFound, for an unknown conversation): `insert` is an INSERT ... SELECT ... FROM
// touched RETURNING id whose parameters 1 and 2 are the time and the conversation's id.
Result<int64_t> insert_row(PostgresConnections& connections, std::string_view what,
                           std::string_view conversation_id, Clock::time_point now,
                           std::string_view insert, std::vector<Param> params) {
  params.insert(params.begin(), {number(to_unix_ms(now)), text(conversation_id)});
  ASSIGN_OR_RETURN(
      auto result,
      run(connections, what,
          fmt::format("WITH touched AS (UPDATE conversations SET updated_at = $1 WHERE id = $2 "
                      "RETURNING id) {}",
                      insert),
          params));
  if (PQntuples(result.get()) == 0) return no_conversation(conversation_id);
  return Row(result.get(), 0).integer(0);
}

}  // namespace

int64_t PostgresHistoryStore::turn_lock_key(std::string_view conversation_id) {
  return advisory_key(fmt::format("quarry turn {}", conversation_id));
}

PostgresHistoryStore::PostgresHistoryStore(std::shared_ptr<PostgresConnections> connections,
                                           const Clock& clock, std::string url)
    : connections_(std::move(connections)), clock_(clock), url_(std::move(url)) {}

PostgresHistoryStore::~PostgresHistoryStore() = default;

Result<std::unique_ptr<PostgresHistoryStore>> PostgresHistoryStore::open(const std::string& url,
                                                                         const Clock& clock) {
  std::unique_ptr<PostgresHistoryStore> store(
      new PostgresHistoryStore(std::make_shared<PostgresConnections>(url), clock, url));
  RETURN_IF_ERROR(store->migrate());
  return store;
}

Result<void> PostgresHistoryStore::migrate() {
  ASSIGN_OR_RETURN(auto lease, connections_->take(true));
  auto fail = [](Error error, std::string_view what) {
    return std::unexpected(history_error(std::move(error), what));
  };
  Transaction transaction(lease);
  if (auto begun = transaction.begin(); !begun) return fail(begun.error(), "starting a migration");
  // Held until the transaction ends: a second server opening the database now waits here, then
  // finds the schema this one made.
  if (auto locked = lease->exec("SELECT pg_advisory_xact_lock($1)", {number(kMigrationLockKey)});
      !locked) {
    return fail(locked.error(), "waiting for other servers' migrations");
  }
  auto found = lease->exec(
      "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
      "WHERE n.nspname = current_schema() AND c.relname = ANY($1::text[]) ORDER BY c.relname",
      {std::string(kTables)});
  if (!found) return fail(found.error(), "reading the schema");
  const auto tables = rows<std::string>(*found, [](const Row& row) { return row.text(0); });
  const bool versioned = std::find(tables.begin(), tables.end(), "schema_version") != tables.end();
  int version = 0;
  if (versioned) {
    auto read = lease->exec("SELECT coalesce(max(version), 0) FROM schema_version");
    if (!read) return fail(read.error(), "reading the schema version");
    version = static_cast<int>(Row(read->get(), 0).integer(0));
    if (version > kSchemaVersion) {
      return make_error(ErrorCode::kFailedPrecondition,
                        "the PostgreSQL history (conversations.url) has schema version {}, newer "
                        "than this quarry understands ({}); quarry left it as it is: upgrade "
                        "quarry, or point conversations.url at another database",
                        version, kSchemaVersion);
    }
  } else if (!tables.empty()) {
    return make_error(ErrorCode::kFailedPrecondition,
                      "the database of conversations.url has tables named like quarry's history "
                      "({}) but no quarry schema_version: it belongs to another application; "
                      "quarry left it as it is: point conversations.url at a database of its own "
                      "(or a schema of its own, with search_path)",
                      fmt::join(tables, ", "));
  } else if (auto created = lease->exec("CREATE TABLE schema_version (version integer PRIMARY KEY, "
                                        "applied_at timestamptz NOT NULL DEFAULT now())");
             !created) {
    return fail(created.error(), "creating the schema");
  }
  for (const auto& [next, sql] : kMigrations) {
    if (next <= version) continue;
    const auto what = fmt::format("migrating to schema version {}", next);
    if (auto migrated = lease->exec_script(sql); !migrated) return fail(migrated.error(), what);
    if (auto recorded =
            lease->exec("INSERT INTO schema_version (version) VALUES ($1)", {number(next)});
        !recorded) {
      return fail(recorded.error(), what);
    }
  }
  if (auto committed = transaction.commit(); !committed) {
    return fail(committed.error(), "finishing a migration");
  }
  return {};
}

Result<std::unique_ptr<TurnLock>> PostgresHistoryStore::try_lock_turn(
    std::string_view conversation_id) {
  if (!valid_conversation_id(conversation_id)) {
    return make_error(ErrorCode::kInvalidArgument, "bad conversation id '{}'", conversation_id);
  }
  const int64_t key = turn_lock_key(conversation_id);
  ASSIGN_OR_RETURN(auto lease, connections_->take(false));
  auto locked = lease->exec("SELECT pg_try_advisory_lock($1)", {number(key)});
  if (!locked) {
    return std::unexpected(history_error(std::move(locked).error(), "taking a turn lock"));
  }
  if (Row(locked->get(), 0).text(0) != "t") {
    return make_error(ErrorCode::kAborted,
                      "conversation {} already has a turn running; wait for it to finish, "
                      "then send this message again",
                      conversation_id);
  }
  return std::make_unique<AdvisoryTurnLock>(std::move(lease), key);
}

Result<Conversation> PostgresHistoryStore::create_conversation(
    std::string_view title, std::string_view owner, const std::optional<NetworkPolicy>& network,
    const std::vector<std::string>& packages) {
  Conversation conversation{random_id(),  std::string(title), 0,       clock_.now(),
                            clock_.now(), std::string(owner), network, packages};
  RETURN_IF_ERROR(
      run(*connections_, "creating a conversation",
          "INSERT INTO conversations (id, title, turns, created_at, updated_at, owner, network, "
          "packages) VALUES ($1, $2, 0, $3, $4, $5, $6, $7)",
          {text(conversation.id), text(conversation.title),
           number(to_unix_ms(conversation.created_at)), number(to_unix_ms(conversation.updated_at)),
           text(conversation.owner), network ? text(network_text(*network)) : std::nullopt,
           text(json_text(conversation.packages))}));
  return conversation;
}

Result<Conversation> PostgresHistoryStore::conversation(std::string_view id) {
  ASSIGN_OR_RETURN(auto result, run(*connections_, "reading a conversation",
                                    fmt::format("SELECT {} FROM conversations WHERE id = $1",
                                                kConversationColumns),
                                    {text(id)}));
  if (PQntuples(result.get()) == 0) return no_conversation(id);
  return conversation_from(Row(result.get(), 0));
}

Result<std::vector<Conversation>> PostgresHistoryStore::conversations(
    const ConversationQuery& query) {
  ASSIGN_OR_RETURN(
      auto result,
      run(*connections_, "listing conversations",
          fmt::format("SELECT {} FROM conversations WHERE ($1::text IS NULL OR owner = $1) AND "
                      "($2::bigint IS NULL OR (updated_at, id) < ($2, $3::text)) "
                      "ORDER BY updated_at DESC, id DESC LIMIT $4::bigint",
                      kConversationColumns),
          {optional(query.owner),
           query.after ? number(to_unix_ms(query.after->first)) : std::nullopt,
           query.after ? text(query.after->second) : std::nullopt, sql_limit(query.limit)}));
  return rows<Conversation>(result, conversation_from<Row>);
}

Result<void> PostgresHistoryStore::name_conversation(std::string_view id, std::string_view title) {
  RETURN_IF_ERROR(run(*connections_, "naming a conversation",
                      "UPDATE conversations SET title = $1 WHERE id = $2 AND title = ''",
                      {text(title), text(id)}));
  return {};
}

Result<void> PostgresHistoryStore::delete_conversation(std::string_view id) {
  // Every row of the conversation goes with it (ON DELETE CASCADE), in this one statement, which
  // also tells every server (at commit) and remembers the delete for those not listening (the
  // deletes older than their lifetime are forgotten meanwhile). Its turn lock is a lock, not a
  // row: nothing is left of it once the caller lets it go.
  ASSIGN_OR_RETURN(
      auto result,
      run(*connections_, "deleting a conversation",
          fmt::format("WITH gone AS (DELETE FROM conversations WHERE id = $1 RETURNING id), "
                      "forgotten AS (DELETE FROM deleted_conversations WHERE deleted_at < {0} - "
                      "{1} AND id <> $1), "
                      "remembered AS (INSERT INTO deleted_conversations (id, deleted_at) "
                      "SELECT id, {0} FROM gone ON CONFLICT (id) DO UPDATE SET deleted_at = "
                      "excluded.deleted_at) "
                      "SELECT pg_notify('{2}', id) FROM gone",
                      kNowMs, kDeletedLifetimeMs, kDeletedChannel),
          {text(id)}));
  if (PQntuples(result.get()) == 0) {
    return make_error(ErrorCode::kNotFound, "no conversation '{}'", id);
  }
  return {};
}

Result<int> PostgresHistoryStore::begin_turn(std::string_view conversation_id, TurnKind kind) {
  ASSIGN_OR_RETURN(
      auto result,
      run(*connections_, "starting a turn",
          "WITH next AS (UPDATE conversations SET turns = turns + 1, updated_at = $1 "
          "WHERE id = $2 RETURNING id, turns) "
          "INSERT INTO turns (conversation_id, number, kind, status, started_at) "
          "SELECT id, turns, $3, 'running', $1 FROM next RETURNING number",
          {number(to_unix_ms(clock_.now())), text(conversation_id), text(to_string(kind))}));
  if (PQntuples(result.get()) == 0) return no_conversation(conversation_id);
  return static_cast<int>(Row(result.get(), 0).integer(0));
}

Result<void> PostgresHistoryStore::finish_turn(std::string_view conversation_id, int turn,
                                               TurnStatus status, std::string_view error) {
  ASSIGN_OR_RETURN(auto result,
                   run(*connections_, "finishing a turn",
                       "UPDATE turns SET status = $1, error = $2, finished_at = $3 "
                       "WHERE conversation_id = $4 AND number = $5",
                       {text(to_string(status)), text(error), number(to_unix_ms(clock_.now())),
                        text(conversation_id), number(turn)}));
  if (changed(result) == 0) {
    return make_error(ErrorCode::kNotFound, "conversation '{}' has no turn {}", conversation_id,
                      turn);
  }
  return {};
}

Result<std::vector<TurnRecord>> PostgresHistoryStore::turns(std::string_view conversation_id) {
  ASSIGN_OR_RETURN(auto result, run(*connections_, "reading turns",
                                    fmt::format("SELECT {} FROM turns WHERE conversation_id = $1 "
                                                "ORDER BY number",
                                                kTurnColumns),
                                    {text(conversation_id)}));
  return rows<TurnRecord>(result, [](const Row& row) { return turn_from(row, 0); });
}

Result<std::vector<std::pair<std::string, TurnRecord>>> PostgresHistoryStore::unfinished_turns() {
  ASSIGN_OR_RETURN(auto result, run(*connections_, "reading unfinished turns",
                                    fmt::format("SELECT conversation_id, {} FROM turns "
                                                "WHERE status = 'running' "
                                                "ORDER BY conversation_id, number",
                                                kTurnColumns)));
  return rows<std::pair<std::string, TurnRecord>>(result, [](const Row& row) {
    return std::pair{row.text(0), turn_from(row, 1)};
  });
}

Result<Message> PostgresHistoryStore::append_message(std::string_view conversation_id,
                                                     Message message) {
  message.created_at = clock_.now();
  ASSIGN_OR_RETURN(
      message.id,
      insert_row(*connections_, "recording a message", conversation_id, message.created_at,
                 "INSERT INTO messages (conversation_id, turn, role, content, tool_calls, "
                 "tool_call_id, details, created_at) SELECT id, $3::integer, $4, $5, $6, $7, $8, "
                 "$1 FROM touched RETURNING id",
                 {number(message.turn), text(to_string(message.role)), text(message.content),
                  message.tool_calls.is_null() ? std::nullopt : text(json_text(message.tool_calls)),
                  message.tool_call_id.empty() ? std::nullopt : text(message.tool_call_id),
                  message.details.is_null() ? std::nullopt : text(json_text(message.details))}));
  return message;
}

Result<Event> PostgresHistoryStore::record_event(std::string_view conversation_id, Event event) {
  event.created_at = clock_.now();
  ASSIGN_OR_RETURN(
      event.id,
      insert_row(*connections_, "recording an event", conversation_id, event.created_at,
                 "INSERT INTO events (conversation_id, turn, kind, sandbox_id, reason, details, "
                 "created_at) SELECT id, $3::integer, $4, $5, $6, $7, $1 FROM touched RETURNING id",
                 {number(event.turn), text(event.kind), text(event.sandbox_id), text(event.reason),
                  text(event.details.is_null() ? std::string("{}") : json_text(event.details))}));
  return event;
}

Result<ExecRecord> PostgresHistoryStore::record_exec(std::string_view conversation_id,
                                                     ExecRecord exec) {
  const auto& r = exec.result;
  ASSIGN_OR_RETURN(
      exec.id,
      insert_row(*connections_, "recording an exec", conversation_id, clock_.now(),
                 "INSERT INTO execs (conversation_id, turn, tool_call_id, tool, sandbox_id, "
                 "command, exit_code, signal, stdout, stderr, truncated, run_ms, cpu_ms, "
                 "peak_memory_bytes, memory_limit_bytes, overhead_ms, oom, timed_out, message, "
                 "started_at, denied_connections, denials) "
                 "SELECT id, $3::integer, $4, $5, $6, $7, $8::integer, $9::integer, $10, $11, "
                 "$12::boolean, $13::double precision, $14::double precision, $15::bigint, "
                 "$16::bigint, $17::double precision, $18::boolean, $19::boolean, $20, "
                 "$21::bigint, $22::bigint, $23 FROM touched RETURNING id",
                 {number(exec.turn),
                  text(exec.tool_call_id),
                  text(exec.tool),
                  text(exec.sandbox_id),
                  text(exec.command),
                  number(r.exit_code),
                  optional(r.signal),
                  text(r.stdout_text),
                  text(r.stderr_text),
                  boolean(r.truncated),
                  real(r.run_ms),
                  real(r.cpu_ms),
                  number(static_cast<int64_t>(r.peak_memory_bytes)),
                  number(static_cast<int64_t>(r.memory_limit_bytes)),
                  real(r.overhead_ms),
                  boolean(r.oom),
                  boolean(r.timed_out),
                  optional(r.message),
                  number(to_unix_ms(exec.started_at)),
                  number(static_cast<int64_t>(r.denied_connections)),
                  text(sandbox::denials_json(r.denials).dump(
                      -1, ' ', false, nlohmann::json::error_handler_t::replace))}));
  return exec;
}

Result<Artifact> PostgresHistoryStore::record_artifact(std::string_view conversation_id,
                                                       Artifact artifact) {
  auto content = read_file(artifact.location);
  if (!content) {
    return std::unexpected(
        std::move(content).error().with_context("recording an artifact's content"));
  }
  if (content->size() != artifact.size_bytes) {
    return make_error(ErrorCode::kInternal,
                      "the artifact '{}' is {} bytes, not the {} collected: it changed after "
                      "it was collected",
                      artifact.location, content->size(), artifact.size_bytes);
  }
  artifact.created_at = clock_.now();
  // The record and its bytes in one statement, so every artifact a server lists has content
  // (sent as bytes, not as escaped text: a value of binary format).
  std::vector<Param> params = {number(to_unix_ms(artifact.created_at)),
                               text(conversation_id),
                               number(artifact.turn),
                               text(artifact.tool_call_id),
                               text(artifact.name),
                               text(artifact.type),
                               number(static_cast<int64_t>(artifact.size_bytes)),
                               text(artifact.location)};
  params.push_back(std::move(*content));  // moved, not copied as a list's elements would be
  std::vector<Format> formats(params.size(), Format::kText);
  formats.back() = Format::kBinary;
  ASSIGN_OR_RETURN(
      auto result,
      run(*connections_, "recording an artifact",
          "WITH touched AS (UPDATE conversations SET updated_at = $1 WHERE id = $2 RETURNING id), "
          "recorded AS (INSERT INTO artifacts (conversation_id, turn, tool_call_id, name, type, "
          "size_bytes, location, created_at) SELECT id, $3::integer, $4, $5, $6, $7::bigint, $8, "
          "$1 FROM touched RETURNING id) "
          "INSERT INTO artifact_contents (artifact_id, content) SELECT id, $9::bytea "
          "FROM recorded RETURNING artifact_id",
          params, formats, Format::kText));
  if (PQntuples(result.get()) == 0) return no_conversation(conversation_id);
  artifact.id = Row(result.get(), 0).integer(0);
  return artifact;
}

Result<std::vector<Message>> PostgresHistoryStore::messages(std::string_view conversation_id) {
  ASSIGN_OR_RETURN(auto result,
                   run(*connections_, "reading messages",
                       fmt::format("SELECT {} FROM messages WHERE conversation_id = $1 ORDER BY id",
                                   kMessageColumns),
                       {text(conversation_id)}));
  return rows<Message>(result, message_from<Row>);
}

Result<std::vector<Event>> PostgresHistoryStore::events(std::string_view conversation_id) {
  ASSIGN_OR_RETURN(auto result, run(*connections_, "reading events",
                                    fmt::format("SELECT {} FROM events WHERE conversation_id = $1 "
                                                "ORDER BY id",
                                                kEventColumns),
                                    {text(conversation_id)}));
  return rows<Event>(result, event_from<Row>);
}

Result<std::vector<ExecRecord>> PostgresHistoryStore::execs(std::string_view conversation_id) {
  ASSIGN_OR_RETURN(auto result,
                   run(*connections_, "reading execs",
                       fmt::format("SELECT {} FROM execs WHERE conversation_id = $1 ORDER BY id",
                                   exec_columns(true)),
                       {text(conversation_id)}));
  return rows<ExecRecord>(result, [](const Row& row) { return exec_from(row, 0); });
}

Result<std::vector<Artifact>> PostgresHistoryStore::artifacts(std::string_view conversation_id) {
  ASSIGN_OR_RETURN(
      auto result,
      run(*connections_, "reading artifacts",
          fmt::format("SELECT {} FROM artifacts WHERE conversation_id = $1 ORDER BY id",
                      kArtifactColumns),
          {text(conversation_id)}));
  return rows<Artifact>(result, [](const Row& row) { return artifact_from(row, 0); });
}

Result<std::pair<std::string, Artifact>> PostgresHistoryStore::artifact(int64_t id) {
  ASSIGN_OR_RETURN(
      auto result,
      run(*connections_, "reading an artifact",
          fmt::format("SELECT conversation_id, {} FROM artifacts WHERE id = $1", kArtifactColumns),
          {number(id)}));
  if (PQntuples(result.get()) == 0) return make_error(ErrorCode::kNotFound, "no artifact {}", id);
  const Row row(result.get(), 0);
  return std::pair{row.text(0), artifact_from(row, 1)};
}

Result<bool> PostgresHistoryStore::restore_artifact(int64_t id, const std::filesystem::path& to) {
  const std::vector<Param> params = {number(id)};
  const std::vector<Format> formats = {Format::kText};
  // In binary format the value is the bytes themselves, not their hex text (twice as long).
  ASSIGN_OR_RETURN(auto result, run(*connections_, "reading an artifact's content",
                                    "SELECT content FROM artifact_contents WHERE artifact_id = $1",
                                    params, formats, Format::kBinary));
  if (PQntuples(result.get()) == 0) return false;
  const std::string_view content(PQgetvalue(result.get(), 0, 0),
                                 static_cast<size_t>(PQgetlength(result.get(), 0, 0)));
  RETURN_IF_ERROR(make_directories(to.parent_path(), 0700));
  RETURN_IF_ERROR(write_file_atomic(to, content, 0600));
  return true;
}

Result<std::vector<std::pair<std::string, ExecRecord>>> PostgresHistoryStore::find_execs(
    const ExecQuery& query) {
  auto params = exec_filter_params(query);
  params.push_back(sql_limit(query.limit));
  ASSIGN_OR_RETURN(auto result,
                   run(*connections_, "reading execs",
                       fmt::format("SELECT e.conversation_id, {} {} ORDER BY e.id DESC "
                                   "LIMIT $4::bigint",
                                   exec_columns(false, "e."), kExecFilter),
                       params));
  return rows<std::pair<std::string, ExecRecord>>(result, [](const Row& row) {
    return std::pair{row.text(0), exec_from(row, 1)};
  });
}

Result<ExecTotals> PostgresHistoryStore::exec_totals(const ExecQuery& query) {
  ASSIGN_OR_RETURN(
      auto result,
      run(*connections_, "adding up execs",
          fmt::format("SELECT count(*), coalesce(sum(e.run_ms), 0), coalesce(sum(e.cpu_ms), 0), "
                      "coalesce(sum(e.overhead_ms), 0), coalesce(max(e.peak_memory_bytes), 0), "
                      "count(*) FILTER (WHERE e.oom), count(*) FILTER (WHERE e.timed_out), "
                      "count(*) FILTER (WHERE e.exit_code <> 0) {}",
                      kExecFilter),
          exec_filter_params(query)));
  const Row row(result.get(), 0);
  return ExecTotals{row.integer(0),
                    row.real(1),
                    row.real(2),
                    row.real(3),
                    static_cast<uint64_t>(row.integer(4)),
                    row.integer(5),
                    row.integer(6),
                    row.integer(7)};
}

Result<void> PostgresHistoryStore::append_stream_event(std::string_view conversation_id,
                                                       const StreamEvent& event) {
  // The NOTIFY is sent when the INSERT commits, never without it.
  RETURN_IF_ERROR(run(*connections_, "recording a stream event",
                      "WITH recorded AS (INSERT INTO stream_events (conversation_id, turn, seq, "
                      "type, data) VALUES ($1, $2, $3, $4, $5) RETURNING conversation_id, turn, "
                      "seq) SELECT pg_notify('quarry_stream_events', conversation_id || ' ' || "
                      "turn || ' ' || seq) FROM recorded",
                      {text(conversation_id), number(event.turn), number(event.seq),
                       text(event.type), text(event.data)}));
  return {};
}

Result<std::vector<StreamEvent>> PostgresHistoryStore::stream_events(
    std::string_view conversation_id, int turn, int64_t after_seq) {
  ASSIGN_OR_RETURN(auto result,
                   run(*connections_, "reading stream events",
                       "SELECT turn, seq, type, data FROM stream_events WHERE conversation_id = $1 "
                       "AND (turn, seq) > ($2::integer, $3::bigint) ORDER BY turn, seq",
                       {text(conversation_id), number(turn), number(after_seq)}));
  return rows<StreamEvent>(result, [](const Row& row) {
    return StreamEvent{static_cast<int>(row.integer(0)), row.integer(1), row.text(2), row.text(3)};
  });
}

Result<SandboxReference> PostgresHistoryStore::sandbox_reference(std::string_view conversation_id) {
  ASSIGN_OR_RETURN(auto result,
                   run(*connections_, "reading a sandbox reference",
                       fmt::format("SELECT {} FROM sandbox_references WHERE conversation_id = $1",
                                   kReferenceColumns),
                       {text(conversation_id)}));
  if (PQntuples(result.get()) == 0) return SandboxReference{};  // never had a sandbox: "new"
  return reference_from(Row(result.get(), 0), 0);
}

Result<void> PostgresHistoryStore::set_sandbox_reference(std::string_view conversation_id,
                                                         const SandboxReference& reference) {
  RETURN_IF_ERROR(run(
      *connections_, "recording a sandbox reference",
      "INSERT INTO sandbox_references (conversation_id, state, sandbox_id, last_used_at, files, "
      "kernel_names, kernel) VALUES ($1, $2, $3, $4, $5, $6, $7) "
      "ON CONFLICT (conversation_id) DO UPDATE SET state = excluded.state, "
      "sandbox_id = excluded.sandbox_id, last_used_at = excluded.last_used_at, "
      "files = excluded.files, kernel_names = excluded.kernel_names, kernel = excluded.kernel",
      {text(conversation_id), text(reference.state), text(reference.sandbox_id),
       reference.last_used_at ? number(to_unix_ms(*reference.last_used_at)) : std::nullopt,
       text(json_text(reference.files)), text(json_text(reference.kernel_names)),
       text(reference.kernel)}));
  return {};
}

Result<std::vector<std::pair<std::string, SandboxReference>>>
PostgresHistoryStore::sandbox_references(const std::optional<std::string>& owner) {
  ASSIGN_OR_RETURN(
      auto result,
      run(*connections_, "reading sandbox references",
          fmt::format("SELECT r.conversation_id, {} FROM sandbox_references r "
                      "JOIN conversations c ON c.id = r.conversation_id "
                      "WHERE $1::text IS NULL OR c.owner = $1 ORDER BY r.conversation_id",
                      kReferenceColumns),
          {optional(owner)}));
  return rows<std::pair<std::string, SandboxReference>>(result, [](const Row& row) {
    return std::pair{row.text(0), reference_from(row, 1)};
  });
}

// The LISTEN side of the stream events' NOTIFYs: a connection of its own, on a thread that
// waits on its socket (and on an eventfd that says stop), reconnecting when it breaks.
class StreamEventChannel final : public Subscription {
 public:
  StreamEventChannel(std::string url, Listeners listeners)
      : url_(std::move(url)), listeners_(std::move(listeners)), stop_(::eventfd(0, EFD_CLOEXEC)) {}
  ~StreamEventChannel() override {
    const uint64_t one = 1;
    if (::write(stop_, &one, sizeof one) < 0) {
      // Cannot happen with a valid eventfd; the thread would then wait out its poll timeout.
    }
    if (thread_.joinable()) thread_.join();
    ::close(stop_);
  }

  // Connects and LISTENs now (so no event recorded after this returns is missed), then goes on
  // on a thread.
  Result<void> start() {
    if (stop_ < 0) return make_error(ErrorCode::kInternal, "eventfd: {}", std::strerror(errno));
    ASSIGN_OR_RETURN(auto connection, connect());
    thread_ = std::thread(
        [this, connection = std::move(connection)]() mutable { run(std::move(connection)); });
    return {};
  }

 private:
  Result<data::Connection> connect() {
    auto connection = data::Connection::open(url_);
    if (!connection) {
      return std::unexpected(history_error(std::move(connection).error(), "listening for events"));
    }
    for (std::string_view channel :
         {kStreamEventsChannel, kCancelsChannel, kRoomChannel, kDeletedChannel}) {
      if (auto listening = connection->exec(fmt::format("LISTEN {}", channel)); !listening) {
        return std::unexpected(history_error(std::move(listening).error(), "listening for events"));
      }
    }
    return connection;
  }

  // Whether to stop, after waiting up to `timeout` for it.
  bool stopping(std::chrono::milliseconds timeout) {
    pollfd stop{stop_, POLLIN, 0};
    return ::poll(&stop, 1, static_cast<int>(timeout.count())) > 0;
  }

  void run(data::Connection connection) {
    while (hear(connection)) {
      for (;;) {
        if (stopping(std::chrono::seconds(1))) return;
        auto again = connect();
        if (again) {
          connection = std::move(*again);
          break;
        }
        spdlog::warn("{}; trying again in a second", again.error().message);
      }
      // What was recorded while it was away was not heard.
      if (listeners_.on_event) listeners_.on_event("", 0, 0);
    }
  }

  // Delivers the notifications on `connection` until told to stop (false) or the connection
  // breaks (true).
  bool hear(data::Connection& connection) {
    PGconn* pg = connection.get();
    for (;;) {
      if (data::wait_readable(PQsocket(pg), stop_, std::nullopt) != data::Wait::kReady) {
        return false;
      }
      if (PQconsumeInput(pg) == 0) {
        spdlog::warn("the PostgreSQL history's event connection broke ({}); reconnecting",
                     PQerrorMessage(pg));
        return true;
      }
      while (PGnotify* notify = PQnotifies(pg)) {
        if (notify->relname == kCancelsChannel) {
          deliver_cancel(notify->extra);
        } else if (notify->relname == kRoomChannel) {
          deliver_room(notify->extra);
        } else if (notify->relname == kDeletedChannel) {
          if (listeners_.on_deleted) listeners_.on_deleted(notify->extra);
        } else {
          deliver(notify->extra);
        }
        PQfreemem(notify);
      }
    }
  }

  // "<conversation> <turn> <seq>" to the listener.
  void deliver(std::string_view payload) {
    const auto first = payload.find(' ');
    const auto second = payload.rfind(' ');
    if (first == std::string_view::npos || second == first) return;
    int turn = 0;
    int64_t seq = 0;
    const auto turn_text = payload.substr(first + 1, second - first - 1);
    const auto seq_text = payload.substr(second + 1);
    std::from_chars(turn_text.data(), turn_text.data() + turn_text.size(), turn);
    std::from_chars(seq_text.data(), seq_text.data() + seq_text.size(), seq);
    if (listeners_.on_event) listeners_.on_event(std::string(payload.substr(0, first)), turn, seq);
  }

  // "<conversation> <turn>" to the cancel listener.
  void deliver_cancel(std::string_view payload) {
    const auto space = payload.find(' ');
    if (space == std::string_view::npos || !listeners_.on_cancel) return;
    int turn = 0;
    const auto turn_text = payload.substr(space + 1);
    std::from_chars(turn_text.data(), turn_text.data() + turn_text.size(), turn);
    listeners_.on_cancel(std::string(payload.substr(0, space)), turn);
  }

  // "<request id> <asking server> <user>" (the user may be empty) to the room listener.
  void deliver_room(std::string_view payload) {
    const auto first = payload.find(' ');
    if (first == std::string_view::npos || !listeners_.on_room) return;
    const auto second = payload.find(' ', first + 1);
    if (second == std::string_view::npos) return;
    RoomRequest request;
    std::from_chars(payload.data(), payload.data() + first, request.id);
    request.server = payload.substr(first + 1, second - first - 1);
    request.user = payload.substr(second + 1);
    listeners_.on_room(request);
  }

  const std::string url_;
  const Listeners listeners_;
  const int stop_;
  std::thread thread_;
};

Result<void> PostgresHistoryStore::enter(const ServerRecord& server) {
  RETURN_IF_ERROR(run(*connections_, "recording this server",
                      fmt::format("INSERT INTO servers (boot_id, instance_id, url, started_at, "
                                  "heartbeat_at) VALUES ($1, $2, $3, {0}, {0}) ON CONFLICT "
                                  "(boot_id) DO UPDATE SET instance_id = excluded.instance_id, "
                                  "url = excluded.url, heartbeat_at = excluded.heartbeat_at",
                                  kNowMs),
                      {text(server.boot_id), text(server.instance_id), text(server.url)}));
  return {};
}

Result<bool> PostgresHistoryStore::beat(std::string_view boot_id) {
  ASSIGN_OR_RETURN(
      auto result,
      run(*connections_, "refreshing this server's heartbeat",
          fmt::format("UPDATE servers SET heartbeat_at = {} WHERE boot_id = $1", kNowMs),
          {text(boot_id)}));
  return changed(result) > 0;
}

Result<void> PostgresHistoryStore::leave(std::string_view boot_id) {
  RETURN_IF_ERROR(run(*connections_, "removing this server's record",
                      "WITH gone AS (DELETE FROM servers WHERE boot_id = $1) "
                      "DELETE FROM sandbox_places WHERE server = $1",
                      {text(boot_id)}));
  return {};
}

Result<std::vector<ServerRecord>> PostgresHistoryStore::servers() {
  ASSIGN_OR_RETURN(auto result,
                   run(*connections_, "reading the servers",
                       fmt::format("SELECT boot_id, instance_id, url, started_at, heartbeat_at, "
                                   "{} - heartbeat_at FROM servers ORDER BY started_at, boot_id",
                                   kNowMs)));
  return rows<ServerRecord>(result, [](const Row& row) {
    return ServerRecord{row.text(0),
                        row.text(1),
                        row.text(2),
                        from_unix_ms(row.integer(3)),
                        from_unix_ms(row.integer(4)),
                        std::chrono::milliseconds(std::max<int64_t>(0, row.integer(5)))};
  });
}

Result<std::optional<TakeOver>> PostgresHistoryStore::claim(std::string_view boot_id,
                                                            std::chrono::milliseconds timeout) {
  // One UPDATE: of servers claiming at once, only the first finds the heartbeat still old; the
  // others see the one it wrote.
  ASSIGN_OR_RETURN(
      auto result,
      run(*connections_, "taking over a silent server",
          fmt::format("UPDATE servers SET heartbeat_at = {0} WHERE boot_id = $1 AND heartbeat_at "
                      "< {0} - $2 RETURNING heartbeat_at",
                      kNowMs),
          {text(boot_id), number(timeout.count())}));
  if (PQntuples(result.get()) == 0) return std::nullopt;
  return TakeOver{std::string(boot_id), Row(result.get(), 0).integer(0)};
}

Result<void> PostgresHistoryStore::taken_over(const TakeOver& claim) {
  RETURN_IF_ERROR(run(*connections_, "removing the record of a server taken over",
                      "WITH gone AS (DELETE FROM servers WHERE boot_id = $1 AND heartbeat_at = $2 "
                      "RETURNING boot_id) DELETE FROM sandbox_places WHERE server IN (SELECT "
                      "boot_id FROM gone)",
                      {text(claim.boot_id), number(claim.stamp)}));
  return {};
}

namespace {

// Runs one statement in a transaction after the places' advisory lock, so it counts every place
// taken by the servers that took the lock before it (each statement of a transaction sees what
// committed before the statement began); the rows it changed.
Result<int64_t> change_places(PostgresConnections& connections, std::string_view what,
                              std::string_view sql, std::initializer_list<Param> params) {
  ASSIGN_OR_RETURN(auto lease, connections.take(true));
  auto fail = [&](Error error) { return std::unexpected(history_error(std::move(error), what)); };
  Transaction transaction(lease);
  if (auto begun = transaction.begin(); !begun) return fail(begun.error());
  if (auto locked = lease->exec("SELECT pg_advisory_xact_lock($1)", {number(kPlacesLockKey)});
      !locked) {
    return fail(locked.error());
  }
  auto done = lease->exec(sql, std::span(params.begin(), params.size()));
  if (!done) return fail(done.error());
  if (auto committed = transaction.commit(); !committed) return fail(committed.error());
  return changed(*done);
}

}  // namespace

Result<bool> PostgresHistoryStore::take_place(const capacity::Place& place,
                                              const capacity::PlaceLimits& limits) {
  ASSIGN_OR_RETURN(
      auto taken,
      change_places(
          *connections_, "taking a sandbox's place",
          fmt::format("INSERT INTO sandbox_places (key, server, user_name, account, taken_at) "
                      "SELECT $1, $2, $3, $4, {} WHERE (SELECT count(*) FROM sandbox_places) < "
                      "$5 AND ($3 = '' OR (SELECT count(*) FROM sandbox_places WHERE user_name = "
                      "$3) < $6) AND (SELECT count(*) FROM sandbox_places WHERE account = $4) < "
                      "$7",
                      kNowMs),
          {text(place.key), text(place.server), text(place.user), text(place.account),
           number(limits.max_sandboxes), number(limits.max_per_user), number(limits.account_max)}));
  return taken > 0;
}

Result<void> PostgresHistoryStore::name_place(std::string_view key, std::string_view sandbox_id) {
  RETURN_IF_ERROR(run(*connections_, "naming a place's sandbox",
                      "UPDATE sandbox_places SET sandbox_id = $2 WHERE key = $1",
                      {text(key), text(sandbox_id)}));
  return {};
}

Result<void> PostgresHistoryStore::keep_place(const capacity::Place& place) {
  // One statement: the others never count the sandbox twice, nor not at all.
  RETURN_IF_ERROR(
      run(*connections_, "counting a sandbox that exists",
          fmt::format("WITH moved AS (DELETE FROM sandbox_places WHERE $5::text <> '' AND "
                      "sandbox_id = $5 AND key <> $1) "
                      "INSERT INTO sandbox_places (key, server, user_name, account, taken_at, "
                      "sandbox_id) VALUES ($1, $2, $3, $4, {}, $5) ON CONFLICT (key) DO UPDATE "
                      "SET sandbox_id = excluded.sandbox_id",
                      kNowMs),
          {text(place.key), text(place.server), text(place.user), text(place.account),
           text(place.sandbox_id)}));
  return {};
}

Result<bool> PostgresHistoryStore::assign_place(std::string_view key, std::string_view user,
                                                int max_per_user) {
  ASSIGN_OR_RETURN(auto assigned,
                   change_places(*connections_, "handing out a warm sandbox's place",
                                 "UPDATE sandbox_places SET user_name = $2 WHERE key = $1 AND "
                                 "(SELECT count(*) FROM sandbox_places WHERE user_name = $2) < $3",
                                 {text(key), text(user), number(max_per_user)}));
  return assigned > 0;
}

Result<void> PostgresHistoryStore::free_place(std::string_view key, std::string_view sandbox_id) {
  RETURN_IF_ERROR(run(*connections_, "freeing a sandbox's place",
                      "DELETE FROM sandbox_places WHERE ($1::text <> '' AND key = $1) OR ($2::text "
                      "<> '' AND sandbox_id = $2)",
                      {text(key), text(sandbox_id)}));
  return {};
}

Result<capacity::PlacesHeld> PostgresHistoryStore::places_held(std::string_view server) {
  ASSIGN_OR_RETURN(
      auto result,
      run(*connections_, "reading the servers' sandboxes",
          "SELECT key, server = $1, user_name, account FROM sandbox_places", {text(server)}));
  capacity::PlacesHeld held;
  for (int i = 0; i < PQntuples(result.get()); ++i) {
    const Row row(result.get(), i);
    if (row.text(1) == "t") {
      held.own.insert(row.text(0));
      continue;
    }
    ++held.total;
    if (!row.text(2).empty()) ++held.by_user[row.text(2)];
    ++held.by_account[row.text(3)];
  }
  return held;
}

Result<void> PostgresHistoryStore::request_cancel(std::string_view conversation_id, int turn) {
  RETURN_IF_ERROR(run(*connections_, "asking for a turn's cancel",
                      fmt::format("SELECT pg_notify('{}', $1)", kCancelsChannel),
                      {text(fmt::format("{} {}", conversation_id, turn))}));
  return {};
}

Result<void> PostgresHistoryStore::request_room(std::string_view server, std::string_view user) {
  // The requests of a minute ago go as this one is recorded; the notice names its row.
  RETURN_IF_ERROR(run(
      *connections_, "asking the other servers for room",
      fmt::format("WITH expired AS (DELETE FROM room_requests WHERE asked_at < {0} - {1}), "
                  "asked AS (INSERT INTO room_requests (server, user_name, asked_at) VALUES "
                  "($1::text, $2::text, {0}) RETURNING id) "
                  "SELECT pg_notify('{2}', id || ' ' || $1::text || ' ' || $2::text) FROM asked",
                  kNowMs, kRoomRequestLifetimeMs, kRoomChannel),
      {text(server), text(user)}));
  return {};
}

Result<bool> PostgresHistoryStore::claim_room(int64_t id) {
  // One DELETE: of servers claiming at once, only one finds the row.
  ASSIGN_OR_RETURN(auto result,
                   run(*connections_, "claiming a request for room",
                       fmt::format("DELETE FROM room_requests WHERE id = $1 AND asked_at >= {} - "
                                   "{} RETURNING id",
                                   kNowMs, kRoomRequestLifetimeMs),
                       {number(id)}));
  return PQntuples(result.get()) > 0;
}

Result<std::vector<std::string>> PostgresHistoryStore::deleted_among(
    const std::vector<std::string>& conversation_ids) {
  // The ids as one JSON array: any text a directory may be named goes through unchanged.
  const nlohmann::json ids = conversation_ids;
  ASSIGN_OR_RETURN(auto result,
                   run(*connections_, "reading the deleted conversations",
                       fmt::format("SELECT id FROM deleted_conversations WHERE id = "
                                   "ANY(ARRAY(SELECT jsonb_array_elements_text($1::jsonb))) "
                                   "AND deleted_at >= {} - {} ORDER BY id",
                                   kNowMs, kDeletedLifetimeMs),
                       {text(ids.dump())}));
  return rows<std::string>(result, [](const Row& row) { return row.text(0); });
}

Result<std::unique_ptr<Subscription>> PostgresHistoryStore::listen(Listeners listeners) {
  auto channel = std::make_unique<StreamEventChannel>(url_, std::move(listeners));
  RETURN_IF_ERROR(channel->start());
  return channel;
}

}  // namespace quarry::conversation

// A libpq connection and its results, owned (RAII), with errors in PostgreSQL's own words and
// an ErrorCode chosen from the SQLSTATE.
#pragma once

#include <libpq-fe.h>

#include <chrono>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "common/error.h"
#include "common/units.h"

namespace quarry::data {

struct PgResultDeleter {
  void operator()(PGresult* result) const { PQclear(result); }
};
using PgResult = std::unique_ptr<PGresult, PgResultDeleter>;

// One message of a COPY ... TO STDOUT, freed with PQfreemem.
struct CopyBufferDeleter {
  void operator()(char* buffer) const { PQfreemem(buffer); }
};
struct CopyChunk {
  std::unique_ptr<char, CopyBufferDeleter> buffer;
  size_t size = 0;
  std::string_view bytes() const { return {buffer.get(), size}; }
};

// PostgreSQL's SQLSTATE for "canceling statement due to statement timeout".
inline constexpr std::string_view kQueryCanceled = "57014";

// The error of a failed result: the server's message, detail, hint and position, with a code
// from its SQLSTATE (syntax -> invalid argument, privileges and read-only -> permission denied,
// statement timeout -> deadline exceeded, connection -> unavailable).
Error error_from_result(const PGresult* result);

class Connection {
 public:
  // `conninfo` is a URL (postgresql://...) or a key=value string. Never put it in a message:
  // it may hold a password. With a `cancel_fd` (readable once the caller stops: a turn's Stop),
  // the connect is waited for here, and stops with kCancelled; connect_timeout is then for the
  // whole connect, not for each of several hosts. The connection's statements then stop with it
  // too (set_cancel_fd).
  static Result<Connection> open(const std::string& conninfo,
                                 std::chrono::seconds connect_timeout = std::chrono::seconds(10),
                                 int cancel_fd = -1);

  // Runs one statement with the extended protocol, which refuses a second statement after ';'.
  // Parameters are text; nullopt is NULL.
  Result<PgResult> exec(std::string_view sql,
                        std::initializer_list<std::optional<std::string>> params = {});
  // The same with parameters built at run time.
  Result<PgResult> exec(std::string_view sql, std::span<const std::optional<std::string>> params);
  // The same with each parameter's format, and the result's: a kBinary parameter is sent as its
  // bytes (a bytea's binary form is its bytes as they are, NULs too, with no escaping), and a
  // kBinary result has every column in binary form (a bytea's bytes; a bigint's 8 bytes, most
  // significant first). `formats` has one entry per parameter.
  enum class Format { kText = 0, kBinary = 1 };
  Result<PgResult> exec(std::string_view sql, std::span<const std::optional<std::string>> params,
                        std::span<const Format> formats, Format result_format);
  // Runs a script of several statements (simple protocol): only for quarry's own SQL.
  Result<void> exec_script(std::string_view sql);

  // Parses `sql` as the prepared statement `name` and describes it: PQnfields, PQfname,
  // PQftype and PQfmod of the result tell its columns (none for a statement without rows).
  Result<PgResult> describe(std::string_view name, std::string_view sql);

  // Starts a COPY ... TO STDOUT statement (sent with the extended protocol).
  Result<void> start_copy_out(std::string_view sql);
  // The next message of the running COPY; nullopt once it has ended (successfully).
  Result<std::optional<CopyChunk>> next_copy_chunk();

  // The next result of a statement sent with PQsendQuery*, waited for; null once there are no
  // more.
  Result<PgResult> next_result();

  // While `fd` is set (not -1), every wait for the server also watches it: once it is readable
  // (a Stop, Ctrl-C, a shutdown) the running statement is cancelled on the server, what it
  // still sends is read and dropped, and the call returns kCancelled. `fd` is never read.
  void set_cancel_fd(int fd) { cancel_fd_ = fd; }

  // Asks the server to cancel the running statement (best effort).
  void cancel();

  PGconn* get() const { return connection_.get(); }

 private:
  struct Deleter {
    void operator()(PGconn* connection) const { PQfinish(connection); }
  };
  explicit Connection(PGconn* connection) : connection_(connection) {}

  // `raw` if its status is one of `expected`; else the server's error, or, without a result,
  // the connection's error while `doing`.
  Result<PgResult> checked(PGresult* raw, std::string_view doing,
                           std::initializer_list<ExecStatusType> expected) const;
  // The error libpq reports for the connection itself (no result).
  Error connection_error(std::string_view what) const;

  // What PQexec would return for the statement just sent, waited for here: its first error,
  // else its last result, `doing` naming the step in an error without a result.
  Result<PgResult> finish(std::string_view doing, std::initializer_list<ExecStatusType> expected);
  // Waits until the server has sent something; kCancelled (the statement stopped) if
  // cancel_fd_ becomes readable first.
  Result<void> wait_for_server();
  // Cancels the running statement and drops what is left of it.
  Error stop_statement();

  std::unique_ptr<PGconn, Deleter> connection_;
  int cancel_fd_ = -1;
};

enum class Wait { kReady, kCancelled, kTimedOut, kFailed };

// Waits until `socket` is ready for `events` (POLLIN, POLLOUT), `cancel_fd` is readable (when
// not negative: poll() skips an entry whose fd is negative; it wins when both are), or
// `deadline` passes (when given). kFailed leaves poll()'s errno.
Wait wait_socket(int socket, short events, int cancel_fd,
                 std::optional<std::chrono::steady_clock::time_point> deadline);
// wait_socket for POLLIN.
Wait wait_readable(int socket, int cancel_fd,
                   std::optional<std::chrono::steady_clock::time_point> deadline);

// Starts a READ ONLY transaction whose statements are cancelled after `statement_timeout`.
Result<void> begin_read_only(Connection& connection, Duration statement_timeout);

}  // namespace quarry::data

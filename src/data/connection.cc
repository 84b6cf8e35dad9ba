#include "data/connection.h"

#include <poll.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <limits>
#include <optional>
#include <vector>

namespace quarry::data {

using Clock = std::chrono::steady_clock;

Wait wait_socket(int socket, short events, int cancel_fd,
                 std::optional<Clock::time_point> deadline) {
  std::array<pollfd, 2> watch = {pollfd{.fd = socket, .events = events, .revents = 0},
                                 pollfd{.fd = cancel_fd, .events = POLLIN, .revents = 0}};
  for (;;) {
    int timeout_ms = -1;
    if (deadline) {
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(*deadline - Clock::now());
      if (left.count() <= 0) return Wait::kTimedOut;
      timeout_ms = static_cast<int>(left.count());
    }
    const int ready = ::poll(watch.data(), watch.size(), timeout_ms);
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0) return Wait::kFailed;
    if (watch[1].revents != 0) return Wait::kCancelled;
    if (ready > 0) return Wait::kReady;
  }
}

Wait wait_readable(int socket, int cancel_fd, std::optional<Clock::time_point> deadline) {
  return wait_socket(socket, POLLIN, cancel_fd, deadline);
}

namespace {

// How long a cancelled statement's last messages are read: the server answers a cancel at once,
// and past this the connection is closed with the statement unanswered.
constexpr auto kDrainTime = std::chrono::seconds(5);

// Reads and drops what the server still sends for the statements sent (rows, COPY data, their
// final results) until it has sent all, or `deadline` passes.
void discard_results(PGconn* connection, Clock::time_point deadline) {
  const int socket = PQsocket(connection);
  // Waits for more from the server; false if it will not come.
  const auto more = [&] {
    return socket >= 0 && wait_readable(socket, -1, deadline) == Wait::kReady &&
           PQconsumeInput(connection);
  };
  for (;;) {
    if (PQisBusy(connection)) {
      if (!more()) return;
      continue;
    }
    PgResult result(PQgetResult(connection));
    if (!result) return;
    const auto status = PQresultStatus(result.get());
    if (status == PGRES_COPY_IN || status == PGRES_COPY_BOTH) return;  // quarry sends no COPY
    if (status != PGRES_COPY_OUT) continue;
    // A COPY ends with -1, and then its final result comes as any other.
    for (;;) {
      char* buffer = nullptr;
      const int size = PQgetCopyData(connection, &buffer, 1);
      if (size > 0) {
        PQfreemem(buffer);
      } else if (size == -1) {
        break;
      } else if (size == -2 || !more()) {
        return;
      }
    }
  }
}

std::string trimmed(const char* text) {
  std::string_view view = text ? text : "";
  while (!view.empty() && (view.back() == '\n' || view.back() == ' '))
    view.remove_suffix(1);
  return std::string(view);
}

ErrorCode code_from_sqlstate(std::string_view state) {
  if (state == kQueryCanceled) return ErrorCode::kDeadlineExceeded;
  if (state == "25006" || state == "42501") return ErrorCode::kPermissionDenied;
  if (state == "53200" || state == "53100" || state == "54000" || state == "54001") {
    return ErrorCode::kResourceExhausted;
  }
  if (state.starts_with("08") || state.starts_with("57P") || state == "53300") {
    return ErrorCode::kUnavailable;
  }
  if (state.starts_with("XX") || state.starts_with("58")) return ErrorCode::kInternal;
  // Everything else (syntax, undefined names, data errors, ...) is about the SQL itself.
  return ErrorCode::kInvalidArgument;
}

}  // namespace

Error error_from_result(const PGresult* result) {
  if (result == nullptr) return Error{ErrorCode::kUnavailable, "no answer from the server"};
  const char* state = PQresultErrorField(result, PG_DIAG_SQLSTATE);
  std::string message = trimmed(PQresultErrorField(result, PG_DIAG_MESSAGE_PRIMARY));
  if (message.empty()) message = trimmed(PQresultErrorMessage(result));
  if (const char* position = PQresultErrorField(result, PG_DIAG_STATEMENT_POSITION)) {
    message += fmt::format(" (at character {})", position);
  }
  if (const char* detail = PQresultErrorField(result, PG_DIAG_MESSAGE_DETAIL)) {
    message += fmt::format(". {}", trimmed(detail));
  }
  if (const char* hint = PQresultErrorField(result, PG_DIAG_MESSAGE_HINT)) {
    message += fmt::format(". Hint: {}", trimmed(hint));
  }
  return Error{state ? code_from_sqlstate(state) : ErrorCode::kUnavailable, std::move(message)};
}

Result<Connection> Connection::open(const std::string& conninfo,
                                    std::chrono::seconds connect_timeout, int cancel_fd) {
  const std::string timeout = std::to_string(connect_timeout.count());
  // expand_dbname: `conninfo` may be a URL or key=value string; keywords after it add to it
  // and win over it, those before it give way to what it sets. Text must reach Arrow as UTF-8
  // whatever the database's encoding: the server converts it (LATIN1, WIN1252, ...; a SQL_ASCII
  // database's bytes stay as they are). Over TCP, keepalives (probes after 30 s of silence,
  // every 10 s, 3 missed) and tcp_user_timeout (60 s unacknowledged) end a connection whose
  // network died within about a minute; without them a query's wait would never end. A url
  // that sets its own keeps them. Unix sockets ignore both.
  const std::array<const char*, 10> keywords = {"keepalives",          "keepalives_idle",
                                                "keepalives_interval", "keepalives_count",
                                                "tcp_user_timeout",    "dbname",
                                                "application_name",    "connect_timeout",
                                                "client_encoding",     nullptr};
  const std::array<const char*, 10> values = {
      "1", "30", "10", "3", "60000", conninfo.c_str(), "quarry", timeout.c_str(), "UTF8", nullptr};
  Connection connection(cancel_fd < 0 ? PQconnectdbParams(keywords.data(), values.data(), 1)
                                      : PQconnectStartParams(keywords.data(), values.data(), 1));
  if (!connection.connection_) {
    return make_error(ErrorCode::kResourceExhausted, "libpq could not allocate a connection");
  }
  if (cancel_fd >= 0 && PQstatus(connection.get()) != CONNECTION_BAD) {
    // libpq's own connect_timeout holds only for PQconnectdb: the deadline is kept here.
    const auto deadline = Clock::now() + connect_timeout;
    PostgresPollingStatusType polling = PGRES_POLLING_WRITING;
    while (polling != PGRES_POLLING_OK && polling != PGRES_POLLING_FAILED) {
      // The socket may change from one host or address to the next.
      switch (wait_socket(PQsocket(connection.get()),
                          polling == PGRES_POLLING_READING ? POLLIN : POLLOUT, cancel_fd,
                          deadline)) {
        case Wait::kFailed:
          return errno_error("poll(PostgreSQL's socket)");
        case Wait::kCancelled:
          return make_error(ErrorCode::kCancelled,
                            "cancelled: stopped while connecting to PostgreSQL");
        case Wait::kTimedOut:
          return make_error(ErrorCode::kUnavailable,
                            "connecting to PostgreSQL failed: no answer within {} s",
                            connect_timeout.count());
        case Wait::kReady:
          polling = PQconnectPoll(connection.get());
          break;
      }
    }
    connection.set_cancel_fd(cancel_fd);
  }
  if (PQstatus(connection.get()) != CONNECTION_OK) {
    return std::unexpected(connection.connection_error("connecting to PostgreSQL"));
  }
  // NOTICEs ("table does not exist, skipping") are for a debug log, not the user's terminal.
  PQsetNoticeProcessor(
      connection.get(),
      [](void*, const char* message) { spdlog::debug("PostgreSQL: {}", trimmed(message)); },
      nullptr);
  return connection;
}

Error Connection::connection_error(std::string_view what) const {
  return Error{ErrorCode::kUnavailable,
               fmt::format("{} failed: {}", what, trimmed(PQerrorMessage(get())))};
}

Result<PgResult> Connection::checked(PGresult* raw, std::string_view doing,
                                     std::initializer_list<ExecStatusType> expected) const {
  PgResult result(raw);
  if (!result) return std::unexpected(connection_error(doing));
  const auto status = PQresultStatus(result.get());
  if (std::find(expected.begin(), expected.end(), status) == expected.end()) {
    return std::unexpected(error_from_result(result.get()));
  }
  return result;
}

Result<PgResult> Connection::exec(std::string_view sql,
                                  std::initializer_list<std::optional<std::string>> params) {
  return exec(sql, std::span(params.begin(), params.size()));
}

Result<PgResult> Connection::exec(std::string_view sql,
                                  std::span<const std::optional<std::string>> params) {
  const std::vector<Format> formats(params.size(), Format::kText);
  return exec(sql, params, formats, Format::kText);
}

Result<PgResult> Connection::exec(std::string_view sql,
                                  std::span<const std::optional<std::string>> params,
                                  std::span<const Format> formats, Format result_format) {
  if (formats.size() != params.size()) {
    return make_error(ErrorCode::kInternal, "{} parameter formats for {} parameters",
                      formats.size(), params.size());
  }
  std::vector<const char*> values;
  std::vector<int> lengths;  // read only for binary parameters, which may hold NUL
  std::vector<int> format_codes;
  for (size_t index = 0; index < params.size(); ++index) {
    const auto& param = params[index];
    if (param && param->size() > static_cast<size_t>(std::numeric_limits<int>::max())) {
      return make_error(ErrorCode::kInvalidArgument,
                        "parameter {} is {} long, more than PostgreSQL takes in one value",
                        index + 1, format_size(param->size()));
    }
    values.push_back(param ? param->c_str() : nullptr);
    lengths.push_back(param ? static_cast<int>(param->size()) : 0);
    format_codes.push_back(static_cast<int>(formats[index]));
  }
  const std::string text(sql);
  constexpr std::string_view kDoing = "sending the statement";
  if (!PQsendQueryParams(get(), text.c_str(), static_cast<int>(values.size()), nullptr,
                         values.data(), lengths.data(), format_codes.data(),
                         static_cast<int>(result_format))) {
    return std::unexpected(connection_error(kDoing));
  }
  return finish(kDoing, {PGRES_COMMAND_OK, PGRES_TUPLES_OK});
}

Result<void> Connection::exec_script(std::string_view sql) {
  const std::string text(sql);
  constexpr std::string_view kDoing = "sending the statements";
  if (!PQsendQuery(get(), text.c_str())) return std::unexpected(connection_error(kDoing));
  RETURN_IF_ERROR(finish(kDoing, {PGRES_COMMAND_OK, PGRES_TUPLES_OK}));
  return {};
}

Result<PgResult> Connection::describe(std::string_view name, std::string_view sql) {
  const std::string text(sql);
  const std::string statement(name);
  if (!PQsendPrepare(get(), statement.c_str(), text.c_str(), 0, nullptr)) {
    return std::unexpected(connection_error("sending the statement"));
  }
  RETURN_IF_ERROR(finish("sending the statement", {PGRES_COMMAND_OK}));
  if (!PQsendDescribePrepared(get(), statement.c_str())) {
    return std::unexpected(connection_error("describing the statement"));
  }
  return finish("describing the statement", {PGRES_COMMAND_OK});
}

Result<void> Connection::start_copy_out(std::string_view sql) {
  const std::string text(sql);
  if (!PQsendQueryParams(get(), text.c_str(), 0, nullptr, nullptr, nullptr, nullptr, 1)) {
    return std::unexpected(connection_error("starting COPY"));
  }
  RETURN_IF_ERROR(finish("starting COPY", {PGRES_COPY_OUT}));
  return {};
}

Result<std::optional<CopyChunk>> Connection::next_copy_chunk() {
  for (;;) {
    char* buffer = nullptr;
    const int size = PQgetCopyData(get(), &buffer, /*async=*/1);
    if (size > 0) {
      CopyChunk chunk;
      chunk.buffer.reset(buffer);
      chunk.size = static_cast<size_t>(size);
      return chunk;
    }
    if (size == -2) return std::unexpected(connection_error("reading COPY data"));
    if (size == -1) break;
    // 0: no whole message yet.
    RETURN_IF_ERROR(wait_for_server());
    if (!PQconsumeInput(get())) return std::unexpected(connection_error("reading COPY data"));
  }
  // -1: the COPY is over; its final result says whether it succeeded.
  ASSIGN_OR_RETURN(auto result, next_result());
  for (;;) {
    ASSIGN_OR_RETURN(auto extra, next_result());
    if (!extra) break;
  }
  if (!result || PQresultStatus(result.get()) != PGRES_COMMAND_OK) {
    return std::unexpected(error_from_result(result.get()));
  }
  return std::nullopt;
}

Result<PgResult> Connection::next_result() {
  while (PQisBusy(get())) {
    RETURN_IF_ERROR(wait_for_server());
    if (!PQconsumeInput(get())) return std::unexpected(connection_error("reading the result"));
  }
  return PgResult(PQgetResult(get()));
}

Result<PgResult> Connection::finish(std::string_view doing,
                                    std::initializer_list<ExecStatusType> expected) {
  PgResult kept;
  for (;;) {
    ASSIGN_OR_RETURN(auto result, next_result());
    if (!result) break;
    const auto status = PQresultStatus(result.get());
    if (!kept || PQresultStatus(kept.get()) != PGRES_FATAL_ERROR) kept = std::move(result);
    // A COPY's data comes after its first result: the caller reads it.
    if (status == PGRES_COPY_OUT || status == PGRES_COPY_IN || status == PGRES_COPY_BOTH) break;
  }
  return checked(kept.release(), doing, expected);
}

Result<void> Connection::wait_for_server() {
  const int socket = PQsocket(get());
  if (socket < 0) return std::unexpected(connection_error("waiting for the server"));
  switch (wait_readable(socket, cancel_fd_, std::nullopt)) {
    case Wait::kFailed:
      return errno_error("poll(PostgreSQL's socket)");
    case Wait::kCancelled:
      return std::unexpected(stop_statement());
    case Wait::kReady:
    case Wait::kTimedOut:  // no deadline: never
      break;
  }
  return {};
}

Error Connection::stop_statement() {
  cancel();
  // Read to its end, the statement is over on the server too when the caller hears it stopped.
  discard_results(get(), Clock::now() + kDrainTime);
  return Error{ErrorCode::kCancelled, "cancelled: the query was stopped"};
}

void Connection::cancel() {
  if (PGcancel* cancel = PQgetCancel(get())) {
    std::array<char, 256> error{};
    PQcancel(cancel, error.data(), static_cast<int>(error.size()));
    PQfreeCancel(cancel);
  }
}

Result<void> begin_read_only(Connection& connection, Duration statement_timeout) {
  RETURN_IF_ERROR(connection.exec("BEGIN TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY"));
  // set_config(..., true) is SET LOCAL: it ends with the transaction.
  RETURN_IF_ERROR(
      connection.exec("SELECT set_config('statement_timeout', $1, true), "
                      "set_config('idle_in_transaction_session_timeout', $1, true)",
                      {fmt::format("{}ms", statement_timeout.count())}));
  return {};
}

}  // namespace quarry::data

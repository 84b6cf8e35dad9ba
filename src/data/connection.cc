#include "data/connection.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <limits>
#include <vector>

namespace quarry::data {
namespace {

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
                                    std::chrono::seconds connect_timeout) {
  const std::string timeout = std::to_string(connect_timeout.count());
  // expand_dbname: `conninfo` may be a URL or key=value string; the other keywords add to it
  // (and win over it). Text must reach Arrow as UTF-8 whatever the database's encoding: the
  // server converts it (LATIN1, WIN1252, ...; a SQL_ASCII database's bytes stay as they are).
  const std::array<const char*, 5> keywords = {"dbname", "application_name", "connect_timeout",
                                               "client_encoding", nullptr};
  const std::array<const char*, 5> values = {conninfo.c_str(), "quarry", timeout.c_str(), "UTF8",
                                             nullptr};
  Connection connection(PQconnectdbParams(keywords.data(), values.data(), 1));
  if (!connection.connection_) {
    return make_error(ErrorCode::kResourceExhausted, "libpq could not allocate a connection");
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
  return checked(
      PQexecParams(get(), text.c_str(), static_cast<int>(values.size()), nullptr, values.data(),
                   lengths.data(), format_codes.data(), static_cast<int>(result_format)),
      "sending the statement", {PGRES_COMMAND_OK, PGRES_TUPLES_OK});
}

Result<void> Connection::exec_script(std::string_view sql) {
  const std::string text(sql);
  RETURN_IF_ERROR(checked(PQexec(get(), text.c_str()), "sending the statements",
                          {PGRES_COMMAND_OK, PGRES_TUPLES_OK}));
  return {};
}

Result<PgResult> Connection::describe(std::string_view name, std::string_view sql) {
  const std::string text(sql);
  const std::string statement(name);
  RETURN_IF_ERROR(checked(PQprepare(get(), statement.c_str(), text.c_str(), 0, nullptr),
                          "sending the statement", {PGRES_COMMAND_OK}));
  return checked(PQdescribePrepared(get(), statement.c_str()), "describing the statement",
                 {PGRES_COMMAND_OK});
}

Result<void> Connection::start_copy_out(std::string_view sql) {
  const std::string text(sql);
  RETURN_IF_ERROR(
      checked(PQexecParams(get(), text.c_str(), 0, nullptr, nullptr, nullptr, nullptr, 1),
              "starting COPY", {PGRES_COPY_OUT}));
  return {};
}

Result<std::optional<CopyChunk>> Connection::next_copy_chunk() {
  char* buffer = nullptr;
  const int size = PQgetCopyData(get(), &buffer, 0);
  if (size > 0) {
    CopyChunk chunk;
    chunk.buffer.reset(buffer);
    chunk.size = static_cast<size_t>(size);
    return chunk;
  }
  if (size == -2) return std::unexpected(connection_error("reading COPY data"));
  // -1: the COPY is over; its final result says whether it succeeded.
  PgResult result(PQgetResult(get()));
  while (PgResult extra{PQgetResult(get())}) {
  }
  if (!result || PQresultStatus(result.get()) != PGRES_COMMAND_OK) {
    return std::unexpected(error_from_result(result.get()));
  }
  return std::nullopt;
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

#include "data/statement.h"

#include <algorithm>
#include <cctype>
#include <string>

namespace quarry::data {

namespace {

bool is_space(char c) {
  return std::string_view(" \t\r\n\f\v").find(c) != std::string_view::npos;
}

bool is_identifier_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '$' ||
         static_cast<unsigned char>(c) >= 0x80;
}

// The length of a $tag$ opening a dollar-quoted string at `sql[at]`, or 0 if there is none
// ($1 is a parameter, a$b an identifier).
size_t dollar_tag_length(std::string_view sql, size_t at) {
  if (at > 0 && is_identifier_char(sql[at - 1])) return 0;
  size_t i = at + 1;
  if (i < sql.size() && std::isdigit(static_cast<unsigned char>(sql[i]))) return 0;
  while (i < sql.size() && sql[i] != '$') {
    if (!is_identifier_char(sql[i])) return 0;
    ++i;
  }
  return i < sql.size() ? i - at + 1 : 0;
}

// The position just past the string, quoted identifier or comment starting at `sql[at]`, or
// `at` if none starts there. An unterminated one runs to the end.
size_t skip_quoted(std::string_view sql, size_t at) {
  const char c = sql[at];
  const char next = at + 1 < sql.size() ? sql[at + 1] : '\0';
  if (c == '-' && next == '-') {
    const size_t newline = sql.find('\n', at);
    return newline == std::string_view::npos ? sql.size() : newline + 1;
  }
  if (c == '/' && next == '*') {  // block comments nest in PostgreSQL
    int depth = 0;
    for (size_t i = at; i + 1 < sql.size(); ++i) {
      if (sql[i] == '/' && sql[i + 1] == '*') {
        ++depth;
        ++i;
      } else if (sql[i] == '*' && sql[i + 1] == '/') {
        ++i;
        if (--depth == 0) return i + 1;
      }
    }
    return sql.size();
  }
  if (c == '\'' || c == '"') {
    const bool escapes = c == '\'' && at > 0 && (sql[at - 1] == 'E' || sql[at - 1] == 'e');
    for (size_t i = at + 1; i < sql.size(); ++i) {
      if (escapes && sql[i] == '\\') {
        ++i;
      } else if (sql[i] == c) {
        if (i + 1 < sql.size() && sql[i + 1] == c) {
          ++i;  // a doubled quote stands for itself
        } else {
          return i + 1;
        }
      }
    }
    return sql.size();
  }
  if (c == '$') {
    if (const size_t length = dollar_tag_length(sql, at); length > 0) {
      const size_t close = sql.find(sql.substr(at, length), at + length);
      return close == std::string_view::npos ? sql.size() : close + length;
    }
  }
  return at;
}

bool is_comment(std::string_view sql, size_t at) {
  return sql.substr(at, 2) == "--" || sql.substr(at, 2) == "/*";
}

}  // namespace

std::string_view trim_statement(std::string_view sql) {
  size_t start = std::string_view::npos;
  size_t end = 0;  // just past the statement's last token
  for (size_t i = 0; i < sql.size();) {
    if (is_space(sql[i]) || sql[i] == ';') {
      ++i;
      continue;
    }
    const bool comment = is_comment(sql, i);
    const size_t after = std::max(skip_quoted(sql, i), i + 1);
    if (!comment) {
      if (start == std::string_view::npos) start = i;
      end = after;
    }
    i = after;
  }
  if (start == std::string_view::npos) return {};
  return sql.substr(start, end - start);
}

Error database_error(Error error, Duration statement_timeout, std::string_view tool) {
  if (error.code == ErrorCode::kDeadlineExceeded) {
    return Error{error.code,
                 fmt::format("{}: the query ran longer than database.statement_timeout ({}) and "
                             "was cancelled; filter or aggregate more in SQL, or raise the timeout",
                             tool, format_duration(statement_timeout))};
  }
  return std::move(error).with_context(tool);
}

Result<std::vector<ColumnDescription>> describe_query(Connection& connection, std::string_view sql,
                                                      std::string_view tool) {
  const std::string_view statement = trim_statement(sql);
  if (statement.empty()) {
    return make_error(ErrorCode::kInvalidArgument, "{}: no SQL given; pass one SELECT query", tool);
  }
  auto described = connection.describe(kQueryStatement, statement);
  if (!described) {
    auto error = std::move(described).error();
    if (error.message.find("multiple commands") != std::string::npos) {
      error.message = "only one statement can run at a time; send the statements separately";
    }
    return std::unexpected(std::move(error).with_context(tool));
  }
  const PGresult* result = described->get();
  const int count = PQnfields(result);
  if (count == 0) {
    return make_error(ErrorCode::kPermissionDenied,
                      "{}: this statement returns no rows, and only queries run here (SELECT, "
                      "WITH ... SELECT, VALUES, TABLE); the database is read-only",
                      tool);
  }
  std::vector<ColumnDescription> columns(static_cast<size_t>(count));
  std::string oids = "{", modifiers = "{";
  for (int column_idx = 0; column_idx < count; ++column_idx) {
    auto& column = columns[static_cast<size_t>(column_idx)];
    column.name = PQfname(result, column_idx);
    column.type_oid = PQftype(result, column_idx);
    column.type_modifier = PQfmod(result, column_idx);
    oids += fmt::format("{}{}", column_idx ? "," : "", column.type_oid);
    modifiers += fmt::format("{}{}", column_idx ? "," : "", column.type_modifier);
  }
  oids += "}";
  modifiers += "}";
  // One round trip for every column's type name.
  ASSIGN_OR_RETURN(auto names,
                   with_context(connection.exec("SELECT format_type(oid, modifier) FROM "
                                                "unnest($1::oid[], $2::int4[]) WITH ORDINALITY "
                                                "AS t(oid, modifier, n) ORDER BY n",
                                                {oids, modifiers}),
                                "reading the column types"));
  for (int column_idx = 0; column_idx < count; ++column_idx) {
    columns[static_cast<size_t>(column_idx)].sql_type = PQgetvalue(names.get(), column_idx, 0);
  }
  return columns;
}

}  // namespace quarry::data

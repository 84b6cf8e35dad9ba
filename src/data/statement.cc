#include "data/statement.h"

#include <string>

namespace quarry::data {

std::string_view trim_statement(std::string_view sql) {
  constexpr std::string_view kSpace = " \t\r\n\f\v";
  while (true) {
    const size_t start = sql.find_first_not_of(kSpace);
    if (start == std::string_view::npos) return {};
    sql.remove_prefix(start);
    sql.remove_suffix(sql.size() - sql.find_last_not_of(kSpace) - 1);
    if (!sql.ends_with(';')) return sql;
    sql.remove_suffix(1);
  }
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

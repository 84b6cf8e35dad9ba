// The model's SQL, checked before it runs: one statement, that returns rows, and its columns
// (name, type OID, type modifier, SQL type name) as the server describes them.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.h"
#include "common/units.h"
#include "data/connection.h"

namespace quarry::data {

struct ColumnDescription {
  std::string name;
  uint32_t type_oid = 0;
  int32_t type_modifier = -1;  // e.g. numeric(p, s) packed as ((p << 16) | s) + 4
  std::string sql_type;        // format_type(): "numeric(12,2)", "text[]", ...
};

// The statement without the white space, ';' and comments around it, so it can be wrapped in a
// subquery: "SELECT 1; -- done" gives "SELECT 1". Strings, quoted identifiers, dollar quotes
// and comments are skipped whole, so a ';' or "--" inside them stays. Empty if nothing is left.
std::string_view trim_statement(std::string_view sql);

// The name of the prepared statement describe_query leaves on the connection.
inline constexpr std::string_view kQueryStatement = "quarry_query";

// Parses and describes `sql` on `connection` without running it (as kQueryStatement). Refuses an
// empty text, more than one statement (the server's extended protocol refuses those) and statements
// that return no rows (INSERT, SET ROLE, COPY ... TO PROGRAM, ...): `tool` names the caller in
// messages.
Result<std::vector<ColumnDescription>> describe_query(Connection& connection, std::string_view sql,
                                                      std::string_view tool);

// The error of a statement, for the model: a statement timeout says which setting cut it and
// what to do; anything else keeps PostgreSQL's words after "<tool>: ".
Error database_error(Error error, Duration statement_timeout, std::string_view tool);

}  // namespace quarry::data

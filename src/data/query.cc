#include "data/query.h"

#include <algorithm>
#include <charconv>
#include <cmath>

#include "common/text.h"
#include "data/pg_types.h"

namespace quarry::data {
namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

Result<QueryResult> query_database(const std::string& conninfo, std::string_view sql,
                                   const QueryOptions& options) {
  constexpr std::string_view kTool = "query_database";
  const auto start = Clock::now();
  ASSIGN_OR_RETURN(auto connection,
                   Connection::open(conninfo, std::chrono::seconds(10), options.cancel_fd));
  RETURN_IF_ERROR(begin_read_only(connection, options.statement_timeout));
  QueryResult result;
  result.max_rows = options.max_rows;
  result.max_bytes = options.max_bytes;
  result.max_value_bytes = options.max_value_bytes;
  ASSIGN_OR_RETURN(result.columns, describe_query(connection, sql, kTool));

  // Rows one at a time, so a huge result costs nothing past max_rows + 1.
  if (!PQsendQueryPrepared(connection.get(), std::string(kQueryStatement).c_str(), 0, nullptr,
                           nullptr, nullptr, 0) ||
      !PQsetSingleRowMode(connection.get())) {
    return make_error(ErrorCode::kUnavailable, "{}: sending the query failed: {}", kTool,
                      PQerrorMessage(connection.get()));
  }
  std::optional<Error> failure;
  uint64_t kept_bytes = 0;
  // The answer is cut: the rest of the rows need not be sent.
  auto cut = [&] {
    if (!result.truncated) connection.cancel();
    result.truncated = true;
  };
  for (;;) {
    auto next = connection.next_result();
    if (!next) {
      return std::unexpected(
          database_error(std::move(next).error(), options.statement_timeout, kTool));
    }
    const PgResult row = std::move(*next);
    if (!row) break;
    const auto status = PQresultStatus(row.get());
    if (status == PGRES_SINGLE_TUPLE) {
      if (result.truncated) continue;  // rows sent before the cancel arrived
      if (result.rows.size() == options.max_rows) {
        cut();  // one row past the cap
        continue;
      }
      // Only the start of each value is kept, so 200 rows of values of a gigabyte hold little
      // more than the one row libpq has.
      std::vector<std::optional<std::string>> values;
      uint64_t row_bytes = 0, row_values_cut = 0;
      for (int column_idx = 0; column_idx < PQnfields(row.get()); ++column_idx) {
        if (PQgetisnull(row.get(), 0, column_idx)) {
          values.emplace_back(std::nullopt);
          continue;
        }
        const std::string_view value(PQgetvalue(row.get(), 0, column_idx),
                                     static_cast<size_t>(PQgetlength(row.get(), 0, column_idx)));
        const std::string_view head = utf8_head(value, options.max_value_bytes);
        if (head.size() < value.size()) ++row_values_cut;
        row_bytes += head.size();
        values.emplace_back(std::string(head));
      }
      // Many columns of long values add up: the rows stop before the bound of bytes.
      if (kept_bytes + row_bytes > options.max_bytes) {
        result.bytes_cut = true;
        cut();
        continue;
      }
      kept_bytes += row_bytes;
      result.values_cut += row_values_cut;
      result.rows.push_back(std::move(values));
    } else if (status != PGRES_TUPLES_OK && !result.truncated && !failure) {
      failure = error_from_result(row.get());
    }
  }
  if (failure) return std::unexpected(database_error(*failure, options.statement_timeout, kTool));
  result.elapsed_ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  return result;
}

nlohmann::json to_json(const QueryResult& result) {
  nlohmann::json columns = nlohmann::json::array();
  for (const auto& column : result.columns)
    columns.push_back({{"name", column.name}, {"type", column.sql_type}});
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& values : result.rows) {
    nlohmann::json row = nlohmann::json::array();
    for (size_t column_idx = 0; column_idx < values.size(); ++column_idx) {
      const auto& value = values[column_idx];
      if (!value) {
        row.push_back(nullptr);
        continue;
      }
      switch (json_kind(result.columns[column_idx].type_oid)) {
        case JsonKind::kInteger: {
          int64_t number = 0;
          auto [end, ec] = std::from_chars(value->data(), value->data() + value->size(), number);
          if (ec == std::errc() && end == value->data() + value->size()) {
            row.push_back(number);
          } else {
            row.push_back(*value);
          }
          break;
        }
        case JsonKind::kFloat: {
          double number = 0;
          auto [end, ec] = std::from_chars(value->data(), value->data() + value->size(), number);
          // NaN and Infinity have no JSON number: they stay text.
          if (ec == std::errc() && end == value->data() + value->size() && std::isfinite(number)) {
            row.push_back(number);
          } else {
            row.push_back(*value);
          }
          break;
        }
        case JsonKind::kBoolean:
          row.push_back(*value == "t");
          break;
        case JsonKind::kText:
          row.push_back(*value);
          break;
      }
    }
    rows.push_back(std::move(row));
  }
  return {{"columns", std::move(columns)},   {"rows", std::move(rows)},
          {"row_count", result.rows.size()}, {"truncated", result.truncated},
          {"max_rows", result.max_rows},     {"max_bytes", result.max_bytes},
          {"values_cut", result.values_cut}, {"max_value_bytes", result.max_value_bytes},
          {"elapsed_ms", result.elapsed_ms}};
}

std::string to_text(const QueryResult& result) {
  constexpr size_t kMaxCell = 80;
  auto cell = [](const std::optional<std::string>& value) {
    if (!value) return std::string("NULL");
    std::string text = *value;
    std::replace(text.begin(), text.end(), '\n', ' ');
    if (text.size() > kMaxCell) text = std::string(utf8_head(text, kMaxCell - 3)) + "...";
    return text;
  };
  std::vector<size_t> widths;
  for (const auto& column : result.columns)
    widths.push_back(column.name.size());
  for (const auto& values : result.rows) {
    for (size_t column_idx = 0; column_idx < values.size(); ++column_idx)
      widths[column_idx] = std::max(widths[column_idx], cell(values[column_idx]).size());
  }
  std::string text;
  auto line = [&](auto&& value_of) {
    for (size_t column_idx = 0; column_idx < widths.size(); ++column_idx) {
      std::string value = value_of(column_idx);
      text += value;
      if (column_idx + 1 < widths.size())
        text += std::string(widths[column_idx] - value.size() + 2, ' ');
    }
    text += '\n';
  };
  line([&](size_t column_idx) { return result.columns[column_idx].name; });
  line([&](size_t column_idx) { return std::string(widths[column_idx], '-'); });
  for (const auto& values : result.rows)
    line([&](size_t column_idx) { return cell(values[column_idx]); });
  if (result.bytes_cut) {
    text += fmt::format(
        "({} rows shown; the result was cut at {} of values kept (query_database keeps at most "
        "{} of each value). Select fewer or shorter columns (left(column, 100)), aggregate or "
        "filter in SQL, or use export_query for data the analysis code should read.)\n",
        result.rows.size(), format_size(result.max_bytes), format_size(result.max_value_bytes));
  } else if (result.truncated) {
    text += fmt::format(
        "({} rows shown; the result had more and was cut at database.query_max_rows = {}. "
        "Aggregate or filter in SQL, or use export_query for data the analysis code should "
        "read.)\n",
        result.rows.size(), result.max_rows);
  } else {
    text += fmt::format("({} row{})\n", result.rows.size(), result.rows.size() == 1 ? "" : "s");
  }
  return text;
}

}  // namespace quarry::data

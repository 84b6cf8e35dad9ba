#include "data/parquet_export.h"

#include <arrow/api.h>
#include <arrow/io/file.h>
#include <parquet/arrow/writer.h>
#include <parquet/properties.h>

#include <algorithm>
#include <optional>
#include <set>

#include "data/column_builder.h"
#include "data/connection.h"
#include "data/pg_catalog.h"
#include "data/statement.h"

namespace quarry::data {
namespace {

using Clock = std::chrono::steady_clock;
constexpr std::string_view kTool = "export_query";

// Removes the file unless the export completed.
struct PartialFile {
  const std::filesystem::path& path;
  bool keep = false;
  ~PartialFile() {
    std::error_code ignored;
    if (!keep) std::filesystem::remove(path, ignored);
  }
};

class ParquetSink {
 public:
  static Result<ParquetSink> open(const std::filesystem::path& file,
                                  std::shared_ptr<arrow::Schema> schema,
                                  const ExportOptions& options) {
    auto stream = arrow::io::FileOutputStream::Open(file.string());
    if (!stream.ok()) {
      RETURN_IF_ERROR(from_status(stream.status(), fmt::format("creating '{}'", file.string())));
    }
    auto properties = parquet::WriterProperties::Builder()
                          .compression(arrow::Compression::ZSTD)
                          ->max_row_group_length(static_cast<int64_t>(options.row_group_rows))
                          ->created_by("quarry export_query")
                          ->build();
    // The Arrow schema goes into the file too, so readers get back exactly these types.
    auto arrow_properties = parquet::ArrowWriterProperties::Builder().store_schema()->build();
    auto writer = parquet::arrow::FileWriter::Open(*schema, arrow::default_memory_pool(), *stream,
                                                   properties, arrow_properties);
    if (!writer.ok()) {
      RETURN_IF_ERROR(from_status(writer.status(), "starting the Parquet file"));
    }
    return ParquetSink(std::move(schema), std::move(*stream), std::move(*writer));
  }

  // Writes the builders' values as one row group.
  Result<void> write_row_group(std::vector<std::unique_ptr<ColumnBuilder>>& builders,
                               int64_t rows) {
    std::vector<std::shared_ptr<arrow::Array>> arrays;
    for (auto& builder : builders) {
      ASSIGN_OR_RETURN(auto array, builder->finish());
      arrays.push_back(std::move(array));
    }
    auto table = arrow::Table::Make(schema_, std::move(arrays), rows);
    return from_status(writer_->WriteTable(*table, std::max<int64_t>(rows, 1)),
                       "writing a Parquet row group");
  }

  Result<void> close() {
    RETURN_IF_ERROR(from_status(writer_->Close(), "finishing the Parquet file"));
    return from_status(stream_->Close(), "closing the Parquet file");
  }

 private:
  ParquetSink(std::shared_ptr<arrow::Schema> schema,
              std::shared_ptr<arrow::io::FileOutputStream> stream,
              std::unique_ptr<parquet::arrow::FileWriter> writer)
      : schema_(std::move(schema)), stream_(std::move(stream)), writer_(std::move(writer)) {}

  std::shared_ptr<arrow::Schema> schema_;
  std::shared_ptr<arrow::io::FileOutputStream> stream_;
  std::unique_ptr<parquet::arrow::FileWriter> writer_;
};

Result<void> check_unique_names(const std::vector<ColumnDescription>& columns) {
  std::set<std::string> seen;
  for (const auto& column : columns) {
    if (!seen.insert(column.name).second) {
      return make_error(ErrorCode::kInvalidArgument,
                        "{}: two columns are named '{}'; give them distinct names with AS", kTool,
                        column.name);
    }
  }
  return {};
}

// A run of the query after another found values that needed another form is planned from all
// of them, so it fits; a third is for a query whose values differ from run to run (random(),
// clock_timestamp()): it takes the widest form of every part that changed, which fits anything.
constexpr int kMaxRuns = 3;

using Shapes = std::vector<std::vector<ValueShape>>;

struct Run {
  ExportSummary summary;
  bool misfit = false;        // some value needed another form: nothing was written
  std::vector<bool> misfits;  // which columns' values did
  Shapes shapes;              // what the values showed
};

// `name` quoted as an SQL identifier.
Result<std::string> quote_identifier(Connection& connection, const std::string& name) {
  char* quoted = PQescapeIdentifier(connection.get(), name.data(), name.size());
  if (quoted == nullptr) {
    return make_error(ErrorCode::kInvalidArgument, "{}: column name '{}' cannot be quoted: {}",
                      kTool, name, PQerrorMessage(connection.get()));
  }
  std::string text(quoted);
  PQfreemem(quoted);
  return text;
}

// The COPY of the query's rows, each column as its plan selects it, and one row past the cap
// to tell whether the result was cut. The newline keeps a trailing "-- comment" in `sql` from
// swallowing the closing parenthesis. A text form is the type's output function, as
// format('%s') calls it: a ::text cast would call a type's own cast where it has one (inet's
// adds the netmask). num_nulls() tells NULL from a record of NULLs, which IS NULL does not.
Result<std::string> copy_statement(Connection& connection, std::string_view sql,
                                   const std::vector<std::unique_ptr<ColumnBuilder>>& builders,
                                   uint64_t max_rows) {
  std::string select = "*";
  const auto as_value = [](const auto& b) { return b->plan().select == Select::kValue; };
  if (!std::ranges::all_of(builders, as_value)) {
    select.clear();
    for (const auto& builder : builders) {
      ASSIGN_OR_RETURN(auto quoted, quote_identifier(connection, builder->name()));
      const std::string text =
          fmt::format("CASE WHEN num_nulls({0}) = 0 THEN format('%s', {0}) END", quoted);
      switch (builder->plan().select) {
        case Select::kValue:
          break;
        case Select::kText:
          quoted = fmt::format("{} AS {}", text, quoted);
          break;
        case Select::kTextElements:
          // The array as it prints, read back as text[]: each element as it prints.
          quoted = fmt::format("({})::text[] AS {}", text, quoted);
          break;
      }
      select += fmt::format("{}{}", select.empty() ? "" : ", ", quoted);
    }
  }
  return fmt::format(
      "COPY (SELECT {} FROM (\n{}\n) AS quarry_export LIMIT {}) TO STDOUT (FORMAT binary)", select,
      trim_statement(sql), max_rows + 1);
}

Result<Run> run_export(Connection& connection, std::string_view sql,
                       const std::vector<ColumnDescription>& columns,
                       const std::vector<PgType>& types, const Shapes& shapes, bool sample,
                       const std::filesystem::path& file, const ExportOptions& options) {
  Run run;
  run.summary.max_rows = options.max_rows;
  std::vector<std::unique_ptr<ColumnBuilder>> builders;
  for (size_t column_idx = 0; column_idx < columns.size(); ++column_idx) {
    ASSIGN_OR_RETURN(auto builder, ColumnBuilder::make(columns[column_idx].name, types[column_idx],
                                                       shapes[column_idx], sample));
    builders.push_back(std::move(builder));
  }
  ASSIGN_OR_RETURN(auto copy, copy_statement(connection, sql, builders, options.max_rows));
  if (auto started = connection.start_copy_out(copy); !started) {
    auto error = std::move(started).error();
    if (error.message.starts_with("syntax error")) {
      return make_error(ErrorCode::kInvalidArgument,
                        "{}: only a query can be exported (SELECT, WITH ... SELECT, VALUES, "
                        "TABLE); this statement returns rows but cannot be read as a table",
                        kTool);
    }
    return std::unexpected(database_error(std::move(error), options.statement_timeout, kTool));
  }

  // The file is opened at the first row group, when every column's type is known.
  std::optional<ParquetSink> sink;
  const auto any_misfit = [&] {
    return std::ranges::any_of(builders, [](const auto& b) { return b->misfit(); });
  };
  const auto write_row_group = [&](uint64_t rows) -> Result<void> {
    for (auto& builder : builders)
      RETURN_IF_ERROR(with_context(builder->decide(), kTool));
    if (any_misfit()) return {};
    if (!sink) {
      arrow::FieldVector fields;
      for (const auto& builder : builders)
        fields.push_back(arrow::field(builder->name(), builder->plan().type.arrow_type));
      ASSIGN_OR_RETURN(sink, ParquetSink::open(file, arrow::schema(fields), options));
    }
    return sink->write_row_group(builders, static_cast<int64_t>(rows));
  };

  CopyBinaryReader reader(columns.size());
  uint64_t group_rows = 0;
  uint64_t group_bytes = 0;
  bool measuring = false;  // a value misfit: the rest is only measured, for the next run
  auto on_row = [&](std::span<const CopyField> row) -> Result<void> {
    if (run.summary.rows == options.max_rows) {
      run.summary.truncated = true;
      return {};
    }
    for (size_t column_idx = 0; column_idx < row.size(); ++column_idx) {
      if (auto appended = builders[column_idx]->append(row[column_idx]); !appended) {
        return std::unexpected(std::move(appended).error().with_context(kTool));
      }
      // With the value's 4-byte length word: a NULL has no bytes, but a slot in the builder.
      group_bytes += sizeof(int32_t) + row[column_idx].bytes().size();
    }
    ++run.summary.rows;
    // A column that misfit appends no more; the others learn of it at the row group's end.
    if (++group_rows >= options.row_group_rows || group_bytes >= options.row_group_bytes) {
      if (!measuring) {
        RETURN_IF_ERROR(write_row_group(group_rows));  // nothing, after a misfit
        measuring = any_misfit();
        if (measuring) {
          for (auto& builder : builders)
            builder->stop_appending();
        } else if (options.on_progress) {
          options.on_progress(run.summary.rows);
        }
      }
      group_rows = 0;
      group_bytes = 0;
    }
    return {};
  };
  while (true) {
    auto chunk = connection.next_copy_chunk();
    if (!chunk) {
      return std::unexpected(
          database_error(std::move(chunk).error(), options.statement_timeout, kTool));
    }
    if (!*chunk) break;
    RETURN_IF_ERROR(reader.consume((*chunk)->bytes(), on_row));
  }
  RETURN_IF_ERROR(reader.finish());
  if (!measuring && (group_rows > 0 || !sink)) RETURN_IF_ERROR(write_row_group(group_rows));
  if (measuring || any_misfit()) {
    run.misfit = true;
    for (const auto& builder : builders) {
      run.misfits.push_back(builder->misfit());
      run.shapes.push_back(builder->shapes());
    }
    return run;
  }
  RETURN_IF_ERROR(sink->close());
  for (size_t column_idx = 0; column_idx < columns.size(); ++column_idx) {
    const auto& plan = builders[column_idx]->plan();
    run.summary.columns.push_back({columns[column_idx].name, columns[column_idx].sql_type,
                                   plan.type.arrow_type->ToString(), plan.note});
  }
  return run;
}

}  // namespace

ExportOptions export_options(const Config& config) {
  ExportOptions options;
  options.max_rows = config.sandbox.export_max_rows;
  options.statement_timeout = config.database.statement_timeout;
  options.row_group_rows = config.database.export_row_group_rows;
  return options;
}

Result<ExportSummary> export_parquet(const std::string& conninfo, std::string_view sql,
                                     const std::filesystem::path& file,
                                     const ExportOptions& options) {
  const auto start = Clock::now();
  ASSIGN_OR_RETURN(auto connection,
                   Connection::open(conninfo, std::chrono::seconds(10), options.cancel_fd));
  // REPEATABLE READ: a second run of the query sees the same rows.
  RETURN_IF_ERROR(begin_read_only(connection, options.statement_timeout));
  ASSIGN_OR_RETURN(auto columns, describe_query(connection, sql, kTool));
  RETURN_IF_ERROR(check_unique_names(columns));
  ASSIGN_OR_RETURN(auto types, with_context(resolve_types(connection, columns), kTool));

  PartialFile partial{file};
  Shapes shapes(columns.size());
  for (int run_idx = 1;; ++run_idx) {
    ASSIGN_OR_RETURN(auto run, run_export(connection, sql, columns, types, shapes,
                                          /*sample=*/run_idx == 1, file, options));
    if (!run.misfit) {
      ExportSummary summary = std::move(run.summary);
      summary.runs = run_idx;
      std::error_code error;
      summary.bytes = std::filesystem::file_size(file, error);
      summary.elapsed_ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
      if (options.on_progress) options.on_progress(summary.rows);
      partial.keep = true;
      return summary;
    }
    if (run_idx == kMaxRuns) {
      return make_error(ErrorCode::kInternal,
                        "{}: the query's values needed another type on every run", kTool);
    }
    if (run_idx == kMaxRuns - 1) {
      // The values changed between runs: the columns that misfit take their widest forms.
      for (size_t column_idx = 0; column_idx < columns.size(); ++column_idx) {
        if (!run.misfits[column_idx]) continue;
        for (auto& shape : run.shapes[column_idx])
          shape.widest = true;
      }
    }
    shapes = std::move(run.shapes);
  }
}

}  // namespace quarry::data

#include "data/parquet_export.h"

#include <arrow/api.h>
#include <arrow/io/file.h>
#include <parquet/arrow/writer.h>
#include <parquet/properties.h>

#include <set>

#include "data/column_builder.h"
#include "data/connection.h"
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
  ASSIGN_OR_RETURN(auto connection, Connection::open(conninfo));
  RETURN_IF_ERROR(begin_read_only(connection, options.statement_timeout));
  ASSIGN_OR_RETURN(auto columns, describe_query(connection, sql, kTool));
  RETURN_IF_ERROR(check_unique_names(columns));

  ExportSummary summary;
  summary.max_rows = options.max_rows;
  std::vector<std::unique_ptr<ColumnBuilder>> builders;
  arrow::FieldVector fields;
  for (const auto& column : columns) {
    ASSIGN_OR_RETURN(auto type, with_context(map_column(column), kTool));
    fields.push_back(arrow::field(column.name, type.arrow_type));
    summary.columns.push_back({column.name, column.sql_type, type.arrow_type->ToString()});
    ASSIGN_OR_RETURN(auto builder, ColumnBuilder::make(column.name, std::move(type)));
    builders.push_back(std::move(builder));
  }

  PartialFile partial{file};
  ASSIGN_OR_RETURN(auto sink, ParquetSink::open(file, arrow::schema(fields), options));

  // One row past the cap tells whether the result was cut. The newline keeps a trailing
  // "-- comment" in `sql` from swallowing the closing parenthesis.
  const std::string copy = fmt::format(
      "COPY (SELECT * FROM (\n{}\n) AS quarry_export LIMIT {}) TO STDOUT (FORMAT binary)",
      trim_statement(sql), options.max_rows + 1);
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

  CopyBinaryReader reader(columns.size());
  uint64_t group_rows = 0;
  uint64_t group_bytes = 0;
  auto on_row = [&](std::span<const CopyField> row) -> Result<void> {
    if (summary.rows == options.max_rows) {
      summary.truncated = true;
      return {};
    }
    for (size_t column_idx = 0; column_idx < row.size(); ++column_idx) {
      RETURN_IF_ERROR(with_context(builders[column_idx]->append(row[column_idx]), kTool));
      group_bytes += row[column_idx].bytes().size();
    }
    ++summary.rows;
    if (++group_rows >= options.row_group_rows || group_bytes >= options.row_group_bytes) {
      RETURN_IF_ERROR(sink.write_row_group(builders, static_cast<int64_t>(group_rows)));
      group_rows = 0;
      group_bytes = 0;
      if (options.on_progress) options.on_progress(summary.rows);
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
  if (group_rows > 0 || summary.rows == 0) {
    RETURN_IF_ERROR(sink.write_row_group(builders, static_cast<int64_t>(group_rows)));
  }
  RETURN_IF_ERROR(sink.close());
  if (options.on_progress) options.on_progress(summary.rows);

  std::error_code error;
  summary.bytes = std::filesystem::file_size(file, error);
  summary.elapsed_ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  partial.keep = true;
  return summary;
}

}  // namespace quarry::data

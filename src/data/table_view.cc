#include "data/table_view.h"

#include <arrow/api.h>
#include <arrow/compute/api.h>
#include <arrow/compute/initialize.h>
#include <arrow/csv/api.h>
#include <arrow/io/file.h>
#include <parquet/arrow/reader.h>

#include <cmath>

#include "common/units.h"

namespace quarry::data {
namespace {

Result<void> compute_ready() {
  // Arrow's compute kernels register themselves once per process.
  static const arrow::Status initialized = arrow::compute::Initialize();
  if (!initialized.ok()) {
    return make_error(ErrorCode::kInternal, "Arrow compute: {}", initialized.ToString());
  }
  return {};
}

// What showing a table may take in memory: its file may be small and its values many (a column
// of one repeated value compresses to nearly nothing), and a sort takes an index and a copy.
// The file comes from a sandbox, so every allocation of Arrow's for it counts, not what the
// file's metadata says it holds.
class TableMemory {
 public:
  explicit TableMemory(uint64_t limit)
      : limit_(limit), capped_(&counted_, static_cast<int64_t>(limit)) {}
  arrow::MemoryPool* pool() { return &capped_; }
  uint64_t limit() const { return limit_; }
  Error too_much() const {
    return Error{ErrorCode::kResourceExhausted,
                 fmt::format("the table takes more than {} in memory to show; download it instead",
                             format_size(limit_))};
  }
  // The error of a failed Arrow call: out of this memory, or `otherwise`.
  template <typename Otherwise>
  Error of(const arrow::Status& status, Otherwise otherwise) const {
    return status.IsOutOfMemory() ? too_much() : otherwise(status);
  }

 private:
  uint64_t limit_;
  // This table's allocations counted apart from the process's, and capped.
  arrow::ProxyMemoryPool counted_{arrow::default_memory_pool()};
  arrow::CappedMemoryPool capped_;
};

Result<std::shared_ptr<arrow::Table>> read_table(const std::filesystem::path& path,
                                                 std::string_view type, TableMemory& memory) {
  auto unreadable = [&](const arrow::Status& status) {
    return memory.of(status, [&](const arrow::Status& status) {
      return Error{ErrorCode::kFailedPrecondition,
                   fmt::format("the file is not a readable {} table: {}", type, status.message())};
    });
  };
  auto file = arrow::io::ReadableFile::Open(path.string());
  if (!file.ok()) return std::unexpected(unreadable(file.status()));
  if (type == "parquet") {
    parquet::arrow::FileReaderBuilder builder;
    if (auto opened = builder.Open(*file, parquet::ReaderProperties(memory.pool())); !opened.ok()) {
      return std::unexpected(unreadable(opened));
    }
    // What the file says its values take, to refuse early; the pool holds the line should it
    // say less than it holds.
    int64_t values_bytes = 0;
    const auto metadata = builder.raw_reader()->metadata();
    for (int group = 0; group < metadata->num_row_groups(); ++group) {
      values_bytes += metadata->RowGroup(group)->total_byte_size();
    }
    if (values_bytes < 0 || static_cast<uint64_t>(values_bytes) > memory.limit()) {
      return std::unexpected(memory.too_much());
    }
    // Read on this thread only (no threads, no reads ahead), so nothing allocated from the
    // pool outlives it.
    parquet::ArrowReaderProperties properties;
    properties.set_use_threads(false);
    properties.set_pre_buffer(false);
    auto reader = builder.memory_pool(memory.pool())->properties(properties)->Build();
    if (!reader.ok()) return std::unexpected(unreadable(reader.status()));
    auto table = (*reader)->ReadTable();
    if (!table.ok()) return std::unexpected(unreadable(table.status()));
    return *table;
  }
  if (type == "csv") {
    // Not through the capped pool: the reader finishes on Arrow's threads, after this returns,
    // and would free into a pool that is gone. A CSV table takes a few times its file's size
    // at most (a number of one digit and its comma: 8 bytes), which max_file_bytes bounds.
    auto reader = arrow::csv::TableReader::Make(
        arrow::io::default_io_context(), *file, arrow::csv::ReadOptions::Defaults(),
        arrow::csv::ParseOptions::Defaults(), arrow::csv::ConvertOptions::Defaults());
    if (!reader.ok()) return std::unexpected(unreadable(reader.status()));
    auto table = (*reader)->Read();
    if (!table.ok()) return std::unexpected(unreadable(table.status()));
    return *table;
  }
  return make_error(ErrorCode::kInvalidArgument, "a {} file is not a table (csv or parquet)", type);
}

// The largest integer a JavaScript number (a double) holds exactly.
constexpr int64_t kSafeInteger = (int64_t{1} << 53) - 1;

nlohmann::json value_json(const arrow::Scalar& scalar) {
  if (!scalar.is_valid) return nullptr;
  switch (scalar.type->id()) {
    case arrow::Type::BOOL:
      return static_cast<const arrow::BooleanScalar&>(scalar).value;
    case arrow::Type::INT8:
    case arrow::Type::INT16:
    case arrow::Type::INT32:
    case arrow::Type::INT64: {
      auto cast = scalar.CastTo(arrow::int64());
      if (!cast.ok()) return scalar.ToString();
      const int64_t value = static_cast<const arrow::Int64Scalar&>(**cast).value;
      return value >= -kSafeInteger && value <= kSafeInteger ? nlohmann::json(value)
                                                             : nlohmann::json(scalar.ToString());
    }
    case arrow::Type::UINT8:
    case arrow::Type::UINT16:
    case arrow::Type::UINT32:
    case arrow::Type::UINT64: {
      auto cast = scalar.CastTo(arrow::uint64());
      if (!cast.ok()) return scalar.ToString();
      const uint64_t value = static_cast<const arrow::UInt64Scalar&>(**cast).value;
      return value <= static_cast<uint64_t>(kSafeInteger) ? nlohmann::json(value)
                                                          : nlohmann::json(scalar.ToString());
    }
    case arrow::Type::HALF_FLOAT:
    case arrow::Type::FLOAT:
    case arrow::Type::DOUBLE: {
      auto cast = scalar.CastTo(arrow::float64());
      if (!cast.ok()) return scalar.ToString();
      const double value = static_cast<const arrow::DoubleScalar&>(**cast).value;
      return std::isfinite(value) ? nlohmann::json(value) : nlohmann::json(scalar.ToString());
    }
    case arrow::Type::STRING:
    case arrow::Type::LARGE_STRING:
    case arrow::Type::STRING_VIEW:
      return std::string(static_cast<const arrow::BaseBinaryScalar&>(scalar).view());
    default:
      return scalar.ToString();
  }
}

}  // namespace

Result<nlohmann::json> read_table_page(const std::filesystem::path& path, std::string_view type,
                                       const TablePageRequest& request) {
  RETURN_IF_ERROR(compute_ready());
  std::error_code error;
  const auto size = std::filesystem::file_size(path, error);
  if (!error && size > request.max_file_bytes) {
    return make_error(ErrorCode::kResourceExhausted,
                      "the file is {}, larger than the {} shown as a table; download it instead",
                      format_size(size), format_size(request.max_file_bytes));
  }
  TableMemory memory(request.max_memory_bytes);
  ASSIGN_OR_RETURN(auto table, read_table(path, type, memory));
  nlohmann::json columns = nlohmann::json::array();
  for (const auto& field : table->schema()->fields()) {
    columns.push_back({{"name", field->name()}, {"type", field->type()->ToString()}});
  }
  const auto total = static_cast<uint64_t>(table->num_rows());
  if (!request.sort.empty()) {
    if (table->schema()->GetFieldIndex(request.sort) < 0) {
      std::vector<std::string> names = table->schema()->field_names();
      return make_error(ErrorCode::kInvalidArgument, "there is no column '{}' to sort by ({})",
                        request.sort, fmt::join(names, ", "));
    }
    arrow::compute::SortOptions options({arrow::compute::SortKey(
        request.sort, request.descending ? arrow::compute::SortOrder::Descending
                                         : arrow::compute::SortOrder::Ascending)});
    arrow::compute::ExecContext context(memory.pool());
    auto indices = arrow::compute::SortIndices(arrow::Datum(table), options, &context);
    if (!indices.ok()) {
      return std::unexpected(memory.of(indices.status(), [&](const arrow::Status& status) {
        return Error{ErrorCode::kInvalidArgument,
                     fmt::format("cannot sort by '{}': {}", request.sort, status.message())};
      }));
    }
    auto sorted =
        arrow::compute::Take(table, *indices, arrow::compute::TakeOptions::Defaults(), &context);
    if (!sorted.ok()) {
      return std::unexpected(memory.of(sorted.status(), [&](const arrow::Status& status) {
        return Error{ErrorCode::kInternal,
                     fmt::format("sorting by '{}': {}", request.sort, status.message())};
      }));
    }
    table = sorted->table();
  }
  nlohmann::json rows = nlohmann::json::array();
  const uint64_t end = std::min(total, request.offset + request.limit);
  for (uint64_t row = request.offset; row < end; ++row) {
    nlohmann::json values = nlohmann::json::array();
    for (const auto& column : table->columns()) {
      auto scalar = column->GetScalar(static_cast<int64_t>(row));
      values.push_back(scalar.ok() ? value_json(**scalar) : nlohmann::json(nullptr));
    }
    rows.push_back(std::move(values));
  }
  return nlohmann::json{{"columns", columns},
                        {"rows", rows},
                        {"total_rows", total},
                        {"offset", request.offset},
                        {"limit", request.limit}};
}

}  // namespace quarry::data

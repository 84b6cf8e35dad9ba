#include "data/column_builder.h"

#include <arrow/api.h>
#include <arrow/util/utf8.h>

#include <bit>

namespace quarry::data {
namespace {

Result<void> check_length(std::string_view value, size_t expected) {
  if (value.size() != expected) {
    return make_error(ErrorCode::kInternal, "a binary value is {} bytes where {} were expected",
                      value.size(), expected);
  }
  return {};
}

// Arrow's and Parquet's strings are UTF-8, and readers refuse a file with other bytes in one.
// Connections ask for UTF-8 (client_encoding), so the server converts its text, but a "char"
// holds any single byte, unconverted, and a SQL_ASCII database's text is bytes it never checked.
Result<void> check_utf8(std::string_view value) {
  static const bool initialized = (arrow::util::InitializeUTF8(), true);
  (void)initialized;
  if (arrow::util::ValidateUTF8(value)) return {};
  return make_error(ErrorCode::kInvalidArgument,
                    "has text that is not UTF-8 (is the database SQL_ASCII?); export "
                    "it as bytes in SQL (::bytea) or convert it to UTF-8 (convert_from)");
}

template <typename Builder, typename... Args>
Result<void> append_to(arrow::ArrayBuilder& builder, Args&&... args) {
  return from_status(static_cast<Builder&>(builder).Append(std::forward<Args>(args)...),
                     "appending a value");
}

}  // namespace

Result<void> from_status(const arrow::Status& status, std::string_view what) {
  if (status.ok()) return {};
  const ErrorCode code = status.IsOutOfMemory() ? ErrorCode::kResourceExhausted
                         : status.IsIOError()   ? ErrorCode::kUnavailable
                         : status.IsInvalid() || status.IsCapacityError()
                             ? ErrorCode::kInvalidArgument
                             : ErrorCode::kInternal;
  return make_error(code, "{}: {}", what, status.ToString());
}

ColumnBuilder::ColumnBuilder(std::string name, ColumnType type,
                             std::unique_ptr<arrow::ArrayBuilder> builder)
    : name_(std::move(name)), type_(std::move(type)), builder_(std::move(builder)) {
  values_ = type_.is_array ? static_cast<arrow::ListBuilder&>(*builder_).value_builder() : nullptr;
}

ColumnBuilder::~ColumnBuilder() = default;

Result<std::unique_ptr<ColumnBuilder>> ColumnBuilder::make(std::string name, ColumnType type) {
  auto builder = arrow::MakeBuilder(type.arrow_type, arrow::default_memory_pool());
  if (!builder.ok()) {
    RETURN_IF_ERROR(from_status(builder.status(), fmt::format("column '{}'", name)));
  }
  return std::unique_ptr<ColumnBuilder>(
      new ColumnBuilder(std::move(name), std::move(type), std::move(*builder)));
}

std::unexpected<Error> ColumnBuilder::column_error(const Error& error) const {
  return std::unexpected(Error{error.code, fmt::format("column '{}' {}", name_, error.message)});
}

Result<void> ColumnBuilder::append(const CopyField& field) {
  if (field.is_null()) return from_status(builder_->AppendNull(), "appending NULL");
  auto appended =
      type_.is_array ? append_array(field.bytes()) : append_value(*builder_, field.bytes());
  if (!appended) return column_error(appended.error());
  return {};
}

Result<void> ColumnBuilder::append_array(std::string_view value) {
  // ndim, has-null flag, element OID, then (size, lower bound) per dimension, then elements
  // as (length, bytes), -1 for NULL.
  if (value.size() < 12) return make_error(ErrorCode::kInternal, "array value is too short");
  const int32_t dimensions = read_int32(value.data());
  const auto element_oid = static_cast<uint32_t>(read_int32(value.data() + 8));
  auto& list = static_cast<arrow::ListBuilder&>(*builder_);
  RETURN_IF_ERROR(from_status(list.Append(), "starting a list"));
  if (dimensions == 0) return {};  // '{}'
  if (dimensions != 1) {
    return make_error(ErrorCode::kInvalidArgument,
                      "has a {}-dimensional array; only one-dimensional arrays become lists "
                      "(unnest it or cast it to text in SQL)",
                      dimensions);
  }
  if (element_oid != type_.element_oid) {
    return make_error(ErrorCode::kInternal, "array elements have type OID {}, expected {}",
                      element_oid, type_.element_oid);
  }
  if (value.size() < 20) return make_error(ErrorCode::kInternal, "array value is too short");
  const int32_t count = read_int32(value.data() + 12);
  size_t offset = 20;
  for (int32_t element_idx = 0; element_idx < count; ++element_idx) {
    if (value.size() < offset + 4) return make_error(ErrorCode::kInternal, "array is truncated");
    const int32_t length = read_int32(value.data() + offset);
    offset += 4;
    if (length < 0) {
      RETURN_IF_ERROR(from_status(values_->AppendNull(), "appending NULL"));
      continue;
    }
    if (value.size() < offset + static_cast<size_t>(length)) {
      return make_error(ErrorCode::kInternal, "array is truncated");
    }
    RETURN_IF_ERROR(append_value(*values_, value.substr(offset, static_cast<size_t>(length))));
    offset += static_cast<size_t>(length);
  }
  return {};
}

Result<void> ColumnBuilder::append_value(arrow::ArrayBuilder& builder, std::string_view value) {
  switch (type_.kind) {
    case ValueKind::kBool:
      RETURN_IF_ERROR(check_length(value, 1));
      return append_to<arrow::BooleanBuilder>(builder, value[0] != 0);
    case ValueKind::kInt16:
      RETURN_IF_ERROR(check_length(value, 2));
      return append_to<arrow::Int16Builder>(builder, read_int16(value.data()));
    case ValueKind::kInt32:
      RETURN_IF_ERROR(check_length(value, 4));
      return append_to<arrow::Int32Builder>(builder, read_int32(value.data()));
    case ValueKind::kInt64:
      RETURN_IF_ERROR(check_length(value, 8));
      return append_to<arrow::Int64Builder>(builder, read_int64(value.data()));
    case ValueKind::kFloat32: {
      RETURN_IF_ERROR(check_length(value, 4));
      return append_to<arrow::FloatBuilder>(
          builder, std::bit_cast<float>(static_cast<uint32_t>(read_int32(value.data()))));
    }
    case ValueKind::kFloat64: {
      RETURN_IF_ERROR(check_length(value, 8));
      return append_to<arrow::DoubleBuilder>(
          builder, std::bit_cast<double>(static_cast<uint64_t>(read_int64(value.data()))));
    }
    case ValueKind::kNumeric: {
      ASSIGN_OR_RETURN(__int128 unscaled, numeric_to_unscaled(value, type_.precision, type_.scale));
      const auto bits = static_cast<unsigned __int128>(unscaled);
      return append_to<arrow::Decimal128Builder>(
          builder, arrow::Decimal128(static_cast<int64_t>(bits >> 64),
                                     static_cast<uint64_t>(bits & ~uint64_t{0})));
    }
    case ValueKind::kText:
      RETURN_IF_ERROR(check_utf8(value));
      return append_to<arrow::StringBuilder>(builder, value);
    case ValueKind::kJsonb:
      if (value.empty() || value[0] != 1) {
        return make_error(ErrorCode::kInternal, "has a jsonb value of an unknown version");
      }
      RETURN_IF_ERROR(check_utf8(value.substr(1)));
      return append_to<arrow::StringBuilder>(builder, value.substr(1));
    case ValueKind::kUuid:
      RETURN_IF_ERROR(check_length(value, 16));
      return append_to<arrow::StringBuilder>(builder, uuid_to_string(value));
    case ValueKind::kBytea:
      return append_to<arrow::BinaryBuilder>(builder, value);
    case ValueKind::kDate: {
      RETURN_IF_ERROR(check_length(value, 4));
      ASSIGN_OR_RETURN(int32_t days, date_to_unix_days(read_int32(value.data())));
      return append_to<arrow::Date32Builder>(builder, days);
    }
    case ValueKind::kTime: {
      RETURN_IF_ERROR(check_length(value, 8));
      ASSIGN_OR_RETURN(int64_t micros, time_of_day_micros(read_int64(value.data())));
      return append_to<arrow::Time64Builder>(builder, micros);
    }
    case ValueKind::kTimestamp:
    case ValueKind::kTimestampTz: {
      RETURN_IF_ERROR(check_length(value, 8));
      ASSIGN_OR_RETURN(int64_t micros, timestamp_to_unix_micros(read_int64(value.data())));
      return append_to<arrow::TimestampBuilder>(builder, micros);
    }
  }
  return make_error(ErrorCode::kInternal, "unhandled value kind");
}

Result<std::shared_ptr<arrow::Array>> ColumnBuilder::finish() {
  std::shared_ptr<arrow::Array> array;
  RETURN_IF_ERROR(from_status(builder_->Finish(&array), fmt::format("column '{}'", name_)));
  return array;
}

}  // namespace quarry::data

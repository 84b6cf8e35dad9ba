#include "data/column_builder.h"

#include <arrow/api.h>
#include <arrow/util/utf8.h>
#include <endian.h>

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
// Connections ask for UTF-8 (client_encoding), so the server converts its text, but a SQL_ASCII
// database's text is bytes it never checked.
Result<void> check_utf8(std::string_view value) {
  static const bool initialized = (arrow::util::InitializeUTF8(), true);
  (void)initialized;
  if (arrow::util::ValidateUTF8(value)) return {};
  return make_error(ErrorCode::kInvalidArgument,
                    "has text that is not UTF-8 (is the database SQL_ASCII?); export "
                    "it as bytes in SQL (::bytea) or convert it to UTF-8 (convert_from)");
}

// Whether a column of this plan has values to measure: a value-dependent part decoded from
// its binary form (the text form is the same whatever the values).
bool measures(const ColumnPlan& plan) {
  return plan.shapes > 0 && plan.select != Select::kText;
}

template <typename Builder, typename... Args>
Result<void> append_to(arrow::ArrayBuilder& builder, Args&&... args) {
  return from_status(static_cast<Builder&>(builder).Append(std::forward<Args>(args)...),
                     "appending a value");
}

// Whether a date or time PostgreSQL holds is beyond what Arrow's type does ('infinity',
// 24:00:00, past the year 294247); a value PostgreSQL would not send is an error.
template <typename T>
Result<bool> beyond(const Result<T>& converted) {
  if (converted) return false;
  if (converted.error().code == ErrorCode::kInvalidArgument) return true;
  return std::unexpected(converted.error());
}

// Reads the (length, bytes) items of binary arrays and records; -1 is NULL.
class ItemReader {
 public:
  explicit ItemReader(std::string_view data) : data_(data) {}
  Result<int32_t> int32() {
    if (data_.size() < 4) return make_error(ErrorCode::kInternal, "a binary value is truncated");
    const int32_t value = read_int32(data_.data());
    data_.remove_prefix(4);
    return value;
  }
  // The next item; nullopt for NULL.
  Result<std::optional<std::string_view>> item() {
    ASSIGN_OR_RETURN(const int32_t length, int32());
    if (length < 0) return std::nullopt;
    if (data_.size() < static_cast<size_t>(length)) {
      return make_error(ErrorCode::kInternal, "a binary value is truncated");
    }
    auto bytes = data_.substr(0, static_cast<size_t>(length));
    data_.remove_prefix(static_cast<size_t>(length));
    return bytes;
  }
  bool empty() const { return data_.empty(); }

 private:
  std::string_view data_;
};

// The builder of `type`'s values, made part by part so each is the class the decoder takes it
// for. An enum's labels go into its dictionary first, so the dictionary is the enum in its
// order (labels no value uses included), the same in every row group.
Result<std::shared_ptr<arrow::ArrayBuilder>> make_arrow_builder(const ValueType& type) {
  auto* pool = arrow::default_memory_pool();
  switch (type.kind) {
    case ValueKind::kEnum: {
      auto builder = std::make_shared<arrow::StringDictionary32Builder>(pool);
      arrow::StringBuilder labels;
      RETURN_IF_ERROR(from_status(labels.AppendValues(type.names), "listing the enum's labels"));
      std::shared_ptr<arrow::Array> array;
      RETURN_IF_ERROR(from_status(labels.Finish(&array), "listing the enum's labels"));
      RETURN_IF_ERROR(from_status(builder->InsertMemoValues(*array), "listing the enum's labels"));
      return builder;
    }
    case ValueKind::kList: {
      ASSIGN_OR_RETURN(auto values, make_arrow_builder(type.children[0]));
      auto value_type = type.children[0].arrow_type;
      for (int level = 0; level < type.dimensions; ++level) {
        value_type = arrow::list(arrow::field("element", value_type));
        values = std::make_shared<arrow::ListBuilder>(pool, std::move(values), value_type);
      }
      return values;
    }
    case ValueKind::kStruct: {
      std::vector<std::shared_ptr<arrow::ArrayBuilder>> fields;
      for (const auto& field : type.children) {
        ASSIGN_OR_RETURN(auto builder, make_arrow_builder(field));
        fields.push_back(std::move(builder));
      }
      return std::make_shared<arrow::StructBuilder>(type.arrow_type, pool, std::move(fields));
    }
    default: {
      std::unique_ptr<arrow::ArrayBuilder> builder;
      RETURN_IF_ERROR(from_status(arrow::MakeBuilder(pool, type.arrow_type, &builder),
                                  "making a column builder"));
      return std::shared_ptr<arrow::ArrayBuilder>(std::move(builder));
    }
  }
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

ColumnBuilder::ColumnBuilder(std::string name, PgType type, std::vector<ValueShape> shapes,
                             ColumnPlan plan, Mode mode)
    : name_(std::move(name)),
      type_(std::move(type)),
      decided_(std::move(shapes)),
      plan_(std::move(plan)),
      select_(plan_.select),
      mode_(mode) {
  decided_.resize(plan_.shapes);
  seen_ = decided_;
}

ColumnBuilder::~ColumnBuilder() = default;

Result<std::unique_ptr<ColumnBuilder>> ColumnBuilder::make(std::string name, PgType type,
                                                           std::vector<ValueShape> shapes,
                                                           bool sample) {
  ColumnPlan plan = plan_column(type, shapes);
  const Mode mode = sample && measures(plan) ? Mode::kSampling : Mode::kDecoding;
  std::unique_ptr<ColumnBuilder> builder(new ColumnBuilder(
      std::move(name), std::move(type), std::move(shapes), std::move(plan), mode));
  if (mode == Mode::kDecoding) RETURN_IF_ERROR(builder->make_builder());
  return builder;
}

Result<void> ColumnBuilder::make_builder() {
  ASSIGN_OR_RETURN(builder_,
                   with_context(make_arrow_builder(plan_.type), fmt::format("column '{}'", name_)));
  return {};
}

std::unexpected<Error> ColumnBuilder::column_error(const Error& error) const {
  return std::unexpected(Error{error.code, fmt::format("column '{}' {}", name_, error.message)});
}

Result<void> ColumnBuilder::append(const CopyField& field) {
  if (mode_ == Mode::kDecoding) {  // every value but those of the first row group: kept short
    if (field.is_null()) return from_status(builder_->AppendNull(), "appending NULL");
    if (auto visited = visit(plan_.type, field.bytes(), builder_.get()); !visited) {
      return column_error(visited.error());
    }
    if (misfit_) mode_ = Mode::kMeasuring;
    return {};
  }
  if (mode_ == Mode::kSampling) {
    const int32_t length = field.is_null() ? -1 : static_cast<int32_t>(field.bytes().size());
    const uint32_t big_endian = htobe32(static_cast<uint32_t>(length));
    samples_.append(reinterpret_cast<const char*>(&big_endian), sizeof big_endian);
    samples_.append(field.bytes());
  }
  // Sampling or measuring: only the parts that depend on the values are looked at.
  if (field.is_null() || !measures(plan_)) return {};
  if (auto visited = visit(plan_.type, field.bytes(), nullptr); !visited) {
    return column_error(visited.error());
  }
  return {};
}

Result<void> ColumnBuilder::decide() {
  if (mode_ != Mode::kSampling) return {};
  decided_ = seen_;
  plan_ = plan_column(type_, decided_);
  mode_ = Mode::kDecoding;
  if (plan_.select != select_) {
    // The values need their text form, which only a new run of the query can give.
    misfit_ = true;
    mode_ = Mode::kMeasuring;
    samples_.clear();
    return {};
  }
  RETURN_IF_ERROR(make_builder());
  ItemReader samples(samples_);
  while (!samples.empty()) {
    ASSIGN_OR_RETURN(auto value, samples.item());
    if (!value) {
      RETURN_IF_ERROR(from_status(builder_->AppendNull(), "appending NULL"));
    } else if (auto visited = visit(plan_.type, *value, builder_.get()); !visited) {
      return column_error(visited.error());
    }
  }
  samples_.clear();
  samples_.shrink_to_fit();
  return {};
}

bool ColumnBuilder::measure(const ValueType& type, const ValueShape& value) {
  auto& seen = seen_[static_cast<size_t>(type.shape)];
  seen.merge(value);
  if (mode_ == Mode::kSampling) return true;  // the plan is made from what sampling sees
  if (same_form(type, decided_[static_cast<size_t>(type.shape)], seen)) return true;
  misfit_ = true;
  return false;
}

template <typename Builder, typename T>
Result<void> ColumnBuilder::append_time(const ValueType& type, const Result<T>& converted,
                                        arrow::ArrayBuilder* builder) {
  if (!converted) {
    ASSIGN_OR_RETURN(const bool beyond_range, beyond(converted));
    if (beyond_range && type.shape >= 0) {
      measure(type, {.special = true});
      return {};
    }
    return std::unexpected(converted.error());
  }
  if (builder == nullptr) return {};
  return append_to<Builder>(*builder, *converted);
}

Result<void> ColumnBuilder::visit(const ValueType& type, std::string_view value,
                                  arrow::ArrayBuilder* builder) {
  switch (type.kind) {
    case ValueKind::kList:
      return visit_array(type, value, builder);
    case ValueKind::kStruct:
      return visit_record(type, value, builder);
    // The value-dependent parts: measured whether or not the value is appended; decoded once.
    case ValueKind::kNumeric:
    case ValueKind::kNumericText:
      if (type.shape >= 0) {
        ASSIGN_OR_RETURN(auto digits, numeric_digits(value));
        if (!measure(type, {.integer_digits = digits.integer_digits,
                            .scale = digits.scale,
                            .special = !digits.finite})) {
          return {};  // the builder's values are dropped anyway
        }
      }
      break;
    case ValueKind::kDate: {
      RETURN_IF_ERROR(check_length(value, 4));
      return append_time<arrow::Date32Builder>(type, date_to_unix_days(read_int32(value.data())),
                                               builder);
    }
    case ValueKind::kTime: {
      RETURN_IF_ERROR(check_length(value, 8));
      return append_time<arrow::Time64Builder>(type, time_of_day_micros(read_int64(value.data())),
                                               builder);
    }
    case ValueKind::kTimestamp:
    case ValueKind::kTimestampTz: {
      RETURN_IF_ERROR(check_length(value, 8));
      return append_time<arrow::TimestampBuilder>(
          type, timestamp_to_unix_micros(read_int64(value.data())), builder);
    }
    case ValueKind::kDuration:
    case ValueKind::kIntervalStruct: {
      ASSIGN_OR_RETURN(auto interval, read_interval(value));
      int64_t micros = 0;
      const bool duration = interval_micros(interval, micros);
      if (!duration && !measure(type, {.calendar = true})) return {};
      if (builder == nullptr) return {};
      if (type.kind == ValueKind::kDuration) {
        return append_to<arrow::DurationBuilder>(*builder, micros);
      }
      auto& parts = static_cast<arrow::StructBuilder&>(*builder);
      RETURN_IF_ERROR(from_status(parts.Append(), "appending an interval"));
      RETURN_IF_ERROR(append_to<arrow::Int32Builder>(*parts.child(0), interval.months));
      RETURN_IF_ERROR(append_to<arrow::Int32Builder>(*parts.child(1), interval.days));
      return append_to<arrow::Int64Builder>(*parts.child(2), interval.microseconds);
    }
    default:
      break;
  }
  if (builder == nullptr) return {};

  switch (type.kind) {
    case ValueKind::kBool:
      RETURN_IF_ERROR(check_length(value, 1));
      return append_to<arrow::BooleanBuilder>(*builder, value[0] != 0);
    case ValueKind::kInt16:
      RETURN_IF_ERROR(check_length(value, 2));
      return append_to<arrow::Int16Builder>(*builder, read_int16(value.data()));
    case ValueKind::kInt32:
      RETURN_IF_ERROR(check_length(value, 4));
      return append_to<arrow::Int32Builder>(*builder, read_int32(value.data()));
    case ValueKind::kInt64:
      RETURN_IF_ERROR(check_length(value, 8));
      return append_to<arrow::Int64Builder>(*builder, read_int64(value.data()));
    case ValueKind::kFloat32: {
      RETURN_IF_ERROR(check_length(value, 4));
      return append_to<arrow::FloatBuilder>(
          *builder, std::bit_cast<float>(static_cast<uint32_t>(read_int32(value.data()))));
    }
    case ValueKind::kFloat64: {
      RETURN_IF_ERROR(check_length(value, 8));
      return append_to<arrow::DoubleBuilder>(
          *builder, std::bit_cast<double>(static_cast<uint64_t>(read_int64(value.data()))));
    }
    case ValueKind::kNumeric: {
      ASSIGN_OR_RETURN(__int128 unscaled, numeric_to_unscaled(value, type.precision, type.scale));
      const auto bits = static_cast<unsigned __int128>(unscaled);
      return append_to<arrow::Decimal128Builder>(
          *builder, arrow::Decimal128(static_cast<int64_t>(bits >> 64),
                                      static_cast<uint64_t>(bits & ~uint64_t{0})));
    }
    case ValueKind::kNumericText: {
      ASSIGN_OR_RETURN(auto text, numeric_to_text(value));
      return append_to<arrow::StringBuilder>(*builder, text);
    }
    case ValueKind::kText:
      RETURN_IF_ERROR(check_utf8(value));
      return append_to<arrow::StringBuilder>(*builder, value);
    case ValueKind::kChar: {
      // A "char" is any one byte, sent unconverted: as PostgreSQL 15's output function prints
      // it (what query_database shows), NUL as nothing and a byte past ASCII as \ooo.
      RETURN_IF_ERROR(check_length(value, 1));
      const auto byte = static_cast<unsigned char>(value[0]);
      if (byte == 0) return append_to<arrow::StringBuilder>(*builder, std::string_view());
      if (byte < 0x80) return append_to<arrow::StringBuilder>(*builder, value);
      return append_to<arrow::StringBuilder>(
          *builder, fmt::format("\\{}{}{}", byte >> 6, (byte >> 3) & 7, byte & 7));
    }
    case ValueKind::kEnum:
      RETURN_IF_ERROR(check_utf8(value));
      return append_to<arrow::StringDictionary32Builder>(*builder, value);
    case ValueKind::kJsonb:
      if (value.empty() || value[0] != 1) {
        return make_error(ErrorCode::kInternal, "has a jsonb value of an unknown version");
      }
      RETURN_IF_ERROR(check_utf8(value.substr(1)));
      return append_to<arrow::StringBuilder>(*builder, value.substr(1));
    case ValueKind::kUuid:
      RETURN_IF_ERROR(check_length(value, 16));
      return append_to<arrow::StringBuilder>(*builder, uuid_to_string(value));
    case ValueKind::kBytea:
      return append_to<arrow::BinaryBuilder>(*builder, value);
    default:  // decoded above
      break;
  }
  return make_error(ErrorCode::kInternal, "unhandled value kind");
}

Result<void> ColumnBuilder::visit_array(const ValueType& type, std::string_view value,
                                        arrow::ArrayBuilder* builder) {
  // ndim, has-null flag, element OID, then (size, lower bound) per dimension, then the elements
  // in row-major order as (length, bytes), -1 for NULL.
  ItemReader reader(value);
  ASSIGN_OR_RETURN(const int32_t dimensions, reader.int32());
  ASSIGN_OR_RETURN(const int32_t has_nulls, reader.int32());
  ASSIGN_OR_RETURN(const int32_t element_oid, reader.int32());
  (void)has_nulls;
  // PostgreSQL allows 6 dimensions (MAXDIM); anything past that is not an array it sent.
  if (dimensions < 0 || dimensions > 6) {
    return make_error(ErrorCode::kInternal, "has an array of {} dimensions", dimensions);
  }
  if (dimensions > 0 && static_cast<uint32_t>(element_oid) != type.children[0].wire_oid) {
    return make_error(ErrorCode::kInternal, "array elements have type OID {}, expected {}",
                      static_cast<uint32_t>(element_oid), type.children[0].wire_oid);
  }
  std::vector<int32_t> sizes;
  ValueShape shape;
  shape.dimensions = dimensions;
  int64_t count = dimensions > 0 ? 1 : 0;
  for (int32_t dimension = 0; dimension < dimensions; ++dimension) {
    ASSIGN_OR_RETURN(const int32_t size, reader.int32());
    ASSIGN_OR_RETURN(const int32_t lower_bound, reader.int32());
    // Each element takes at least its 4-byte length, which bounds the count by the value's size.
    if (size < 0 || (count *= size) > static_cast<int64_t>(value.size())) {
      return make_error(ErrorCode::kInternal, "has an array of a bad size");
    }
    if (lower_bound != 1) shape.irregular = true;
    sizes.push_back(size);
  }
  // A misfit drops the builder's values, but the rest of the value is still measured.
  if (!measure(type, shape)) builder = nullptr;
  if (builder != nullptr && count == 0) {
    return from_status(static_cast<arrow::ListBuilder&>(*builder).Append(), "starting a list");
  }
  // One list per dimension: level 0 is the column's list; the elements go into the innermost.
  // A list at a level holds `spans` elements: for sizes {2, 3}, 6 at level 0 and 3 at level 1,
  // so element 3 starts the second inner list.
  std::vector<arrow::ListBuilder*> lists;
  std::vector<int64_t> spans(sizes.size());
  if (builder != nullptr) {
    arrow::ArrayBuilder* list = builder;
    for (int level = 0; level < type.dimensions; ++level) {
      lists.push_back(static_cast<arrow::ListBuilder*>(list));
      list = lists.back()->value_builder();
    }
    int64_t span = 1;
    for (size_t level = sizes.size(); level-- > 0;)
      spans[level] = span *= sizes[level];
  }
  const ValueType& element_type = type.children[0];
  for (int64_t element_idx = 0; element_idx < count; ++element_idx) {
    // Outer lists first: a list's offset is where its child's values stand when it starts.
    for (size_t level = 0; level < lists.size(); ++level) {
      if (element_idx % spans[level] == 0) {
        RETURN_IF_ERROR(from_status(lists[level]->Append(), "starting a list"));
      }
    }
    ASSIGN_OR_RETURN(auto element, reader.item());
    arrow::ArrayBuilder* values = lists.empty() ? nullptr : lists.back()->value_builder();
    if (!element) {
      if (values != nullptr) RETURN_IF_ERROR(from_status(values->AppendNull(), "appending NULL"));
      continue;
    }
    RETURN_IF_ERROR(visit(element_type, *element, values));
    if (misfit_) lists.clear();
  }
  if (!reader.empty()) return make_error(ErrorCode::kInternal, "an array has bytes past its end");
  return {};
}

Result<void> ColumnBuilder::visit_record(const ValueType& type, std::string_view value,
                                         arrow::ArrayBuilder* builder) {
  // The field count, then (type OID, length, bytes) per field, -1 for NULL.
  ItemReader reader(value);
  ASSIGN_OR_RETURN(const int32_t count, reader.int32());
  if (count < 0 || static_cast<size_t>(count) != type.children.size()) {
    return make_error(ErrorCode::kInternal, "has a record of {} fields where {} were expected",
                      count, type.children.size());
  }
  auto* fields = misfit_ ? nullptr : static_cast<arrow::StructBuilder*>(builder);
  if (fields != nullptr) RETURN_IF_ERROR(from_status(fields->Append(), "starting a record"));
  for (size_t field_idx = 0; field_idx < type.children.size(); ++field_idx) {
    const ValueType& field_type = type.children[field_idx];
    ASSIGN_OR_RETURN(const int32_t field_oid, reader.int32());
    if (static_cast<uint32_t>(field_oid) != field_type.wire_oid) {
      return make_error(ErrorCode::kInternal, "field '{}' has type OID {}, expected {}",
                        type.names[field_idx], static_cast<uint32_t>(field_oid),
                        field_type.wire_oid);
    }
    ASSIGN_OR_RETURN(auto field, reader.item());
    arrow::ArrayBuilder* child =
        fields == nullptr ? nullptr : fields->child(static_cast<int>(field_idx));
    if (!field) {
      if (child != nullptr) RETURN_IF_ERROR(from_status(child->AppendNull(), "appending NULL"));
      continue;
    }
    RETURN_IF_ERROR(visit(field_type, *field, child));
    if (misfit_) fields = nullptr;
  }
  if (!reader.empty()) return make_error(ErrorCode::kInternal, "a record has bytes past its end");
  return {};
}

Result<std::shared_ptr<arrow::Array>> ColumnBuilder::finish() {
  if (mode_ != Mode::kDecoding) {
    return make_error(ErrorCode::kInternal, "column '{}' has no values to write yet", name_);
  }
  std::shared_ptr<arrow::Array> array;
  RETURN_IF_ERROR(from_status(builder_->Finish(&array), fmt::format("column '{}'", name_)));
  return array;
}

}  // namespace quarry::data

#include "data/pg_types.h"

#include <arrow/type.h>
#include <endian.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>
#include <optional>

namespace quarry::data {
namespace {

// PostgreSQL's epoch is 2000-01-01; Arrow's is 1970-01-01.
constexpr int32_t kEpochDays = 10957;
constexpr int64_t kEpochMicros = int64_t{kEpochDays} * 86400 * 1000000;

constexpr int kMaxDecimalPrecision = 38;

struct ArrayType {
  uint32_t array_oid;
  uint32_t element_oid;
};
// The array types of the built-in types below (pg_type.typarray).
constexpr ArrayType kArrayTypes[] = {
    {1000, oid::kBool},      {1001, oid::kBytea},       {1002, oid::kChar},    {1003, oid::kName},
    {1016, oid::kInt8},      {1005, oid::kInt2},        {1007, oid::kInt4},    {1009, oid::kText},
    {199, oid::kJson},       {143, oid::kXml},          {1021, oid::kFloat4},  {1022, oid::kFloat8},
    {1014, oid::kBpchar},    {1015, oid::kVarchar},     {1182, oid::kDate},    {1183, oid::kTime},
    {1115, oid::kTimestamp}, {1185, oid::kTimestampTz}, {1231, oid::kNumeric}, {2951, oid::kUuid},
    {3807, oid::kJsonb},     {1187, oid::kInterval},
};

bool builtin_scalar(uint32_t type_oid) {
  switch (type_oid) {
    case oid::kBool:
    case oid::kBytea:
    case oid::kChar:
    case oid::kName:
    case oid::kInt8:
    case oid::kInt2:
    case oid::kInt4:
    case oid::kText:
    case oid::kJson:
    case oid::kXml:
    case oid::kFloat4:
    case oid::kFloat8:
    case oid::kBpchar:
    case oid::kVarchar:
    case oid::kDate:
    case oid::kTime:
    case oid::kTimestamp:
    case oid::kTimestampTz:
    case oid::kInterval:
    case oid::kNumeric:
    case oid::kUuid:
    case oid::kJsonb:
      return true;
    default:
      return false;
  }
}

// numeric(p, s) from its type modifier, if it is one a decimal128 holds.
bool decimal_modifier(int32_t modifier, int& precision, int& scale) {
  if (modifier < 4) return false;
  const int32_t packed = modifier - 4;
  precision = (packed >> 16) & 0xffff;
  // The scale is an 11-bit signed number since PostgreSQL 15.
  scale = ((packed & 0x7ff) ^ 1024) - 1024;
  return precision >= 1 && precision <= kMaxDecimalPrecision && scale >= 0 && scale <= precision;
}

ValueType leaf(ValueKind kind, std::shared_ptr<arrow::DataType> arrow_type) {
  ValueType type;
  type.kind = kind;
  type.arrow_type = std::move(arrow_type);
  return type;
}

std::shared_ptr<arrow::DataType> interval_struct() {
  return arrow::struct_({arrow::field("months", arrow::int32()),
                         arrow::field("days", arrow::int32()),
                         arrow::field("microseconds", arrow::int64())});
}

bool numeric_as_text(const ValueShape& shape) {
  return shape.special || shape.widest || shape.integer_digits + shape.scale > kMaxDecimalPrecision;
}

int list_dimensions(const ValueShape& shape) {
  return std::max(shape.dimensions, 1);
}

// Builds the value types of a column's parts, numbering its value-dependent parts depth first.
// A part that cannot be decoded from its binary form makes its whole value go as text.
class Planner {
 public:
  explicit Planner(std::span<const ValueShape> shapes) : shapes_(shapes) {}

  std::optional<ValueType> build(const PgType& type) {
    switch (type.kind) {
      case PgType::Kind::kBase:
        return scalar(type);
      case PgType::Kind::kEnum: {
        auto value = leaf(ValueKind::kEnum, arrow::dictionary(arrow::int32(), arrow::utf8()));
        value.names = type.names;
        note("an enum: its labels as a dictionary, in the enum's order");
        return value;
      }
      case PgType::Kind::kComposite:
        return composite(type);
      case PgType::Kind::kArray:
        return array(type, /*top=*/false);
    }
    return std::nullopt;
  }

  // The column's own array: elements that need their text form get it from the COPY.
  std::optional<ValueType> top_array(const PgType& type, bool& text_elements) {
    return array(type, /*top=*/true, &text_elements);
  }

  int parts() const { return next_; }
  std::string notes() const {
    std::string text;
    for (const auto& [note, _] : notes_)
      text += (text.empty() ? "" : "; ") + note;
    return text;
  }

 private:
  ValueShape take_shape(int& index) {
    index = next_++;
    return static_cast<size_t>(index) < shapes_.size() ? shapes_[static_cast<size_t>(index)]
                                                       : ValueShape{};
  }

  // What the tool result says about a part: how it maps, or why it goes as text. When a part
  // goes as text, what was said of the parts inside it no longer holds, but why they could not
  // be decoded does.
  void note(std::string text, bool reason = false) {
    for (const auto& [said, _] : notes_) {
      if (said == text) return;
    }
    notes_.emplace_back(std::move(text), reason);
  }
  void reason(std::string text) { note(std::move(text), /*reason=*/true); }
  void abandon(size_t mark) {
    std::erase_if(notes_, [&, index = size_t{0}](const auto& note) mutable {
      return index++ >= mark && !note.second;
    });
  }

  std::optional<ValueType> scalar(const PgType& type) {
    switch (type.oid) {
      case oid::kBool:
        return leaf(ValueKind::kBool, arrow::boolean());
      case oid::kInt2:
        return leaf(ValueKind::kInt16, arrow::int16());
      case oid::kInt4:
        return leaf(ValueKind::kInt32, arrow::int32());
      case oid::kInt8:
        return leaf(ValueKind::kInt64, arrow::int64());
      case oid::kFloat4:
        return leaf(ValueKind::kFloat32, arrow::float32());
      case oid::kFloat8:
        return leaf(ValueKind::kFloat64, arrow::float64());
      case oid::kText:
      case oid::kVarchar:
      case oid::kBpchar:
      case oid::kName:
      case oid::kJson:
      case oid::kXml:
        return leaf(ValueKind::kText, arrow::utf8());
      case oid::kChar:
        return leaf(ValueKind::kChar, arrow::utf8());
      case oid::kJsonb:
        return leaf(ValueKind::kJsonb, arrow::utf8());
      case oid::kUuid:
        return leaf(ValueKind::kUuid, arrow::utf8());
      case oid::kBytea:
        return leaf(ValueKind::kBytea, arrow::binary());
      case oid::kDate:
        return time_part(ValueKind::kDate, arrow::date32(), "date");
      case oid::kTime:
        return time_part(ValueKind::kTime, arrow::time64(arrow::TimeUnit::MICRO), "time");
      case oid::kTimestamp:
        return time_part(ValueKind::kTimestamp, arrow::timestamp(arrow::TimeUnit::MICRO),
                         "timestamp");
      case oid::kTimestampTz:
        return time_part(ValueKind::kTimestampTz, arrow::timestamp(arrow::TimeUnit::MICRO, "UTC"),
                         "timestamp");
      case oid::kNumeric:
        return numeric(type);
      case oid::kInterval: {
        int index = 0;
        const ValueShape shape = take_shape(index);
        ValueType value;
        if (shape.calendar || shape.widest) {
          value = leaf(ValueKind::kIntervalStruct, interval_struct());
          note(
              "interval with months: a struct of months, days and microseconds (a month has "
              "no fixed length)");
        } else {
          value = leaf(ValueKind::kDuration, arrow::duration(arrow::TimeUnit::MICRO));
          note(
              "interval: a duration, a day counted as 24 hours (no value has months); DuckDB "
              "reads it as BIGINT microseconds: to_microseconds(x) makes it an INTERVAL");
        }
        value.shape = index;
        return value;
      }
      default:
        reason("no Parquet type: PostgreSQL's text form");
        return std::nullopt;
    }
  }

  std::optional<ValueType> time_part(ValueKind kind, std::shared_ptr<arrow::DataType> arrow_type,
                                     std::string_view what) {
    int index = 0;
    if (const ValueShape shape = take_shape(index); shape.special || shape.widest) {
      reason(
          fmt::format("a value Parquet's {} cannot hold ('infinity', 24:00:00 or past the year "
                      "294247): PostgreSQL's text form",
                      what));
      return std::nullopt;
    }
    auto value = leaf(kind, std::move(arrow_type));
    value.shape = index;
    return value;
  }

  ValueType numeric(const PgType& type) {
    int index = 0;
    const ValueShape shape = take_shape(index);
    ValueType value;
    int precision = 0, scale = 0;
    if (decimal_modifier(type.modifier, precision, scale)) {
      // numeric(p, s) holds NaN too, which no decimal does: only the values tell. (PostgreSQL
      // refuses infinity for any precision, but one would go the same way.)
      if (shape.special || shape.widest) {
        value = leaf(ValueKind::kNumericText, arrow::utf8());
        note(fmt::format("numeric({}, {}) with NaN: PostgreSQL's text form, every digit kept",
                         precision, scale));
      } else {
        value = leaf(ValueKind::kNumeric, arrow::decimal128(precision, scale));
        value.precision = precision;
        value.scale = scale;
      }
      value.fixed_scale = true;
    } else if (numeric_as_text(shape)) {
      value = leaf(ValueKind::kNumericText, arrow::utf8());
      note(
          "numeric values no decimal128 holds (NaN, infinity or more than 38 digits): "
          "PostgreSQL's text form, every digit kept");
    } else {
      value = leaf(ValueKind::kNumeric, arrow::decimal128(kMaxDecimalPrecision, shape.scale));
      value.precision = kMaxDecimalPrecision;
      value.scale = shape.scale;
      note(
          fmt::format("numeric without a precision: decimal128(38, {}), the scale its values "
                      "need, every digit kept",
                      shape.scale));
    }
    value.shape = index;
    return value;
  }

  std::optional<ValueType> composite(const PgType& type) {
    const size_t mark = notes_.size();
    ValueType value;
    value.kind = ValueKind::kStruct;
    value.names = type.names;
    bool decodable = !type.children.empty();
    arrow::FieldVector fields;
    for (size_t field_idx = 0; field_idx < type.children.size(); ++field_idx) {
      // Every field is planned, so the parts keep their numbers whatever becomes of this one.
      auto field = build(type.children[field_idx]);
      if (!field) {
        decodable = false;
        continue;
      }
      field->wire_oid = type.children[field_idx].wire_oid;
      fields.push_back(arrow::field(type.names[field_idx], field->arrow_type));
      value.children.push_back(std::move(*field));
    }
    if (!decodable) {
      abandon(mark);
      reason(type.children.empty() ? "a composite type of no fields: PostgreSQL's text form"
                                   : "a composite type with a field that has no Parquet type: "
                                     "PostgreSQL's text form");
      return std::nullopt;
    }
    value.arrow_type = arrow::struct_(fields);
    note("a composite type: a struct of its fields");
    return value;
  }

  std::optional<ValueType> array(const PgType& type, bool top, bool* text_elements = nullptr) {
    const size_t mark = notes_.size();
    int index = 0;
    const ValueShape shape = take_shape(index);
    auto element = build(type.children.at(0));
    if (shape.irregular || shape.widest) {
      abandon(mark);
      reason("arrays of different dimensions, or not indexed from 1: PostgreSQL's text form");
      return std::nullopt;
    }
    if (!element) {
      if (!top) return std::nullopt;
      *text_elements = true;
      element = leaf(ValueKind::kText, arrow::utf8());
      element->wire_oid = oid::kText;
    } else {
      element->wire_oid = type.children[0].wire_oid;
    }
    ValueType value;
    value.kind = ValueKind::kList;
    value.dimensions = list_dimensions(shape);
    value.shape = index;
    value.arrow_type = element->arrow_type;
    // Lists' values are named "element", as Parquet's writer names them (and readers read).
    for (int level = 0; level < value.dimensions; ++level)
      value.arrow_type = arrow::list(arrow::field("element", value.arrow_type));
    if (value.dimensions > 1) {
      note(fmt::format("{}-dimensional arrays: lists of lists", value.dimensions));
    }
    value.children.push_back(std::move(*element));
    return value;
  }

  std::span<const ValueShape> shapes_;
  int next_ = 0;
  std::vector<std::pair<std::string, bool>> notes_;  // the note, and whether it is a reason
};

}  // namespace

void ValueShape::merge(const ValueShape& other) {
  integer_digits = std::max(integer_digits, other.integer_digits);
  scale = std::max(scale, other.scale);
  special = special || other.special;
  calendar = calendar || other.calendar;
  if (other.dimensions != 0) {
    if (dimensions != 0 && dimensions != other.dimensions) irregular = true;
    dimensions = std::max(dimensions, other.dimensions);
  }
  irregular = irregular || other.irregular;
  widest = widest || other.widest;
}

bool same_form(const ValueType& type, const ValueShape& decided, const ValueShape& seen) {
  switch (type.kind) {
    case ValueKind::kNumeric:
    case ValueKind::kNumericText:
      // numeric(p, s)'s values fit its decimal unless one is not a number.
      if (type.fixed_scale) {
        return (decided.special || decided.widest) == (seen.special || seen.widest);
      }
      return numeric_as_text(decided) == numeric_as_text(seen) &&
             (numeric_as_text(seen) || decided.scale == seen.scale);
    case ValueKind::kDuration:
    case ValueKind::kIntervalStruct:
      return (decided.calendar || decided.widest) == (seen.calendar || seen.widest);
    case ValueKind::kList:
      return (decided.irregular || decided.widest) == (seen.irregular || seen.widest) &&
             list_dimensions(decided) == list_dimensions(seen);
    default:  // dates and times
      return (decided.special || decided.widest) == (seen.special || seen.widest);
  }
}

bool builtin_type(uint32_t type_oid, int32_t modifier, PgType& type) {
  type = PgType{};
  type.oid = type.wire_oid = type_oid;
  type.modifier = modifier;
  if (builtin_scalar(type_oid)) return true;
  for (const auto& array : kArrayTypes) {
    if (array.array_oid == type_oid) {
      PgType element;
      builtin_type(array.element_oid, modifier, element);
      type.kind = PgType::Kind::kArray;
      type.children.push_back(std::move(element));
      return true;
    }
  }
  return false;
}

ColumnPlan plan_column(const PgType& type, std::span<const ValueShape> shapes) {
  Planner planner(shapes);
  ColumnPlan plan;
  bool text_elements = false;
  auto value = type.kind == PgType::Kind::kArray ? planner.top_array(type, text_elements)
                                                 : planner.build(type);
  plan.shapes = static_cast<size_t>(planner.parts());
  plan.note = planner.notes();
  if (!value) {
    plan.type = leaf(ValueKind::kText, arrow::utf8());
    plan.select = Select::kText;
  } else {
    plan.type = std::move(*value);
    if (text_elements) plan.select = Select::kTextElements;
  }
  return plan;
}

JsonKind json_kind(uint32_t type_oid) {
  switch (type_oid) {
    case oid::kInt2:
    case oid::kInt4:
    case oid::kInt8:
      return JsonKind::kInteger;
    case oid::kFloat4:
    case oid::kFloat8:
      return JsonKind::kFloat;
    case oid::kBool:
      return JsonKind::kBoolean;
    default:
      return JsonKind::kText;  // numeric too: JSON numbers would lose its digits
  }
}

int16_t read_int16(const char* data) {
  uint16_t value;
  std::memcpy(&value, data, sizeof value);
  return static_cast<int16_t>(be16toh(value));
}

int32_t read_int32(const char* data) {
  uint32_t value;
  std::memcpy(&value, data, sizeof value);
  return static_cast<int32_t>(be32toh(value));
}

int64_t read_int64(const char* data) {
  uint64_t value;
  std::memcpy(&value, data, sizeof value);
  return static_cast<int64_t>(be64toh(value));
}

namespace {

// numeric's binary form: ndigits, weight, sign, dscale (int16 each), then ndigits base-10000
// digits; the first digit is worth 10000^weight.
constexpr uint16_t kPositive = 0x0000, kNegative = 0x4000, kNaN = 0xC000, kInfinity = 0xD000,
                   kNegativeInfinity = 0xF000;

// A binary numeric checked, its digits read where they are.
struct BinaryNumeric {
  int ndigits = 0;
  int weight = 0;
  uint16_t sign = kPositive;
  int dscale = 0;
  const char* digits = nullptr;
  bool finite() const { return sign == kPositive || sign == kNegative; }
  int digit(int index) const {
    return index >= 0 && index < ndigits ? read_int16(digits + 2 * index) : 0;
  }
};

Result<BinaryNumeric> parse_numeric(std::string_view value) {
  if (value.size() < 8) return make_error(ErrorCode::kInternal, "numeric value is too short");
  BinaryNumeric numeric;
  numeric.ndigits = read_int16(value.data());
  numeric.digits = value.data() + 8;
  numeric.weight = read_int16(value.data() + 2);
  numeric.sign = static_cast<uint16_t>(read_int16(value.data() + 4));
  numeric.dscale = read_int16(value.data() + 6);
  if (numeric.ndigits < 0 || value.size() != 8 + 2 * static_cast<size_t>(numeric.ndigits)) {
    return make_error(ErrorCode::kInternal, "numeric value has a bad length");
  }
  if (!numeric.finite() && numeric.sign != kNaN && numeric.sign != kInfinity &&
      numeric.sign != kNegativeInfinity) {
    return make_error(ErrorCode::kInternal, "numeric value has an unknown sign");
  }
  if (numeric.dscale < 0) return make_error(ErrorCode::kInternal, "numeric value has a bad scale");
  for (int digit_idx = 0; digit_idx < numeric.ndigits; ++digit_idx) {
    if (const int digit = numeric.digit(digit_idx); digit < 0 || digit > 9999) {
      return make_error(ErrorCode::kInternal, "numeric value has a bad digit");
    }
  }
  return numeric;
}

int decimal_width(int digit) {
  return digit >= 1000 ? 4 : digit >= 100 ? 3 : digit >= 10 ? 2 : 1;
}

}  // namespace

Result<NumericDigits> numeric_digits(std::string_view value) {
  ASSIGN_OR_RETURN(auto numeric, parse_numeric(value));
  NumericDigits digits;
  digits.finite = numeric.finite();
  if (!digits.finite) return digits;
  int first = 0, last = numeric.ndigits - 1;
  while (first <= last && numeric.digit(first) == 0)
    ++first;
  while (last >= first && numeric.digit(last) == 0)
    --last;
  if (first > last) return digits;  // zero
  // Group i is worth 10000^(weight - i).
  if (const int power = numeric.weight - first; power >= 0) {
    digits.integer_digits = 4 * power + decimal_width(numeric.digit(first));
  }
  if (const int power = numeric.weight - last; power < 0) {
    int trailing_zeros = 0;
    for (int digit = numeric.digit(last); digit % 10 == 0; digit /= 10)
      ++trailing_zeros;
    digits.scale = -4 * power - trailing_zeros;
  }
  return digits;
}

Result<__int128> numeric_to_unscaled(std::string_view value, int precision, int scale) {
  ASSIGN_OR_RETURN(auto numeric, parse_numeric(value));
  if (numeric.sign == kNaN) {
    return make_error(ErrorCode::kInvalidArgument, "has NaN, which a Parquet decimal cannot hold");
  }
  if (!numeric.finite()) {
    return make_error(ErrorCode::kInvalidArgument,
                      "has an infinite value, which a Parquet decimal cannot hold");
  }
  static constexpr auto kPowers = [] {
    std::array<__int128, 39> powers{};
    powers[0] = 1;
    for (size_t i = 1; i < powers.size(); ++i)
      powers[i] = powers[i - 1] * 10;
    return powers;
  }();
  const auto too_large = [&] {
    return make_error(ErrorCode::kInvalidArgument,
                      "has a value with more than {} digits before the decimal point, more than "
                      "decimal({}, {}) holds",
                      precision - scale, precision, scale);
  };
  __int128 unscaled = 0;
  int round_digit = 0;  // the first digit below the scale
  for (int digit_idx = 0; digit_idx < numeric.ndigits; ++digit_idx) {
    const int digit = numeric.digit(digit_idx);
    if (digit == 0) continue;
    // The power of ten of this digit group's last decimal digit in the unscaled integer.
    const int exponent = 4 * (numeric.weight - digit_idx) + scale;
    if (exponent >= 0) {
      if (exponent + decimal_width(digit) > precision) return too_large();
      unscaled += digit * kPowers[static_cast<size_t>(exponent)];
    } else if (exponent > -4) {
      unscaled += digit / static_cast<int>(kPowers[static_cast<size_t>(-exponent)]);
      round_digit = digit / static_cast<int>(kPowers[static_cast<size_t>(-exponent - 1)]) % 10;
    } else if (exponent == -4) {
      round_digit = digit / 1000;
    }
  }
  if (round_digit >= 5) ++unscaled;
  if (unscaled >= kPowers[static_cast<size_t>(precision)]) return too_large();
  return numeric.sign == kNegative ? -unscaled : unscaled;
}

Result<std::string> numeric_to_text(std::string_view value) {
  ASSIGN_OR_RETURN(auto numeric, parse_numeric(value));
  if (numeric.sign == kNaN) return std::string("NaN");
  if (numeric.sign == kInfinity) return std::string("Infinity");
  if (numeric.sign == kNegativeInfinity) return std::string("-Infinity");
  // As PostgreSQL's numeric_out: the groups down to 10000^0, the first without its leading
  // zeros, then dscale digits after the point.
  std::string text = numeric.sign == kNegative ? "-" : "";
  if (numeric.weight < 0) {
    text += '0';
  } else {
    text += std::to_string(numeric.digit(0));
    for (int index = 1; index <= numeric.weight; ++index)
      text += fmt::format("{:04}", numeric.digit(index));
  }
  if (numeric.dscale > 0) {
    text += '.';
    std::string fraction;
    for (int index = numeric.weight + 1; static_cast<int>(fraction.size()) < numeric.dscale;
         ++index) {
      fraction += fmt::format("{:04}", numeric.digit(index));
    }
    text += fraction.substr(0, static_cast<size_t>(numeric.dscale));
  }
  return text;
}

Result<Interval> read_interval(std::string_view value) {
  if (value.size() != 16) {
    return make_error(ErrorCode::kInternal, "an interval value is {} bytes where 16 were expected",
                      value.size());
  }
  return Interval{read_int64(value.data()), read_int32(value.data() + 8),
                  read_int32(value.data() + 12)};
}

bool interval_micros(const Interval& interval, int64_t& micros) {
  constexpr int64_t kDayMicros = int64_t{86400} * 1000000;
  int64_t days = 0;
  return interval.months == 0 &&
         !__builtin_mul_overflow(int64_t{interval.days}, kDayMicros, &days) &&
         !__builtin_add_overflow(days, interval.microseconds, &micros);
}

std::string uuid_to_string(std::string_view value) {
  constexpr char kHex[] = "0123456789abcdef";
  std::string text;
  text.reserve(36);
  for (size_t byte_idx = 0; byte_idx < value.size(); ++byte_idx) {
    if (byte_idx == 4 || byte_idx == 6 || byte_idx == 8 || byte_idx == 10) text += '-';
    const auto byte = static_cast<unsigned char>(value[byte_idx]);
    text += kHex[byte >> 4];
    text += kHex[byte & 15];
  }
  return text;
}

Result<int32_t> date_to_unix_days(int32_t pg_days) {
  if (pg_days == std::numeric_limits<int32_t>::max() ||
      pg_days == std::numeric_limits<int32_t>::min()) {
    return make_error(ErrorCode::kInvalidArgument,
                      "has the date 'infinity', which Parquet cannot hold; filter it out or "
                      "replace it in SQL");
  }
  // PostgreSQL's dates end in 5874897 AD, well within int32 from 1970; a corrupt value need not.
  int32_t days = 0;
  if (__builtin_add_overflow(pg_days, kEpochDays, &days)) {
    return make_error(ErrorCode::kInternal, "has a date beyond PostgreSQL's ({} days after 2000)",
                      pg_days);
  }
  return days;
}

Result<int64_t> timestamp_to_unix_micros(int64_t pg_micros) {
  if (pg_micros == std::numeric_limits<int64_t>::max() ||
      pg_micros == std::numeric_limits<int64_t>::min()) {
    return make_error(ErrorCode::kInvalidArgument,
                      "has the timestamp 'infinity', which Parquet cannot hold; filter it out or "
                      "replace it in SQL");
  }
  // PostgreSQL's timestamps end in 294276 AD, which counted from 1970 instead of 2000 is past
  // int64's end: the last 30 years of its range do not fit Arrow's timestamp[us].
  int64_t micros = 0;
  if (__builtin_add_overflow(pg_micros, kEpochMicros, &micros)) {
    return make_error(ErrorCode::kInvalidArgument,
                      "has a timestamp after the year 294247, which Parquet cannot hold; filter "
                      "it out or replace it in SQL");
  }
  return micros;
}

Result<int64_t> time_of_day_micros(int64_t pg_micros) {
  constexpr int64_t kDayMicros = int64_t{86400} * 1000000;
  if (pg_micros == kDayMicros) {
    return make_error(ErrorCode::kInvalidArgument,
                      "has the time 24:00:00, which Parquet's time of day cannot hold (it ends "
                      "at 23:59:59.999999); replace it in SQL or cast the column to text");
  }
  if (pg_micros < 0 || pg_micros > kDayMicros) {
    return make_error(ErrorCode::kInternal, "has a time of {} microseconds, outside of a day",
                      pg_micros);
  }
  return pg_micros;
}

}  // namespace quarry::data

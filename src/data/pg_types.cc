#include "data/pg_types.h"

#include <arrow/type.h>
#include <endian.h>

#include <cstring>
#include <limits>

namespace quarry::data {
namespace {

// PostgreSQL's epoch is 2000-01-01; Arrow's is 1970-01-01.
constexpr int32_t kEpochDays = 10957;
constexpr int64_t kEpochMicros = int64_t{kEpochDays} * 86400 * 1000000;

constexpr int kMaxDecimalPrecision = 38;
constexpr int kUnconstrainedPrecision = 38;
constexpr int kUnconstrainedScale = 9;

struct ArrayType {
  uint32_t array_oid;
  uint32_t element_oid;
};
// The array types of the scalar types above (pg_type.typarray).
constexpr ArrayType kArrayTypes[] = {
    {1000, oid::kBool},      {1001, oid::kBytea},       {1002, oid::kChar},    {1003, oid::kName},
    {1016, oid::kInt8},      {1005, oid::kInt2},        {1007, oid::kInt4},    {1009, oid::kText},
    {199, oid::kJson},       {143, oid::kXml},          {1021, oid::kFloat4},  {1022, oid::kFloat8},
    {1014, oid::kBpchar},    {1015, oid::kVarchar},     {1182, oid::kDate},    {1183, oid::kTime},
    {1115, oid::kTimestamp}, {1185, oid::kTimestampTz}, {1231, oid::kNumeric}, {2951, oid::kUuid},
    {3807, oid::kJsonb},
};

struct Scalar {
  ValueKind kind;
  std::shared_ptr<arrow::DataType> type;
};

Result<Scalar> scalar_type(const ColumnDescription& column, uint32_t type_oid, int& precision,
                           int& scale) {
  switch (type_oid) {
    case oid::kBool:
      return Scalar{ValueKind::kBool, arrow::boolean()};
    case oid::kInt2:
      return Scalar{ValueKind::kInt16, arrow::int16()};
    case oid::kInt4:
      return Scalar{ValueKind::kInt32, arrow::int32()};
    case oid::kInt8:
      return Scalar{ValueKind::kInt64, arrow::int64()};
    case oid::kFloat4:
      return Scalar{ValueKind::kFloat32, arrow::float32()};
    case oid::kFloat8:
      return Scalar{ValueKind::kFloat64, arrow::float64()};
    case oid::kText:
    case oid::kVarchar:
    case oid::kBpchar:
    case oid::kName:
    case oid::kChar:
    case oid::kJson:
    case oid::kXml:
      return Scalar{ValueKind::kText, arrow::utf8()};
    case oid::kJsonb:
      return Scalar{ValueKind::kJsonb, arrow::utf8()};
    case oid::kUuid:
      return Scalar{ValueKind::kUuid, arrow::utf8()};
    case oid::kBytea:
      return Scalar{ValueKind::kBytea, arrow::binary()};
    case oid::kDate:
      return Scalar{ValueKind::kDate, arrow::date32()};
    case oid::kTime:
      return Scalar{ValueKind::kTime, arrow::time64(arrow::TimeUnit::MICRO)};
    case oid::kTimestamp:
      return Scalar{ValueKind::kTimestamp, arrow::timestamp(arrow::TimeUnit::MICRO)};
    case oid::kTimestampTz:
      return Scalar{ValueKind::kTimestampTz, arrow::timestamp(arrow::TimeUnit::MICRO, "UTC")};
    case oid::kNumeric: {
      if (column.type_modifier < 4) {
        precision = kUnconstrainedPrecision;
        scale = kUnconstrainedScale;
      } else {
        const int32_t modifier = column.type_modifier - 4;
        precision = (modifier >> 16) & 0xffff;
        // The scale is an 11-bit signed number since PostgreSQL 15.
        scale = ((modifier & 0x7ff) ^ 1024) - 1024;
        // PostgreSQL makes numeric(1) to numeric(1000); Arrow aborts the process on a decimal
        // of no digits, so a server sending one must not get that far.
        if (precision < 1) {
          return make_error(ErrorCode::kInternal,
                            "column '{}' has the type modifier {}, which no numeric has",
                            column.name, column.type_modifier);
        }
        if (precision > kMaxDecimalPrecision) {
          return make_error(ErrorCode::kInvalidArgument,
                            "column '{}' is {}, more digits than Parquet's decimals hold here "
                            "(38); cast it in SQL, e.g. {}::numeric(38, {}) or ::float8",
                            column.name, column.sql_type, column.name, std::min(scale, 38));
        }
        if (scale < 0 || scale > precision) {
          return make_error(ErrorCode::kInvalidArgument,
                            "column '{}' is {}, whose scale Parquet cannot store; cast it in "
                            "SQL, e.g. {}::numeric(38, 0)",
                            column.name, column.sql_type, column.name);
        }
      }
      return Scalar{ValueKind::kNumeric, arrow::decimal128(precision, scale)};
    }
    default:
      return make_error(ErrorCode::kInvalidArgument,
                        "column '{}' has type {}, which export_query cannot store in Parquet; "
                        "cast it in SQL to a type it can (e.g. {}::text)",
                        column.name, column.sql_type, column.name);
  }
}

}  // namespace

Result<ColumnType> map_column(const ColumnDescription& column) {
  ColumnType type;
  type.element_oid = column.type_oid;
  for (const auto& array : kArrayTypes) {
    if (array.array_oid == column.type_oid) {
      type.is_array = true;
      type.element_oid = array.element_oid;
    }
  }
  ASSIGN_OR_RETURN(auto scalar, scalar_type(column, type.element_oid, type.precision, type.scale));
  type.kind = scalar.kind;
  type.arrow_type = type.is_array ? arrow::list(scalar.type) : scalar.type;
  return type;
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

Result<__int128> numeric_to_unscaled(std::string_view value, int precision, int scale) {
  // numeric's binary form: ndigits, weight, sign, dscale (int16 each), then ndigits base-10000
  // digits; the first digit is worth 10000^weight.
  constexpr uint16_t kPositive = 0x0000, kNegative = 0x4000, kNaN = 0xC000;
  if (value.size() < 8) return make_error(ErrorCode::kInternal, "numeric value is too short");
  const int ndigits = read_int16(value.data());
  const int weight = read_int16(value.data() + 2);
  const auto sign = static_cast<uint16_t>(read_int16(value.data() + 4));
  if (ndigits < 0 || value.size() != 8 + 2 * static_cast<size_t>(ndigits)) {
    return make_error(ErrorCode::kInternal, "numeric value has a bad length");
  }
  if (sign == kNaN) {
    return make_error(ErrorCode::kInvalidArgument, "has NaN, which a Parquet decimal cannot hold");
  }
  if (sign != kPositive && sign != kNegative) {
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
  for (int digit_idx = 0; digit_idx < ndigits; ++digit_idx) {
    const int digit = read_int16(value.data() + 8 + 2 * digit_idx);
    if (digit < 0 || digit > 9999) {
      return make_error(ErrorCode::kInternal, "numeric value has a bad digit");
    }
    if (digit == 0) continue;
    // The power of ten of this digit group's last decimal digit in the unscaled integer.
    const int exponent = 4 * (weight - digit_idx) + scale;
    if (exponent >= 0) {
      const int width = digit >= 1000 ? 4 : digit >= 100 ? 3 : digit >= 10 ? 2 : 1;
      if (exponent + width > precision) return too_large();
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
  return sign == kNegative ? -unscaled : unscaled;
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

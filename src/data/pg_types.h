// PostgreSQL types, as export_query stores them in Parquet: which OIDs map to which Arrow
// type, and how their binary (COPY ... FORMAT binary) values decode.
//
//   smallint, integer, bigint     int16, int32, int64
//   real, double precision        float32, float64
//   numeric(p, s)                 decimal128(p, s); p above 38 is refused (cast it)
//   numeric (no precision)        decimal128(38, 9): rounded to 9 decimals as a cast to
//                                 numeric(38, 9) would; larger values, NaN, infinity refused
//   boolean                       bool
//   text, varchar, char(n), name  string (char(n) keeps its padding, as PostgreSQL prints it)
//   json, jsonb, xml              string (the document's text)
//   uuid                          string, 36 characters lowercase (Polars reads it as str)
//   bytea                         binary
//   date                          date32
//   timestamp                     timestamp[us]
//   timestamptz                   timestamp[us, UTC]
//   time                          time64[us]
//   one-dimensional arrays of any of these   list<item>
// Anything else is refused with the column's name and a hint to cast it in SQL.
#pragma once

#include <arrow/type_fwd.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "common/error.h"
#include "data/statement.h"

namespace quarry::data {

namespace oid {
inline constexpr uint32_t kBool = 16, kBytea = 17, kChar = 18, kName = 19, kInt8 = 20, kInt2 = 21,
                          kInt4 = 23, kText = 25, kJson = 114, kXml = 142, kFloat4 = 700,
                          kFloat8 = 701, kBpchar = 1042, kVarchar = 1043, kDate = 1082,
                          kTime = 1083, kTimestamp = 1114, kTimestampTz = 1184, kNumeric = 1700,
                          kUuid = 2950, kJsonb = 3802;
}  // namespace oid

// How one value is decoded and appended.
enum class ValueKind {
  kBool,
  kInt16,
  kInt32,
  kInt64,
  kFloat32,
  kFloat64,
  kNumeric,
  kText,   // text, varchar, bpchar, name, "char", json, xml: the bytes are UTF-8 text
  kJsonb,  // a version byte, then text
  kUuid,
  kBytea,
  kDate,
  kTime,
  kTimestamp,
  kTimestampTz,
};

struct ColumnType {
  ValueKind kind = ValueKind::kText;
  bool is_array = false;
  uint32_t element_oid = 0;  // the OID of the values (of the elements, for an array)
  int precision = 0;         // numeric only
  int scale = 0;
  std::shared_ptr<arrow::DataType> arrow_type;
};

// The Arrow type for a column, or an error naming the column and saying what to do.
Result<ColumnType> map_column(const ColumnDescription& column);

// How query_database puts a text value into JSON.
enum class JsonKind { kInteger, kFloat, kBoolean, kText };
JsonKind json_kind(uint32_t type_oid);

// Decoders of single binary values (big-endian, as PostgreSQL sends them).
int16_t read_int16(const char* data);
int32_t read_int32(const char* data);
int64_t read_int64(const char* data);

// A binary numeric as the unscaled integer of decimal128(precision, scale): 12.345 with scale 2
// is 1235 (half away from zero, as PostgreSQL rounds). Errors name no column: the caller adds
// it.
Result<__int128> numeric_to_unscaled(std::string_view value, int precision, int scale);

// The 36-character text form of a 16-byte uuid.
std::string uuid_to_string(std::string_view value);

// Days from 1970-01-01 and microseconds from 1970-01-01T00:00 for PostgreSQL's date and
// timestamp values (which count from 2000-01-01). ±infinity are errors.
Result<int32_t> date_to_unix_days(int32_t pg_days);
Result<int64_t> timestamp_to_unix_micros(int64_t pg_micros);

// Microseconds since midnight of a time value, checked to lie within the day (PostgreSQL's
// 24:00:00 does not fit Arrow's and Parquet's time of day).
Result<int64_t> time_of_day_micros(int64_t pg_micros);

}  // namespace quarry::data

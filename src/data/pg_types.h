// PostgreSQL types, as export_query stores them in Parquet: which type becomes which Arrow
// type, and how their binary (COPY ... FORMAT binary) values decode. Every type is exported;
// nothing is rounded.
//
//   smallint, integer, bigint     int16, int32, int64
//   real, double precision        float32, float64
//   numeric(p, s), p <= 38        decimal128(p, s); PostgreSQL's text form when a value is NaN
//   numeric (no precision, or     decimal128(38, s) with the scale its values need; PostgreSQL's
//     one past 38 digits)           text form where no decimal128 holds them (NaN, infinity,
//                                   more than 38 digits)
//   boolean                       bool
//   text, varchar, char(n), name  string (char(n) keeps its padding, as PostgreSQL prints it)
//   "char"                        string: its byte, or \ooo past ASCII (as PostgreSQL prints it)
//   json, jsonb, xml              string (the document's text)
//   uuid                          string, 36 characters lowercase (Polars reads it as str)
//   bytea                         binary
//   date                          date32
//   timestamp                     timestamp[us]
//   timestamptz                   timestamp[us, UTC]
//   time                          time64[us]
//     (with 'infinity', 24:00:00    PostgreSQL's text form)
//     or past Arrow's range)
//   interval                      duration[us] (days as 24 hours) while no value has months;
//                                 else struct<months: int32, days: int32, microseconds: int64>
//   an enum                       dictionary<int32, string> of its labels in the enum's order
//   a composite type              struct of its fields
//   a domain                      its base type
//   arrays                        lists, one level per dimension; PostgreSQL's text form when
//                                 the arrays of a column differ in dimensions or start at
//                                 another index than 1
//   anything else                 string: PostgreSQL's text form (inet, cidr, macaddr, money,
//     (inet, money, ranges, ...)    bit strings, oid and reg*, ranges, tsvector, geometric types,
//                                   time with time zone, and any type of an extension)
//
// Parts whose form depends on the values (a numeric, a date or time, an interval, an array's
// dimensions) are decided from the values seen (ValueShape): export_query looks at the first row
// group before it writes, and runs the query again in the rare case a later value needs a wider
// form.
#pragma once

#include <arrow/type_fwd.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.h"
#include "data/pg_catalog.h"

namespace quarry::data {

namespace oid {
inline constexpr uint32_t kBool = 16, kBytea = 17, kChar = 18, kName = 19, kInt8 = 20, kInt2 = 21,
                          kInt4 = 23, kText = 25, kJson = 114, kXml = 142, kFloat4 = 700,
                          kFloat8 = 701, kBpchar = 1042, kVarchar = 1043, kDate = 1082,
                          kTime = 1083, kTimestamp = 1114, kTimestampTz = 1184, kInterval = 1186,
                          kNumeric = 1700, kUuid = 2950, kJsonb = 3802;
}  // namespace oid

// How one value is decoded and appended.
enum class ValueKind {
  kBool,
  kInt16,
  kInt32,
  kInt64,
  kFloat32,
  kFloat64,
  kNumeric,      // decimal128(precision, scale)
  kNumericText,  // a numeric no decimal128 holds, as PostgreSQL prints it
  kText,         // text, varchar, bpchar, name, json, xml, and text forms: UTF-8 text
  kChar,         // "char": one byte, as PostgreSQL prints it (\ooo past ASCII)
  kJsonb,        // a version byte, then text
  kUuid,
  kBytea,
  kDate,
  kTime,
  kTimestamp,
  kTimestampTz,
  kDuration,        // an interval without months
  kIntervalStruct,  // an interval with months
  kEnum,
  kList,
  kStruct,
};

// What the values of one value-dependent part of a column showed. The parts are numbered in
// the order of the type's parts (the column first, then its elements or fields, depth first).
struct ValueShape {
  int integer_digits = 0;  // numeric: the most digits before the point
  int scale = 0;           // numeric: the most digits after it (trailing zeros not counted)
  bool special = false;    // a value the Arrow type cannot hold: a numeric NaN or infinity,
                           // a date or timestamp 'infinity' or past Arrow's range, 24:00:00
  bool calendar = false;   // interval: a value with months, or beyond a duration's range
  int dimensions = 0;      // array: the dimensions of the non-empty arrays (0: none yet)
  bool irregular = false;  // array: different dimensions, or an index not starting at 1
  bool widest = false;     // take the form that holds any value
  void merge(const ValueShape& other);
};

struct ValueType {
  ValueKind kind = ValueKind::kText;
  uint32_t wire_oid = 0;            // the OID binary array and record values name these by
  int precision = 0;                // kNumeric
  int scale = 0;                    // kNumeric
  bool fixed_scale = false;         // kNumeric, kNumericText: numeric(p, s), its scale the type's
  int dimensions = 0;               // kList: one level of list per array dimension
  int shape = -1;                   // the ValueShape of a value-dependent part, else -1
  std::vector<ValueType> children;  // kList: the element; kStruct: the fields
  std::vector<std::string> names;   // kStruct: the field names; kEnum: the labels
  std::shared_ptr<arrow::DataType> arrow_type;
};

// How the COPY selects a column: as it is, or as PostgreSQL prints it (its type's output
// function, so every value reads as query_database shows it), whole or element by element.
enum class Select { kValue, kText, kTextElements };

// How export_query exports one column.
struct ColumnPlan {
  ValueType type;
  Select select = Select::kValue;
  size_t shapes = 0;  // the number of value-dependent parts
  std::string note;   // what a reader of the file should know about the mapping, if anything
};

// The plan for a column of `type`, given what its values showed (one ValueShape per
// value-dependent part; fewer, or none, before any values were seen).
ColumnPlan plan_column(const PgType& type, std::span<const ValueShape> shapes);

// Two shapes give the same form of the part `type` (with type.shape >= 0): a value measured
// into `seen` fits a column planned from `decided`.
bool same_form(const ValueType& type, const ValueShape& decided, const ValueShape& seen);

// How query_database puts a text value into JSON.
enum class JsonKind { kInteger, kFloat, kBoolean, kText };
JsonKind json_kind(uint32_t type_oid);

// Decoders of single binary values (big-endian, as PostgreSQL sends them).
int16_t read_int16(const char* data);
int32_t read_int32(const char* data);
int64_t read_int64(const char* data);

// What a binary numeric needs of a decimal: its digits before and after the point (trailing
// zeros not counted), and whether it is a number at all (not NaN or an infinity).
struct NumericDigits {
  int integer_digits = 0;
  int scale = 0;
  bool finite = true;
};
Result<NumericDigits> numeric_digits(std::string_view value);

// A binary numeric as the unscaled integer of decimal128(precision, scale): 12.345 with scale 2
// is 1235 (half away from zero, as PostgreSQL rounds). Errors name no column: the caller adds
// it.
Result<__int128> numeric_to_unscaled(std::string_view value, int precision, int scale);

// A binary numeric as PostgreSQL prints it: "-12.50" (its display scale), "NaN", "Infinity".
Result<std::string> numeric_to_text(std::string_view value);

// A binary interval: PostgreSQL keeps months, days and microseconds apart.
struct Interval {
  int64_t microseconds = 0;
  int32_t days = 0;
  int32_t months = 0;
};
Result<Interval> read_interval(std::string_view value);
// The interval as microseconds, a day counted as 24 hours; false if it has months or the sum
// does not fit.
bool interval_micros(const Interval& interval, int64_t& micros);

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

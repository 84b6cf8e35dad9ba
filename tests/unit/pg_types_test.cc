#include "data/pg_types.h"

#include <arrow/type.h>
#include <endian.h>
#include <gtest/gtest.h>

namespace quarry::data {
namespace {

ColumnDescription column(uint32_t type_oid, int32_t modifier = -1, std::string sql_type = "t") {
  return ColumnDescription{"c", type_oid, modifier, std::move(sql_type)};
}

// numeric(p, s) as PostgreSQL packs it into the type modifier.
int32_t numeric_modifier(int precision, int scale) {
  return ((precision << 16) | (scale & 0x7ff)) + 4;
}

TEST(PgTypes, MapsEveryListedType) {
  struct Case {
    uint32_t type_oid;
    int32_t modifier;
    const char* arrow_type;
  } cases[] = {
      {oid::kInt2, -1, "int16"},
      {oid::kInt4, -1, "int32"},
      {oid::kInt8, -1, "int64"},
      {oid::kFloat4, -1, "float"},
      {oid::kFloat8, -1, "double"},
      {oid::kNumeric, numeric_modifier(12, 3), "decimal128(12, 3)"},
      {oid::kNumeric, -1, "decimal128(38, 9)"},
      {oid::kBool, -1, "bool"},
      {oid::kText, -1, "string"},
      {oid::kVarchar, 24, "string"},
      {oid::kBpchar, 9, "string"},
      {oid::kDate, -1, "date32[day]"},
      {oid::kTimestamp, -1, "timestamp[us]"},
      {oid::kTimestampTz, -1, "timestamp[us, tz=UTC]"},
      {oid::kTime, -1, "time64[us]"},
      {oid::kUuid, -1, "string"},
      {oid::kJson, -1, "string"},
      {oid::kJsonb, -1, "string"},
      {oid::kBytea, -1, "binary"},
      {1007, -1, "list<item: int32>"},                                 // integer[]
      {1009, -1, "list<item: string>"},                                // text[]
      {1231, numeric_modifier(6, 2), "list<item: decimal128(6, 2)>"},  // numeric(6,2)[]
      {1185, -1, "list<item: timestamp[us, tz=UTC]>"},                 // timestamptz[]
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.arrow_type);
    auto type = map_column(column(c.type_oid, c.modifier));
    ASSERT_TRUE(type) << type.error().message;
    EXPECT_EQ(type->arrow_type->ToString(), c.arrow_type);
  }
}

TEST(PgTypes, RefusesWhatParquetCannotHoldNamingTheColumn) {
  auto interval = map_column({"gap", 1186, -1, "interval"});
  ASSERT_FALSE(interval);
  EXPECT_NE(interval.error().message.find("column 'gap' has type interval"), std::string::npos);
  EXPECT_NE(interval.error().message.find("gap::text"), std::string::npos);
  auto wide = map_column({"big", oid::kNumeric, numeric_modifier(50, 2), "numeric(50,2)"});
  ASSERT_FALSE(wide);
  EXPECT_NE(wide.error().message.find("column 'big' is numeric(50,2)"), std::string::npos);
  auto negative_scale = map_column({"n", oid::kNumeric, numeric_modifier(5, -2), "numeric(5,-2)"});
  ASSERT_FALSE(negative_scale);
}

// A binary numeric: sign, display scale and base-10000 digits with the weight of the first.
std::string numeric(int16_t weight, uint16_t sign, int16_t dscale, std::vector<int16_t> digits) {
  std::string value;
  auto put = [&](uint16_t part) {
    uint16_t big = htobe16(part);
    value.append(reinterpret_cast<const char*>(&big), 2);
  };
  put(static_cast<uint16_t>(digits.size()));
  put(static_cast<uint16_t>(weight));
  put(sign);
  put(static_cast<uint16_t>(dscale));
  for (auto digit : digits)
    put(static_cast<uint16_t>(digit));
  return value;
}

std::string text_of(__int128 value) {
  if (value == 0) return "0";
  std::string text;
  const bool negative = value < 0;
  if (negative) value = -value;
  while (value > 0) {
    text.insert(text.begin(), static_cast<char>('0' + static_cast<int>(value % 10)));
    value /= 10;
  }
  return negative ? "-" + text : text;
}

// Found by fuzz/pg_types_fuzzer: a numeric type modifier of precision 0 reached
// arrow::decimal128(0, 0), which aborts the process ("Check failed: ...
// ValidateDecimalPrecision"). PostgreSQL makes no such type, but the modifier is the server's
// word.
TEST(PgTypes, RefusesANumericOfNoDigits) {
  for (int32_t modifier : {4, 0xd004, numeric_modifier(0, 0)}) {
    SCOPED_TRACE(modifier);
    auto type = map_column(column(oid::kNumeric, modifier));
    ASSERT_FALSE(type);
    EXPECT_EQ(type.error().code, ErrorCode::kInternal);
    EXPECT_NE(type.error().message.find("which no numeric has"), std::string::npos);
  }
  EXPECT_TRUE(map_column(column(oid::kNumeric, numeric_modifier(1, 0))));
}

TEST(PgTypes, DecodesNumericIntoUnscaledDecimals) {
  struct Case {
    const char* name;
    std::string value;
    int precision, scale;
    const char* unscaled;
  } cases[] = {
      {"12.34 at scale 3", numeric(0, 0, 2, {12, 3400}), 12, 3, "12340"},
      {"-12.34", numeric(0, 0x4000, 2, {12, 3400}), 12, 2, "-1234"},
      {"zero", numeric(0, 0, 0, {}), 10, 2, "0"},
      {"123456789.123456789", numeric(2, 0, 9, {1, 2345, 6789, 1234, 5678, 9000}), 38, 9,
       "123456789123456789"},
      {"0.0001", numeric(-1, 0, 4, {1}), 10, 4, "1"},
      {"rounds half away from zero", numeric(0, 0, 3, {1, 2350}), 10, 2, "124"},
      {"rounds down below half", numeric(0, 0, 3, {1, 2340}), 10, 2, "123"},
      {"negative rounds away", numeric(0, 0x4000, 3, {1, 2350}), 10, 2, "-124"},
      {"rounding at a group edge", numeric(0, 0, 5, {0, 9999, 5000}), 10, 4, "10000"},
      {"tiny value rounds to zero", numeric(-3, 0, 12, {1}), 38, 9, "0"},
      {"10^20", numeric(5, 0, 0, {1}), 38, 9, "100000000000000000000000000000"},
      {"largest of numeric(38, 0)",
       numeric(9, 0, 0, {99, 9999, 9999, 9999, 9999, 9999, 9999, 9999, 9999, 9999}), 38, 0,
       "99999999999999999999999999999999999999"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    auto unscaled = numeric_to_unscaled(c.value, c.precision, c.scale);
    ASSERT_TRUE(unscaled) << unscaled.error().message;
    EXPECT_EQ(text_of(*unscaled), c.unscaled);
  }
}

TEST(PgTypes, RefusesNumericsADecimalCannotHold) {
  auto too_large = numeric_to_unscaled(numeric(8, 0, 0, {1}), 38, 9);  // 10^32
  ASSERT_FALSE(too_large);
  EXPECT_NE(too_large.error().message.find("more than 29 digits before the decimal point"),
            std::string::npos);
  EXPECT_FALSE(numeric_to_unscaled(numeric(0, 0, 2, {999, 9999}), 5, 2));  // rounds to 1000.00
  auto nan = numeric_to_unscaled(numeric(0, 0xC000, 0, {}), 10, 2);
  ASSERT_FALSE(nan);
  EXPECT_NE(nan.error().message.find("NaN"), std::string::npos);
  auto infinity = numeric_to_unscaled(numeric(0, 0xD000, 0, {}), 10, 2);
  ASSERT_FALSE(infinity);
  EXPECT_NE(infinity.error().message.find("infinite"), std::string::npos);
  EXPECT_FALSE(numeric_to_unscaled(std::string("\0\1", 2), 10, 2));
}

TEST(PgTypes, DecodesUuidDatesAndTimestamps) {
  const std::string uuid("\x12\x34\x56\x78\x9a\xbc\xde\xf0\x01\x23\x45\x67\x89\xab\xcd\xef", 16);
  EXPECT_EQ(uuid_to_string(uuid), "12345678-9abc-def0-0123-456789abcdef");
  EXPECT_EQ(*date_to_unix_days(0), 10957);  // 2000-01-01
  EXPECT_EQ(*date_to_unix_days(-10957), 0);
  EXPECT_EQ(*timestamp_to_unix_micros(0), 946684800000000);
  EXPECT_FALSE(date_to_unix_days(std::numeric_limits<int32_t>::max()));
  EXPECT_FALSE(timestamp_to_unix_micros(std::numeric_limits<int64_t>::min()));
  EXPECT_EQ(read_int32("\xff\xff\xff\xfe"), -2);
  EXPECT_EQ(read_int16("\x01\x02"), 0x0102);
  EXPECT_EQ(read_int64("\x00\x00\x00\x00\x00\x00\x01\x00"), 256);
}

// Found by fuzz/pg_types_fuzzer (UBSan: "signed integer overflow: 2147483392 + 10957"): moving
// the epoch from 2000 to 1970 overflowed for dates near int32's end, and for timestamps that
// PostgreSQL itself holds: '294276-12-31 23:59:59' is 9223371331199000000 us after 2000.
TEST(PgTypes, DatesAndTimestampsThatDoNotFitAfterTheEpochMoves) {
  EXPECT_FALSE(date_to_unix_days(2147483392));
  EXPECT_FALSE(date_to_unix_days(std::numeric_limits<int32_t>::max() - 10957 + 1));
  EXPECT_EQ(*date_to_unix_days(std::numeric_limits<int32_t>::max() - 10957),
            std::numeric_limits<int32_t>::max());
  auto late = timestamp_to_unix_micros(9223371331199000000);
  ASSERT_FALSE(late);
  EXPECT_EQ(late.error().code, ErrorCode::kInvalidArgument);
  EXPECT_NE(late.error().message.find("after the year 294247"), std::string::npos);
  const int64_t last = std::numeric_limits<int64_t>::max() - 946684800000000;
  EXPECT_EQ(*timestamp_to_unix_micros(last), std::numeric_limits<int64_t>::max());
  EXPECT_FALSE(timestamp_to_unix_micros(last + 1));
  EXPECT_EQ(*timestamp_to_unix_micros(std::numeric_limits<int64_t>::min() + 1),
            std::numeric_limits<int64_t>::min() + 1 + 946684800000000);
}

TEST(PgTypes, JsonKindsKeepNumericAsText) {
  EXPECT_EQ(json_kind(oid::kInt8), JsonKind::kInteger);
  EXPECT_EQ(json_kind(oid::kFloat8), JsonKind::kFloat);
  EXPECT_EQ(json_kind(oid::kBool), JsonKind::kBoolean);
  EXPECT_EQ(json_kind(oid::kNumeric), JsonKind::kText);
  EXPECT_EQ(json_kind(oid::kText), JsonKind::kText);
}

}  // namespace
}  // namespace quarry::data

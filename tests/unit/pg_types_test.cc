#include "data/pg_types.h"

#include <arrow/type.h>
#include <endian.h>
#include <gtest/gtest.h>

namespace quarry::data {
namespace {

PgType builtin(uint32_t type_oid, int32_t modifier = -1) {
  PgType type;
  EXPECT_TRUE(builtin_type(type_oid, modifier, type)) << type_oid;
  return type;
}

PgType base(uint32_t type_oid) {
  PgType type;
  type.oid = type.wire_oid = type_oid;
  return type;
}

PgType array_of(PgType element, uint32_t array_oid = 99999) {
  PgType type;
  type.kind = PgType::Kind::kArray;
  type.oid = type.wire_oid = array_oid;
  type.children.push_back(std::move(element));
  return type;
}

// numeric(p, s) as PostgreSQL packs it into the type modifier.
int32_t numeric_modifier(int precision, int scale) {
  return ((precision << 16) | (scale & 0x7ff)) + 4;
}

std::string arrow_type(const PgType& type, std::vector<ValueShape> shapes = {}) {
  return plan_column(type, shapes).type.arrow_type->ToString();
}

TEST(PgTypes, MapsEveryBuiltInType) {
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
      {oid::kNumeric, -1, "decimal128(38, 0)"},  // before any value is seen
      {oid::kBool, -1, "bool"},
      {oid::kText, -1, "string"},
      {oid::kVarchar, 24, "string"},
      {oid::kBpchar, 9, "string"},
      {oid::kDate, -1, "date32[day]"},
      {oid::kTimestamp, -1, "timestamp[us]"},
      {oid::kTimestampTz, -1, "timestamp[us, tz=UTC]"},
      {oid::kTime, -1, "time64[us]"},
      {oid::kInterval, -1, "duration[us]"},
      {oid::kUuid, -1, "string"},
      {oid::kJson, -1, "string"},
      {oid::kJsonb, -1, "string"},
      {oid::kBytea, -1, "binary"},
      {1007, -1, "list<element: int32>"},                                 // integer[]
      {1009, -1, "list<element: string>"},                                // text[]
      {1231, numeric_modifier(6, 2), "list<element: decimal128(6, 2)>"},  // numeric(6,2)[]
      {1185, -1, "list<element: timestamp[us, tz=UTC]>"},                 // timestamptz[]
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.arrow_type);
    const auto plan = plan_column(builtin(c.type_oid, c.modifier), {});
    EXPECT_EQ(plan.type.arrow_type->ToString(), c.arrow_type);
    EXPECT_EQ(plan.select, Select::kValue);
  }
  PgType unknown;
  EXPECT_FALSE(builtin_type(869, -1, unknown));  // inet: the catalog says what it is
}

TEST(PgTypes, TypesWithoutAParquetTypeGoAsTheirTextForm) {
  for (uint32_t type_oid : {869u /*inet*/, 790u /*money*/, 1560u /*bit*/, 3904u /*int4range*/,
                            1266u /*timetz*/, 2249u /*record*/, 600u /*point*/}) {
    SCOPED_TRACE(type_oid);
    const auto plan = plan_column(base(type_oid), {});
    EXPECT_EQ(plan.select, Select::kText);
    EXPECT_EQ(plan.type.arrow_type->ToString(), "string");
    EXPECT_EQ(plan.note, "no Parquet type: PostgreSQL's text form");
  }
  // An array of them keeps its list, of their text forms.
  const auto inets = plan_column(array_of(base(869)), {});
  EXPECT_EQ(inets.select, Select::kTextElements);
  EXPECT_EQ(inets.type.arrow_type->ToString(), "list<element: string>");
  EXPECT_EQ(inets.type.children[0].wire_oid, oid::kText);
}

TEST(PgTypes, UnconstrainedNumericTakesTheScaleItsValuesNeed) {
  const PgType numeric = builtin(oid::kNumeric);
  ValueShape shape;
  shape.integer_digits = 1;
  shape.scale = 20;  // 1/3
  EXPECT_EQ(arrow_type(numeric, {shape}), "decimal128(38, 20)");
  EXPECT_NE(plan_column(numeric, std::vector{shape}).note.find("decimal128(38, 20)"),
            std::string::npos);
  shape.integer_digits = 18;  // still 38 digits in all
  EXPECT_EQ(arrow_type(numeric, {shape}), "decimal128(38, 20)");
  for (auto wider : {ValueShape{.integer_digits = 19, .scale = 20}, ValueShape{.special = true},
                     ValueShape{.integer_digits = 40}, ValueShape{.widest = true}}) {
    const auto plan = plan_column(numeric, std::vector{wider});
    EXPECT_EQ(plan.type.arrow_type->ToString(), "string");
    EXPECT_EQ(plan.type.kind, ValueKind::kNumericText);
    EXPECT_EQ(plan.select, Select::kValue) << "the text comes from the binary value";
  }
  // numeric(50, 2), numeric(5, -2) and a modifier of no digits hold values a decimal128 may
  // hold: planned as unconstrained (and no decimal of 0 digits reaches Arrow, which aborts on
  // one: found by fuzz/pg_types_fuzzer).
  for (int32_t modifier : {numeric_modifier(50, 2), numeric_modifier(5, -2), 4, 0xd004}) {
    SCOPED_TRACE(modifier);
    EXPECT_EQ(arrow_type(builtin(oid::kNumeric, modifier)), "decimal128(38, 0)");
  }
  EXPECT_EQ(arrow_type(builtin(oid::kNumeric, numeric_modifier(1, 0))), "decimal128(1, 0)");
}

TEST(PgTypes, IntervalsWithMonthsKeepThem) {
  const PgType interval = builtin(oid::kInterval);
  const auto duration = plan_column(interval, {});
  EXPECT_EQ(duration.type.arrow_type->ToString(), "duration[us]");
  EXPECT_NE(duration.note.find("a day counted as 24 hours"), std::string::npos);
  const auto months = plan_column(interval, std::vector{ValueShape{.calendar = true}});
  EXPECT_EQ(months.type.arrow_type->ToString(),
            "struct<months: int32, days: int32, microseconds: int64>");
}

TEST(PgTypes, DatesAndTimesPastArrowsRangeGoAsText) {
  for (uint32_t type_oid : {oid::kDate, oid::kTime, oid::kTimestamp, oid::kTimestampTz}) {
    SCOPED_TRACE(type_oid);
    const auto plan = plan_column(builtin(type_oid), std::vector{ValueShape{.special = true}});
    EXPECT_EQ(plan.select, Select::kText);
    EXPECT_NE(plan.note.find("'infinity'"), std::string::npos) << plan.note;
  }
}

TEST(PgTypes, EnumsCompositesAndArraysOfThem) {
  PgType mood;
  mood.kind = PgType::Kind::kEnum;
  mood.oid = mood.wire_oid = 16385;
  mood.names = {"sad", "ok", "happy"};
  const auto moods = plan_column(mood, {});
  EXPECT_EQ(moods.type.arrow_type->ToString(),
            "dictionary<values=string, indices=int32, ordered=0>");
  EXPECT_EQ(moods.type.names, mood.names);

  PgType pair;
  pair.kind = PgType::Kind::kComposite;
  pair.oid = pair.wire_oid = 16396;
  pair.names = {"a", "b", "mood"};
  pair.children = {builtin(oid::kInt4), builtin(oid::kText), mood};
  const auto pairs = plan_column(pair, {});
  EXPECT_EQ(pairs.type.arrow_type->ToString(),
            "struct<a: int32, b: string, mood: dictionary<values=string, indices=int32, "
            "ordered=0>>");
  EXPECT_EQ(pairs.select, Select::kValue);
  EXPECT_EQ(plan_column(array_of(pair), {}).type.arrow_type->ToString(),
            "list<element: " + pairs.type.arrow_type->ToString() + ">");

  // A field with no Parquet type makes the whole value its text form, also in an array.
  PgType with_inet = pair;
  with_inet.children[1] = base(869);
  const auto as_text = plan_column(with_inet, {});
  EXPECT_EQ(as_text.select, Select::kText);
  EXPECT_EQ(as_text.note,
            "no Parquet type: PostgreSQL's text form; a composite type with a "
            "field that has no Parquet type: PostgreSQL's text form");
  EXPECT_EQ(plan_column(array_of(with_inet), {}).select, Select::kTextElements);
}

// The value-dependent parts are numbered depth first, the same whatever their forms.
TEST(PgTypes, ArraysTakeTheirDimensionsFromTheValues) {
  const PgType numbers = array_of(builtin(oid::kNumeric));  // numeric[]: two parts
  EXPECT_EQ(plan_column(numbers, {}).shapes, 2u);
  const auto grid = plan_column(numbers, std::vector{ValueShape{.dimensions = 2},
                                                     ValueShape{.integer_digits = 3, .scale = 2}});
  EXPECT_EQ(grid.type.arrow_type->ToString(), "list<element: list<element: decimal128(38, 2)>>");
  EXPECT_EQ(grid.note,
            "numeric without a precision: decimal128(38, 2), the scale its values need, every "
            "digit kept; 2-dimensional arrays: lists of lists");
  const auto irregular = plan_column(numbers, std::vector{ValueShape{.irregular = true}});
  EXPECT_EQ(irregular.select, Select::kText);
  EXPECT_EQ(irregular.shapes, 2u);
  EXPECT_EQ(irregular.note,
            "arrays of different dimensions, or not indexed from 1: PostgreSQL's text form");
}

TEST(PgTypes, ShapesMergeAndTellWhetherAFormChanged) {
  ValueShape seen{.integer_digits = 2, .scale = 3};
  seen.merge(ValueShape{.integer_digits = 5, .scale = 1, .dimensions = 1});
  EXPECT_EQ(seen.integer_digits, 5);
  EXPECT_EQ(seen.scale, 3);
  EXPECT_FALSE(seen.irregular);
  seen.merge(ValueShape{.dimensions = 2});
  EXPECT_TRUE(seen.irregular);

  const auto numeric = plan_column(builtin(oid::kNumeric), {}).type;
  const ValueShape decided{.integer_digits = 2, .scale = 3};
  EXPECT_TRUE(same_form(numeric, decided, ValueShape{.integer_digits = 30, .scale = 3}));
  EXPECT_FALSE(same_form(numeric, decided, ValueShape{.integer_digits = 2, .scale = 4}));
  EXPECT_FALSE(same_form(numeric, decided, ValueShape{.integer_digits = 36, .scale = 3}));
  EXPECT_FALSE(same_form(numeric, decided, ValueShape{.special = true}));
  const auto interval = plan_column(builtin(oid::kInterval), {}).type;
  EXPECT_FALSE(same_form(interval, {}, ValueShape{.calendar = true}));
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

TEST(PgTypes, MeasuresNumericsAndPrintsThemAsPostgreSQLDoes) {
  struct Case {
    const char* text;
    std::string value;
    int integer_digits, scale;
  } cases[] = {
      {"12.3400", numeric(0, 0, 4, {12, 3400}), 2, 2},
      {"-12.34", numeric(0, 0x4000, 2, {12, 3400}), 2, 2},
      {"0", numeric(0, 0, 0, {}), 0, 0},
      {"0.00", numeric(0, 0, 2, {}), 0, 0},
      {"0.0001", numeric(-1, 0, 4, {1}), 0, 4},
      {"0.00000001", numeric(-2, 0, 8, {1}), 0, 8},
      {"123456789.123456789", numeric(2, 0, 9, {1, 2345, 6789, 1234, 5678, 9000}), 9, 9},
      {"10000000000000000000000000000000000000000", numeric(10, 0, 0, {1}), 41, 0},
      {"0.33333333333333333333", numeric(-1, 0, 20, {3333, 3333, 3333, 3333, 3333}), 0, 20},
      {"1200", numeric(0, 0, 0, {1200}), 4, 0},
      {"50000", numeric(1, 0, 0, {5}), 5, 0},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.text);
    auto text = numeric_to_text(c.value);
    ASSERT_TRUE(text) << text.error().message;
    EXPECT_EQ(*text, c.text);
    auto digits = numeric_digits(c.value);
    ASSERT_TRUE(digits) << digits.error().message;
    EXPECT_EQ(digits->integer_digits, c.integer_digits);
    EXPECT_EQ(digits->scale, c.scale);
    EXPECT_TRUE(digits->finite);
  }
  EXPECT_EQ(*numeric_to_text(numeric(0, 0xC000, 0, {})), "NaN");
  EXPECT_EQ(*numeric_to_text(numeric(0, 0xD000, 0, {})), "Infinity");
  EXPECT_EQ(*numeric_to_text(numeric(0, 0xF000, 0, {})), "-Infinity");
  EXPECT_FALSE(numeric_digits(numeric(0, 0xC000, 0, {}))->finite);
  EXPECT_FALSE(numeric_to_text(numeric(0, 0x1234, 0, {})));  // no such sign
  EXPECT_FALSE(numeric_to_text(numeric(0, 0, 0, {10000})));  // no such digit
}

TEST(PgTypes, DecodesIntervals) {
  // 1 year 2 mons 3 days 04:05:06.789: microseconds, days, months.
  const std::string value = std::string("\x00\x00\x00\x03\x6c\x97\xca\x88", 8) +
                            std::string("\x00\x00\x00\x03\x00\x00\x00\x0e", 8);
  auto interval = read_interval(value);
  ASSERT_TRUE(interval) << interval.error().message;
  EXPECT_EQ(interval->microseconds, 14706789000);
  EXPECT_EQ(interval->days, 3);
  EXPECT_EQ(interval->months, 14);
  int64_t micros = 0;
  EXPECT_FALSE(interval_micros(*interval, micros));
  EXPECT_TRUE(interval_micros({.microseconds = -5, .days = 2}, micros));
  EXPECT_EQ(micros, 2 * 86400000000 - 5);
  EXPECT_FALSE(
      interval_micros({.microseconds = std::numeric_limits<int64_t>::max(), .days = 1}, micros));
  EXPECT_FALSE(read_interval("short"));
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

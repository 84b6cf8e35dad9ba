#include "data/copy_binary.h"

#include <arrow/api.h>
#include <arrow/json/from_string.h>
#include <endian.h>
#include <gtest/gtest.h>

#include <tuple>

#include "data/column_builder.h"

namespace quarry::data {
namespace {

// A binary COPY stream written by hand, as PostgreSQL would send it.
class CopyStream {
 public:
  CopyStream() {
    bytes_.append("PGCOPY\n\377\r\n\0", 11);
    int32(0);  // flags
    int32(0);  // header extension length
  }
  CopyStream& row(std::vector<std::optional<std::string>> fields) {
    int16(static_cast<int16_t>(fields.size()));
    for (const auto& field : fields) {
      if (!field) {
        int32(-1);
        continue;
      }
      int32(static_cast<int32_t>(field->size()));
      bytes_ += *field;
    }
    return *this;
  }
  std::string finish() {
    int16(-1);
    return bytes_;
  }

  static std::string be32(int32_t value) {
    uint32_t big = htobe32(static_cast<uint32_t>(value));
    return std::string(reinterpret_cast<const char*>(&big), 4);
  }
  static std::string be64(int64_t value) {
    uint64_t big = htobe64(static_cast<uint64_t>(value));
    return std::string(reinterpret_cast<const char*>(&big), 8);
  }

 private:
  void int16(int16_t value) {
    uint16_t big = htobe16(static_cast<uint16_t>(value));
    bytes_.append(reinterpret_cast<const char*>(&big), 2);
  }
  void int32(int32_t value) { bytes_ += be32(value); }
  std::string bytes_;
};

using Rows = std::vector<std::vector<std::optional<std::string>>>;

// Feeds `stream` in chunks of `chunk_size` bytes and collects the rows.
Result<Rows> read_all(const std::string& stream, size_t columns, size_t chunk_size) {
  CopyBinaryReader reader(columns);
  Rows rows;
  auto on_row = [&](std::span<const CopyField> fields) -> Result<void> {
    auto& row = rows.emplace_back();
    for (const auto& field : fields) {
      row.push_back(field.is_null() ? std::nullopt
                                    : std::optional<std::string>(std::string(field.bytes())));
    }
    return {};
  };
  for (size_t offset = 0; offset < stream.size(); offset += chunk_size) {
    RETURN_IF_ERROR(reader.consume(std::string_view(stream).substr(offset, chunk_size), on_row));
  }
  RETURN_IF_ERROR(reader.finish());
  return rows;
}

TEST(CopyBinary, ReadsTuplesWhateverTheChunks) {
  const std::string stream = CopyStream()
                                 .row({CopyStream::be32(7), std::string("héllo")})
                                 .row({std::nullopt, std::string("")})
                                 .row({CopyStream::be32(-1), std::string(70000, 'x')})
                                 .finish();
  const Rows expected = {{CopyStream::be32(7), "héllo"},
                         {std::nullopt, ""},
                         {CopyStream::be32(-1), std::string(70000, 'x')}};
  for (size_t chunk_size : {stream.size(), size_t{1}, size_t{2}, size_t{7}, size_t{4096}}) {
    SCOPED_TRACE(chunk_size);
    auto rows = read_all(stream, 2, chunk_size);
    ASSERT_TRUE(rows) << rows.error().message;
    EXPECT_EQ(*rows, expected);
  }
}

TEST(CopyBinary, AnEmptyResultIsHeaderAndTrailer) {
  auto rows = read_all(CopyStream().finish(), 3, 5);
  ASSERT_TRUE(rows) << rows.error().message;
  EXPECT_TRUE(rows->empty());
}

TEST(CopyBinary, RefusesBrokenStreams) {
  EXPECT_FALSE(read_all("NOTCOPY\n\377\r\n\0\0\0\0\0\0\0\0\0\xff\xff", 1, 100));
  // A tuple with the wrong number of fields.
  EXPECT_FALSE(read_all(CopyStream().row({"a", "b"}).finish(), 1, 100));
  // Cut in the middle of a tuple: no trailer.
  std::string cut = CopyStream().row({std::string("abcdef")}).finish();
  cut.resize(cut.size() - 5);
  auto rows = read_all(cut, 1, 3);
  ASSERT_FALSE(rows);
  EXPECT_NE(rows.error().message.find("ended in the middle"), std::string::npos);
  // Data after the trailer.
  EXPECT_FALSE(read_all(CopyStream().finish() + "xx", 1, 100));
}

// Binary values through a ColumnBuilder into Arrow arrays.
using Values = std::vector<std::optional<std::string>>;

CopyField field_of(const std::optional<std::string>& value) {
  CopyField field;
  if (value) {
    field.data = value->data();
    field.length = static_cast<int32_t>(value->size());
  }
  return field;
}

std::unique_ptr<ColumnBuilder> make_builder(const PgType& type, bool sample = true,
                                            std::vector<ValueShape> shapes = {}) {
  auto builder = ColumnBuilder::make("c", type, std::move(shapes), sample);
  EXPECT_TRUE(builder) << builder.error().message;
  return builder ? std::move(*builder) : nullptr;
}

PgType builtin(uint32_t type_oid, int32_t modifier = -1) {
  PgType type;
  EXPECT_TRUE(builtin_type(type_oid, modifier, type));
  return type;
}

// Appends the values (sampled first, where the plan depends on them), decides and finishes.
std::shared_ptr<arrow::Array> build(const PgType& type, const Values& values) {
  auto builder = make_builder(type);
  for (const auto& value : values) {
    auto appended = builder->append(field_of(value));
    EXPECT_TRUE(appended) << appended.error().message;
  }
  auto decided = builder->decide();
  EXPECT_TRUE(decided) << decided.error().message;
  EXPECT_FALSE(builder->misfit());
  auto array = builder->finish();
  EXPECT_TRUE(array) << array.error().message;
  EXPECT_TRUE((*array)->ValidateFull().ok());
  return *array;
}

std::shared_ptr<arrow::Array> build(uint32_t type_oid, int32_t modifier, const Values& values) {
  return build(builtin(type_oid, modifier), values);
}

std::string expected(const std::shared_ptr<arrow::DataType>& type, const std::string& json) {
  return arrow::json::ArrayFromJSONString(type, json).ValueOrDie()->ToString();
}

using B = CopyStream;

// A binary numeric: ndigits, weight, sign, dscale and base-10000 digits.
std::string numeric(int16_t weight, uint16_t sign, int16_t dscale, std::vector<int16_t> digits) {
  auto be16 = [](uint16_t part) {
    const uint16_t big = htobe16(part);
    return std::string(reinterpret_cast<const char*>(&big), 2);
  };
  std::string value = be16(static_cast<uint16_t>(digits.size())) +
                      be16(static_cast<uint16_t>(weight)) + be16(sign) +
                      be16(static_cast<uint16_t>(dscale));
  for (auto digit : digits)
    value += be16(static_cast<uint16_t>(digit));
  return value;
}

// A binary array of int4 elements (nullopt: NULL) with the given sizes and lower bounds.
std::string int4_array(std::vector<std::pair<int32_t, int32_t>> dimensions,
                       std::vector<std::optional<int32_t>> elements) {
  std::string value = B::be32(static_cast<int32_t>(dimensions.size())) + B::be32(0) + B::be32(23);
  for (auto [size, lower_bound] : dimensions)
    value += B::be32(size) + B::be32(lower_bound);
  for (auto element : elements)
    value += element ? B::be32(4) + B::be32(*element) : B::be32(-1);
  return value;
}

TEST(ColumnBuilder, DecodesScalarsAndNulls) {
  auto ints = build(oid::kInt4, -1, {B::be32(42), std::nullopt, B::be32(-5)});
  EXPECT_EQ(ints->ToString(), expected(arrow::int32(), "[42, null, -5]"));

  auto timestamps = build(oid::kTimestampTz, -1, {B::be64(0), std::nullopt});
  EXPECT_EQ(std::static_pointer_cast<arrow::TimestampArray>(timestamps)->Value(0), 946684800000000);
  EXPECT_EQ(timestamps->type()->ToString(), "timestamp[us, tz=UTC]");

  auto texts = build(oid::kJsonb, -1, {std::string("\x01{\"a\": 1}")});
  EXPECT_EQ(std::static_pointer_cast<arrow::StringArray>(texts)->GetString(0), "{\"a\": 1}");

  auto doubles = build(oid::kFloat8, -1, {B::be64(0x3ff8000000000000)});  // 1.5
  EXPECT_EQ(std::static_pointer_cast<arrow::DoubleArray>(doubles)->Value(0), 1.5);
}

// PostgreSQL sends 24:00:00, which Arrow's time of day cannot hold (found by
// fuzz/pg_types_fuzzer: it went into the column as it was, an array that fails validation):
// the column then needs its text form, which only the COPY can give. A time outside the
// day is no value PostgreSQL sends.
TEST(ColumnBuilder, ATimeOf24HoursNeedsTheTextForm) {
  constexpr int64_t kDay = int64_t{86400} * 1000000;
  auto builder = make_builder(builtin(oid::kTime));
  ASSERT_TRUE(builder->append(field_of(B::be64(kDay - 1))));
  ASSERT_TRUE(builder->append(field_of(B::be64(kDay))));
  ASSERT_TRUE(builder->decide());
  EXPECT_TRUE(builder->misfit());
  EXPECT_EQ(plan_column(builtin(oid::kTime), builder->shapes()).select, Select::kText);
  for (int64_t bad : {int64_t{-1}, int64_t{18738497672192}}) {  // the second: the fuzzer's
    auto refused = make_builder(builtin(oid::kTime))->append(field_of(B::be64(bad)));
    ASSERT_FALSE(refused) << bad;
    EXPECT_EQ(refused.error().code, ErrorCode::kInternal);
  }
}

// Found by fuzz/pg_types_fuzzer: text that is not UTF-8 went into a string column as it was,
// an Arrow array that fails validation and a Parquet file readers refuse. A "char" holds any
// byte, and a server in another encoding sends its own.
TEST(ColumnBuilder, RefusesTextThatIsNotUtf8) {
  for (const auto& [type_oid, good, bad] :
       std::vector<std::tuple<uint32_t, std::string, std::string>>{
           {oid::kText, "Müller", "M\xfcller"},  // the second in LATIN1
           {oid::kJsonb, "\x01{\"a\": \"\xc3\xa9\"}", "\x01{\"a\": [1, \xff\xff}"},  // the fuzzer's
       }) {
    SCOPED_TRACE(type_oid);
    auto builder = make_builder(builtin(type_oid));
    ASSERT_TRUE(builder->append(field_of(good)));
    auto refused = builder->append(field_of(bad));
    ASSERT_FALSE(refused);
    EXPECT_EQ(refused.error().code, ErrorCode::kInvalidArgument);
    EXPECT_NE(refused.error().message.find("column 'c' has text that is not UTF-8"),
              std::string::npos)
        << refused.error().message;
  }
}

// A "char" is one byte, sent unconverted: written as PostgreSQL prints it, not refused.
TEST(ColumnBuilder, WritesACharAsPostgresPrintsIt) {
  auto chars = build(oid::kChar, -1,
                     {std::string("a"), std::string("\xc3"), std::string(1, '\0'), std::nullopt});
  EXPECT_EQ(chars->ToString(), expected(arrow::utf8(), R"(["a", "\\303", "", null])"));
}

TEST(ColumnBuilder, DecodesArraysAsListsOneLevelPerDimension) {
  // int4[] '{1,NULL,3}', '{}', NULL.
  auto lists = build(
      1007, -1, {int4_array({{3, 1}}, {1, std::nullopt, 3}), int4_array({}, {}), std::nullopt});
  EXPECT_EQ(lists->ToString(), expected(arrow::list(arrow::int32()), "[[1, null, 3], [], null]"));

  // '{{1,2,3},{4,5,6}}' and '{{7},{8}}': lists of lists, row by row.
  auto grids = build(1007, -1,
                     {int4_array({{2, 1}, {3, 1}}, {1, 2, 3, 4, 5, 6}), int4_array({}, {}),
                      int4_array({{2, 1}, {1, 1}}, {7, 8})});
  EXPECT_EQ(grids->ToString(), expected(arrow::list(arrow::list(arrow::int32())),
                                        "[[[1, 2, 3], [4, 5, 6]], [], [[7], [8]]]"));

  // Arrays of different dimensions, or indexed from another number than 1, need their text form.
  for (const auto& values : {Values{int4_array({{1, 1}}, {1}), int4_array({{1, 1}, {1, 1}}, {2})},
                             Values{int4_array({{2, 0}}, {1, 2})}}) {
    auto builder = make_builder(builtin(1007));
    for (const auto& value : values)
      ASSERT_TRUE(builder->append(field_of(value)));
    ASSERT_TRUE(builder->decide());
    EXPECT_TRUE(builder->misfit());
    EXPECT_EQ(plan_column(builtin(1007), builder->shapes()).select, Select::kText);
  }
}

TEST(ColumnBuilder, UnconstrainedNumericsKeepEveryDigit) {
  // 1.5, 0.33333333333333333333 (1/3, as numeric division gives it), -12345678901234567
  const Values values = {numeric(0, 0, 1, {1, 5000}),
                         numeric(-1, 0, 20, {3333, 3333, 3333, 3333, 3333}),
                         numeric(4, 0x4000, 0, {1, 2345, 6789, 123, 4567}), std::nullopt};
  auto decimals = build(oid::kNumeric, -1, values);
  EXPECT_EQ(decimals->type()->ToString(), "decimal128(38, 20)");
  auto& array = static_cast<arrow::Decimal128Array&>(*decimals);
  EXPECT_EQ(array.FormatValue(0), "1.50000000000000000000");
  EXPECT_EQ(array.FormatValue(1), "0.33333333333333333333");
  EXPECT_EQ(array.FormatValue(2), "-12345678901234567.00000000000000000000");
  EXPECT_TRUE(array.IsNull(3));

  // NaN, or more digits than 38, and the column is PostgreSQL's text of each value.
  auto texts =
      build(oid::kNumeric, -1,
            {numeric(0, 0, 1, {1, 5000}), numeric(0, 0xC000, 0, {}), numeric(10, 0, 0, {1})});
  EXPECT_EQ(
      texts->ToString(),
      expected(arrow::utf8(), R"(["1.5", "NaN", "10000000000000000000000000000000000000000"])"));
}

TEST(ColumnBuilder, IntervalsAsDurationsOrWithTheirMonths) {
  const auto interval = [](int64_t micros, int32_t days, int32_t months) {
    return B::be64(micros) + B::be32(days) + B::be32(months);
  };
  auto durations = build(oid::kInterval, -1, {interval(5, 1, 0), std::nullopt});
  EXPECT_EQ(durations->ToString(),
            expected(arrow::duration(arrow::TimeUnit::MICRO), "[86400000005, null]"));
  auto parts = build(oid::kInterval, -1, {interval(5, 1, 0), interval(0, 0, 14)});
  EXPECT_EQ(parts->ToString(),
            expected(plan_column(builtin(oid::kInterval), std::vector{ValueShape{.calendar = true}})
                         .type.arrow_type,
                     R"([{"months": 0, "days": 1, "microseconds": 5},
                         {"months": 14, "days": 0, "microseconds": 0}])"));
}

TEST(ColumnBuilder, EnumsAreDictionariesInTheirOrderAndCompositesStructs) {
  PgType mood;
  mood.kind = PgType::Kind::kEnum;
  mood.oid = mood.wire_oid = 16385;
  mood.names = {"sad", "ok", "happy"};
  auto moods = build(mood, {std::string("happy"), std::nullopt, std::string("sad")});
  auto& dictionary = static_cast<arrow::DictionaryArray&>(*moods);
  EXPECT_EQ(dictionary.dictionary()->ToString(),
            expected(arrow::utf8(), R"(["sad", "ok", "happy"])"));
  EXPECT_EQ(dictionary.indices()->ToString(), expected(arrow::int32(), "[2, null, 0]"));

  // (a int4, m mood): ROW(7, 'ok') and ROW(NULL, NULL).
  PgType pair;
  pair.kind = PgType::Kind::kComposite;
  pair.oid = pair.wire_oid = 16396;
  pair.names = {"a", "m"};
  pair.children = {builtin(oid::kInt4), mood};
  const std::string full =
      B::be32(2) + B::be32(23) + B::be32(4) + B::be32(7) + B::be32(16385) + B::be32(2) + "ok";
  const std::string empty = B::be32(2) + B::be32(23) + B::be32(-1) + B::be32(16385) + B::be32(-1);
  auto pairs = build(pair, {full, empty, std::nullopt});
  auto& records = static_cast<arrow::StructArray&>(*pairs);
  // (Under a NULL record the fields hold Arrow's empty values.)
  EXPECT_EQ(records.field(0)->Slice(0, 2)->ToString(), expected(arrow::int32(), "[7, null]"));
  EXPECT_TRUE(records.IsNull(2));
  EXPECT_FALSE(records.IsNull(1));
  const std::string wrong_field = B::be32(1) + B::be32(23) + B::be32(4) + B::be32(7);
  EXPECT_FALSE(make_builder(pair)->append(field_of(wrong_field)));
}

// After the first row group, a value that needs a wider form than the plan's is a misfit: the
// column stops appending and goes on measuring, so the next run knows every value's needs.
TEST(ColumnBuilder, AValueNeedingAWiderFormLaterIsAMisfit) {
  auto builder = make_builder(builtin(oid::kNumeric));
  ASSERT_TRUE(builder->append(field_of(numeric(0, 0, 1, {1, 5000}))));  // 1.5
  ASSERT_TRUE(builder->decide());
  ASSERT_FALSE(builder->misfit());
  auto first = builder->finish();
  ASSERT_TRUE(first);
  EXPECT_EQ((*first)->type()->ToString(), "decimal128(38, 1)");
  ASSERT_TRUE(builder->append(field_of(numeric(0, 0, 2, {1, 2500}))));  // 1.25
  EXPECT_TRUE(builder->misfit());
  ASSERT_TRUE(builder->append(field_of(numeric(5, 0, 0, {1}))));  // 10^20, measured only
  EXPECT_EQ(builder->shapes()[0].scale, 2);
  EXPECT_EQ(builder->shapes()[0].integer_digits, 21);
  EXPECT_EQ(plan_column(builtin(oid::kNumeric), builder->shapes()).type.arrow_type->ToString(),
            "decimal128(38, 2)");
}

}  // namespace
}  // namespace quarry::data

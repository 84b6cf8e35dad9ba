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
std::shared_ptr<arrow::Array> build(uint32_t type_oid, int32_t modifier,
                                    const std::vector<std::optional<std::string>>& values) {
  auto type = map_column({"c", type_oid, modifier, "t"});
  EXPECT_TRUE(type);
  auto builder = ColumnBuilder::make("c", *type);
  EXPECT_TRUE(builder);
  for (const auto& value : values) {
    CopyField field;
    if (value) {
      field.data = value->data();
      field.length = static_cast<int32_t>(value->size());
    }
    auto appended = (*builder)->append(field);
    EXPECT_TRUE(appended) << appended.error().message;
  }
  auto array = (*builder)->finish();
  EXPECT_TRUE(array);
  return *array;
}

std::string expected(const std::shared_ptr<arrow::DataType>& type, const std::string& json) {
  return arrow::json::ArrayFromJSONString(type, json).ValueOrDie()->ToString();
}

TEST(ColumnBuilder, DecodesScalarsAndNulls) {
  auto ints = build(oid::kInt4, -1, {CopyStream::be32(42), std::nullopt, CopyStream::be32(-5)});
  EXPECT_EQ(ints->ToString(), expected(arrow::int32(), "[42, null, -5]"));

  auto timestamps = build(oid::kTimestampTz, -1, {CopyStream::be64(0), std::nullopt});
  EXPECT_EQ(std::static_pointer_cast<arrow::TimestampArray>(timestamps)->Value(0), 946684800000000);
  EXPECT_EQ(timestamps->type()->ToString(), "timestamp[us, tz=UTC]");

  auto texts = build(oid::kJsonb, -1, {std::string("\x01{\"a\": 1}")});
  EXPECT_EQ(std::static_pointer_cast<arrow::StringArray>(texts)->GetString(0), "{\"a\": 1}");

  auto doubles = build(oid::kFloat8, -1, {CopyStream::be64(0x3ff8000000000000)});  // 1.5
  EXPECT_EQ(std::static_pointer_cast<arrow::DoubleArray>(doubles)->Value(0), 1.5);
}

// Found by fuzz/pg_types_fuzzer: a time outside the day went into the column as it was, an
// Arrow array that fails validation. PostgreSQL itself sends one: 24:00:00.
TEST(ColumnBuilder, RefusesTimesOutsideTheDay) {
  constexpr int64_t kDay = int64_t{86400} * 1000000;
  auto type = map_column({"t", oid::kTime, -1, "time without time zone"});
  ASSERT_TRUE(type) << type.error().message;
  auto builder = ColumnBuilder::make("t", *type);
  ASSERT_TRUE(builder) << builder.error().message;
  const std::string last = CopyStream::be64(kDay - 1);
  ASSERT_TRUE((*builder)->append({last.data(), 8}));
  const std::string midnight = CopyStream::be64(kDay);
  auto refused = (*builder)->append({midnight.data(), 8});
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code, ErrorCode::kInvalidArgument);
  EXPECT_NE(refused.error().message.find("column 't' has the time 24:00:00"), std::string::npos)
      << refused.error().message;
  for (int64_t bad : {int64_t{-1}, int64_t{18738497672192}}) {  // the second: the fuzzer's
    const std::string value = CopyStream::be64(bad);
    EXPECT_FALSE((*builder)->append({value.data(), 8})) << bad;
  }
  auto array = (*builder)->finish();
  ASSERT_TRUE(array) << array.error().message;
  EXPECT_EQ((*array)->length(), 1);
  EXPECT_TRUE((*array)->ValidateFull().ok());
}

// Found by fuzz/pg_types_fuzzer: text that is not UTF-8 went into a string column as it was,
// an Arrow array that fails validation and a Parquet file readers refuse. A "char" holds any
// byte, and a server in another encoding sends its own.
TEST(ColumnBuilder, RefusesTextThatIsNotUtf8) {
  for (const auto& [type_oid, good, bad] :
       std::vector<std::tuple<uint32_t, std::string, std::string>>{
           {oid::kText, "Müller", "M\xfcller"},  // the second in LATIN1
           {oid::kChar, "a", "\xc3"},            // one byte of 'é'
           {oid::kJsonb, "\x01{\"a\": \"\xc3\xa9\"}", "\x01{\"a\": [1, \xff\xff}"},  // the fuzzer's
       }) {
    SCOPED_TRACE(type_oid);
    auto type = map_column({"t", type_oid, -1, "text"});
    ASSERT_TRUE(type) << type.error().message;
    auto builder = ColumnBuilder::make("t", *type);
    ASSERT_TRUE(builder) << builder.error().message;
    ASSERT_TRUE((*builder)->append({good.data(), static_cast<int32_t>(good.size())}));
    auto refused = (*builder)->append({bad.data(), static_cast<int32_t>(bad.size())});
    ASSERT_FALSE(refused);
    EXPECT_EQ(refused.error().code, ErrorCode::kInvalidArgument);
    EXPECT_NE(refused.error().message.find("column 't' has text that is not UTF-8"),
              std::string::npos)
        << refused.error().message;
    auto array = (*builder)->finish();
    ASSERT_TRUE(array) << array.error().message;
    EXPECT_EQ((*array)->length(), 1);
    EXPECT_TRUE((*array)->ValidateFull().ok());
  }
}

TEST(ColumnBuilder, DecodesOneDimensionalArraysAsLists) {
  // int4[] '{1,NULL,3}': ndim 1, has nulls, element OID 23, size 3, lower bound 1, elements.
  const std::string array = CopyStream::be32(1) + CopyStream::be32(1) + CopyStream::be32(23) +
                            CopyStream::be32(3) + CopyStream::be32(1) + CopyStream::be32(4) +
                            CopyStream::be32(1) + CopyStream::be32(-1) + CopyStream::be32(4) +
                            CopyStream::be32(3);
  const std::string empty = CopyStream::be32(0) + CopyStream::be32(0) + CopyStream::be32(23);
  auto lists = build(1007, -1, {array, empty, std::nullopt});
  EXPECT_EQ(lists->ToString(), expected(arrow::list(arrow::int32()), "[[1, null, 3], [], null]"));

  // Two dimensions are refused, naming the column.
  const std::string matrix = CopyStream::be32(2) + CopyStream::be32(0) + CopyStream::be32(23) +
                             CopyStream::be32(1) + CopyStream::be32(1) + CopyStream::be32(1) +
                             CopyStream::be32(1) + CopyStream::be32(4) + CopyStream::be32(9);
  auto type = map_column({"grid", 1007, -1, "integer[]"});
  ASSERT_TRUE(type);
  auto builder = ColumnBuilder::make("grid", *type);
  ASSERT_TRUE(builder);
  auto appended = (*builder)->append(CopyField{matrix.data(), static_cast<int32_t>(matrix.size())});
  ASSERT_FALSE(appended);
  EXPECT_NE(appended.error().message.find("column 'grid' has a 2-dimensional array"),
            std::string::npos);
}

}  // namespace
}  // namespace quarry::data

// Fuzzes the decoding of PostgreSQL's binary values into Arrow (pg_types, ColumnBuilder), as
// export_query does with each field of a COPY tuple. The input: one byte choosing the column's
// type OID (from the types quarry maps, their arrays and one it refuses), its type modifier (4
// bytes, big-endian), then values, each a 4-byte big-endian length (-1: NULL) and its bytes.
// The array built must pass Arrow's full validation.
#include <arrow/api.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "check.h"
#include "data/column_builder.h"
#include "data/pg_types.h"

namespace {

using namespace quarry::data;

constexpr uint32_t kOids[] = {
    oid::kBool, oid::kBytea, oid::kChar, oid::kName, oid::kInt8, oid::kInt2, oid::kInt4, oid::kText,
    oid::kJson, oid::kXml, oid::kFloat4, oid::kFloat8, oid::kBpchar, oid::kVarchar, oid::kDate,
    oid::kTime, oid::kTimestamp, oid::kTimestampTz, oid::kNumeric, oid::kUuid, oid::kJsonb,
    // Their arrays (pg_type.typarray).
    1000, 1001, 1002, 1003, 1016, 1005, 1007, 1009, 199, 143, 1021, 1022, 1014, 1015, 1182, 1183,
    1115, 1185, 1231, 2951, 3807,
    // interval, which export_query refuses.
    1186};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view input(reinterpret_cast<const char*>(data), size);
  if (input.size() < 5) return 0;
  ColumnDescription column;
  column.name = "value";
  column.type_oid = kOids[static_cast<unsigned char>(input[0]) % std::size(kOids)];
  column.type_modifier = read_int32(input.data() + 1);
  column.sql_type = "fuzzed";
  input.remove_prefix(5);

  auto type = map_column(column);
  if (!type) return 0;
  auto builder = ColumnBuilder::make(column.name, *type);
  check(builder.has_value(), "no builder for a mapped type");
  while (input.size() >= 4) {
    const int32_t length = read_int32(input.data());
    input.remove_prefix(4);
    CopyField field;
    if (length >= 0) {
      if (static_cast<size_t>(length) > input.size()) break;
      field.data = input.data();
      field.length = length;
      input.remove_prefix(static_cast<size_t>(length));
    }
    // A value that does not decode ends the export, as it does here.
    if (!(*builder)->append(field)) break;
  }
  auto array = (*builder)->finish();
  check(array.has_value(), "finishing the column failed");
  check((*array)->type()->Equals(*type->arrow_type), "the array has another type than mapped");
  const arrow::Status valid = (*array)->ValidateFull();
  check(valid.ok(), valid.ToString());
  return 0;
}

// Fuzzes the decoding of PostgreSQL's binary values into Arrow (pg_types, ColumnBuilder), as
// export_query does with each field of a COPY tuple. The input: one byte choosing the column's
// type (a built-in type quarry decodes, an array of one, an enum or a composite), its type
// modifier (4 bytes, big-endian), then values, each a 4-byte big-endian length (-1: NULL) and
// its bytes. The column is sampled, planned from its values and decoded, as in the first row
// group of an export; the array built must have the planned type and pass Arrow's full
// validation.
#include <arrow/api.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "check.h"
#include "data/column_builder.h"
#include "data/pg_types.h"

namespace {
constexpr uint32_t kEnumOid = 90001, kCompositeOid = 90002;
}  // namespace

namespace {

using namespace quarry::data;

constexpr uint32_t kOids[] = {
    oid::kBool, oid::kBytea, oid::kChar, oid::kName, oid::kInt8, oid::kInt2, oid::kInt4, oid::kText,
    oid::kJson, oid::kXml, oid::kFloat4, oid::kFloat8, oid::kBpchar, oid::kVarchar, oid::kDate,
    oid::kTime, oid::kTimestamp, oid::kTimestampTz, oid::kNumeric, oid::kUuid, oid::kJsonb,
    // Their arrays (pg_type.typarray).
    1000, 1001, 1002, 1003, 1016, 1005, 1007, 1009, 199, 143, 1021, 1022, 1014, 1015, 1182, 1183,
    1115, 1185, 1231, 2951, 3807,
    // interval and its array (in this order, after the rest, so the seeds keep their types).
    oid::kInterval, 1187,
    // Two that come from the catalog: an enum, and a composite of (int4, numeric, the enum).
    kEnumOid, kCompositeOid};

}  // namespace

// The type of the fuzzed column.
PgType fuzzed_type(uint32_t type_oid, int32_t modifier) {
  PgType type;
  if (builtin_type(type_oid, modifier, type)) return type;
  PgType mood;
  mood.kind = PgType::Kind::kEnum;
  mood.oid = mood.wire_oid = kEnumOid;
  mood.names = {"sad", "ok", "happy"};
  if (type_oid == kEnumOid) return mood;
  type.kind = PgType::Kind::kComposite;
  type.oid = type.wire_oid = kCompositeOid;
  type.names = {"a", "n", "m"};
  PgType field;
  builtin_type(oid::kInt4, -1, field);
  type.children.push_back(field);
  builtin_type(oid::kNumeric, modifier, field);
  type.children.push_back(field);
  type.children.push_back(mood);
  return type;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view input(reinterpret_cast<const char*>(data), size);
  if (input.size() < 5) return 0;
  const uint32_t type_oid = kOids[static_cast<unsigned char>(input[0]) % std::size(kOids)];
  const int32_t modifier = read_int32(input.data() + 1);
  input.remove_prefix(5);

  const PgType type = fuzzed_type(type_oid, modifier);
  auto made = ColumnBuilder::make("value", type, {}, /*sample=*/true);
  check(made.has_value(), "no builder for a planned type");
  auto& builder = **made;
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
    // A value that does not decode ends the export: its column is never written.
    if (!builder.append(field)) return 0;
  }
  // A value the binary form cannot be decoded from ends the export too; else the column is
  // planned from what the values showed, and the array must be what the plan says.
  if (!builder.decide() || builder.misfit()) return 0;
  auto array = builder.finish();
  check(array.has_value(), "finishing the column failed");
  check((*array)->type()->Equals(*builder.plan().type.arrow_type),
        "the array has another type than planned");
  const arrow::Status valid = (*array)->ValidateFull();
  check(valid.ok(), valid.ToString());
  return 0;
}

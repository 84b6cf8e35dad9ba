// What PostgreSQL's catalog says about the types of a query's columns: arrays with their
// element type, composite types with their fields, enums with their labels, domains as their
// base type; what export_query needs to map any column (pg_types.h). Built-in types are known
// without asking the server, so a query of ordinary columns costs no round trip here.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/error.h"
#include "data/statement.h"

namespace quarry::data {

class Connection;

struct PgType {
  enum class Kind {
    kBase,       // any other type: a built-in scalar, a range, a pseudo-type, an extension's
    kArray,      // children[0] is the element type
    kComposite,  // children are the fields, named by `names`
    kEnum,       // `names` are the labels in the enum's sort order
  };
  Kind kind = Kind::kBase;
  uint32_t oid = 0;       // the type itself (a domain's base type)
  uint32_t wire_oid = 0;  // the OID binary array and record values name it by (a domain's own)
  int32_t modifier = -1;  // the type modifier (numeric's precision and scale)
  std::vector<PgType> children;
  std::vector<std::string> names;
};

// The type of each column, in order. Asks the catalog only for types it does not know.
Result<std::vector<PgType>> resolve_types(Connection& connection,
                                          const std::vector<ColumnDescription>& columns);

// A built-in scalar type or an array of one, without the catalog; false for anything else.
bool builtin_type(uint32_t type_oid, int32_t modifier, PgType& type);

}  // namespace quarry::data

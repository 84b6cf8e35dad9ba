#include "data/pg_catalog.h"

#include <charconv>
#include <map>
#include <set>

#include "data/connection.h"
#include "data/pg_types.h"

namespace quarry::data {
namespace {

// Composite types nest; PostgreSQL forbids a type containing itself, so this only bounds work.
constexpr int kMaxDepth = 16;

// int2vector and oidvector are in the array category, but casts treat them as scalars.
constexpr uint32_t kInt2Vector = 22, kOidVector = 30;

struct CatalogType {
  char typtype = 'b';
  uint32_t element = 0;  // arrays
  uint32_t base = 0;     // domains
  int32_t base_modifier = -1;
  uint32_t relation = 0;  // composites
  std::vector<std::pair<std::string, std::pair<uint32_t, int32_t>>> fields;
  std::vector<std::string> labels;
};

template <typename T>
T number(const PGresult* result, int row, int column) {
  const char* text = PQgetvalue(result, row, column);
  T value{};
  std::from_chars(text, text + PQgetlength(result, row, column), value);
  return value;
}

std::string oid_array(const std::set<uint32_t>& oids) {
  std::string text = "{";
  for (uint32_t oid : oids)
    text += fmt::format("{}{}", text.size() > 1 ? "," : "", oid);
  return text + "}";
}

// Reads what the catalog has on `oids` and on every type they are made of.
Result<std::map<uint32_t, CatalogType>> read_catalog(Connection& connection,
                                                     std::set<uint32_t> pending) {
  std::map<uint32_t, CatalogType> catalog;
  for (int depth = 0; !pending.empty() && depth < kMaxDepth; ++depth) {
    ASSIGN_OR_RETURN(auto types,
                     connection.exec("SELECT oid, typtype, typcategory, typelem, typbasetype, "
                                     "typtypmod, typrelid FROM pg_catalog.pg_type "
                                     "WHERE oid = ANY($1::oid[])",
                                     {oid_array(pending)}));
    std::set<uint32_t> next, composites, enums;
    // A type asked for in this round is not asked for again, even if its row comes later in
    // this result than the array or domain made of it (a composite and an array of it in one
    // query): read twice, its fields or labels would be appended twice.
    auto want = [&](uint32_t oid) {
      PgType known;
      if (oid != 0 && !catalog.contains(oid) && !pending.contains(oid) &&
          !builtin_type(oid, -1, known)) {
        next.insert(oid);
      }
    };
    for (int row = 0; row < PQntuples(types.get()); ++row) {
      const auto oid = number<uint32_t>(types.get(), row, 0);
      // Each type's row is read once, so its fields and labels are listed once.
      const auto [entry, inserted] = catalog.try_emplace(oid);
      if (!inserted) continue;
      auto& type = entry->second;
      type.typtype = PQgetvalue(types.get(), row, 1)[0];
      const char category = PQgetvalue(types.get(), row, 2)[0];
      if (category == 'A' && oid != kInt2Vector && oid != kOidVector) {
        type.element = number<uint32_t>(types.get(), row, 3);
        want(type.element);
      }
      if (type.typtype == 'd') {
        type.base = number<uint32_t>(types.get(), row, 4);
        type.base_modifier = number<int32_t>(types.get(), row, 5);
        want(type.base);
      }
      if (type.typtype == 'c') {
        type.relation = number<uint32_t>(types.get(), row, 6);
        composites.insert(oid);
      }
      if (type.typtype == 'e') enums.insert(oid);
    }
    if (!composites.empty()) {
      ASSIGN_OR_RETURN(auto fields,
                       connection.exec("SELECT t.oid, a.attname, a.atttypid, a.atttypmod "
                                       "FROM pg_catalog.pg_type t JOIN pg_catalog.pg_attribute a "
                                       "ON a.attrelid = t.typrelid WHERE t.oid = ANY($1::oid[]) "
                                       "AND a.attnum > 0 AND NOT a.attisdropped "
                                       "ORDER BY t.oid, a.attnum",
                                       {oid_array(composites)}));
      for (int row = 0; row < PQntuples(fields.get()); ++row) {
        const auto field_oid = number<uint32_t>(fields.get(), row, 2);
        catalog[number<uint32_t>(fields.get(), row, 0)].fields.push_back(
            {PQgetvalue(fields.get(), row, 1), {field_oid, number<int32_t>(fields.get(), row, 3)}});
        want(field_oid);
      }
    }
    if (!enums.empty()) {
      ASSIGN_OR_RETURN(auto labels, connection.exec("SELECT enumtypid, enumlabel "
                                                    "FROM pg_catalog.pg_enum "
                                                    "WHERE enumtypid = ANY($1::oid[]) "
                                                    "ORDER BY enumtypid, enumsortorder",
                                                    {oid_array(enums)}));
      for (int row = 0; row < PQntuples(labels.get()); ++row) {
        catalog[number<uint32_t>(labels.get(), row, 0)].labels.push_back(
            PQgetvalue(labels.get(), row, 1));
      }
    }
    pending = std::move(next);
  }
  return catalog;
}

PgType build(const std::map<uint32_t, CatalogType>& catalog, uint32_t oid, int32_t modifier,
             int depth) {
  PgType type;
  type.oid = type.wire_oid = oid;
  type.modifier = modifier;
  if (builtin_type(oid, modifier, type)) return type;
  const auto found = catalog.find(oid);
  if (found == catalog.end() || depth >= kMaxDepth) return type;  // a base type: its text form
  const CatalogType& entry = found->second;
  if (entry.base != 0) {
    // A domain is its base type, with the domain's own modifier unless the column has one.
    type = build(catalog, entry.base, modifier >= 0 ? modifier : entry.base_modifier, depth + 1);
    type.wire_oid = oid;
    return type;
  }
  if (entry.element != 0) {
    type.kind = PgType::Kind::kArray;
    // An array column's modifier is its elements' (numeric(6,2)[]).
    type.children.push_back(build(catalog, entry.element, modifier, depth + 1));
  } else if (entry.typtype == 'c') {
    type.kind = PgType::Kind::kComposite;
    for (const auto& [name, field] : entry.fields) {
      type.names.push_back(name);
      type.children.push_back(build(catalog, field.first, field.second, depth + 1));
    }
  } else if (entry.typtype == 'e') {
    type.kind = PgType::Kind::kEnum;
    type.names = entry.labels;
  }
  return type;
}

}  // namespace

Result<std::vector<PgType>> resolve_types(Connection& connection,
                                          const std::vector<ColumnDescription>& columns) {
  std::set<uint32_t> unknown;
  for (const auto& column : columns) {
    PgType known;
    if (!builtin_type(column.type_oid, column.type_modifier, known)) {
      unknown.insert(column.type_oid);
    }
  }
  std::map<uint32_t, CatalogType> catalog;
  if (!unknown.empty()) {
    ASSIGN_OR_RETURN(catalog, with_context(read_catalog(connection, std::move(unknown)),
                                           "reading the column types"));
  }
  std::vector<PgType> types;
  for (const auto& column : columns) {
    types.push_back(build(catalog, column.type_oid, column.type_modifier, 0));
  }
  return types;
}

}  // namespace quarry::data

// One Parquet column being filled: decodes binary COPY values of its PostgreSQL type (see
// pg_types.h) into the matching Arrow builder, and hands out the array of a row group.
#pragma once

#include <arrow/type_fwd.h>

#include <memory>
#include <string>

#include "common/error.h"
#include "data/copy_binary.h"
#include "data/pg_types.h"

namespace arrow {
class ArrayBuilder;
}

namespace quarry::data {

class ColumnBuilder {
 public:
  static Result<std::unique_ptr<ColumnBuilder>> make(std::string name, ColumnType type);
  ~ColumnBuilder();

  // Appends one value (NULL if field.is_null()). Errors name the column.
  Result<void> append(const CopyField& field);
  // The values appended since the last call, as one array; the builder starts empty again.
  Result<std::shared_ptr<arrow::Array>> finish();

  const std::string& name() const { return name_; }
  const ColumnType& type() const { return type_; }

 private:
  ColumnBuilder(std::string name, ColumnType type, std::unique_ptr<arrow::ArrayBuilder> builder);
  // Appends a non-NULL scalar to `builder` (the column's, or its list's value builder).
  Result<void> append_value(arrow::ArrayBuilder& builder, std::string_view value);
  Result<void> append_array(std::string_view value);
  std::unexpected<Error> column_error(const Error& error) const;

  std::string name_;
  ColumnType type_;
  std::unique_ptr<arrow::ArrayBuilder> builder_;
  arrow::ArrayBuilder* values_ = nullptr;  // the list's value builder, for arrays
};

// An arrow::Status as a Result: "<what>: <status>".
Result<void> from_status(const arrow::Status& status, std::string_view what);

}  // namespace quarry::data

// One Parquet column being filled: decodes binary COPY values of its PostgreSQL type (see
// pg_types.h) into the matching Arrow builder, measuring the parts whose form depends on the
// values, and hands out the array of a row group.
//
// A column whose plan depends on its values first only keeps them (sampling), until decide()
// plans it from what they showed and decodes them. A value that later needs another form
// (misfit()) makes the column only measure from there on: the export then runs again with
// shapes() and this time every value fits.
#pragma once

#include <arrow/type_fwd.h>

#include <memory>
#include <string>
#include <vector>

#include "common/error.h"
#include "data/copy_binary.h"
#include "data/pg_types.h"

namespace arrow {
class ArrayBuilder;
}

namespace quarry::data {

class ColumnBuilder {
 public:
  // A builder for a column of `type`, planned from `shapes` (what an earlier run of the query
  // showed; empty on the first), selected by the COPY as plan_column(type, shapes) says.
  // `sample`: keep the values until decide() if the plan depends on them.
  static Result<std::unique_ptr<ColumnBuilder>> make(std::string name, PgType type,
                                                     std::vector<ValueShape> shapes, bool sample);
  ~ColumnBuilder();

  // Appends one value (NULL if field.is_null()). Errors name the column; after one, the
  // column's values are not written (a record may be left half appended).
  Result<void> append(const CopyField& field);
  // Plans a sampled column from its values and decodes them; nothing for any other.
  Result<void> decide();
  // The values appended since the last call, as one array; the builder starts empty again.
  Result<std::shared_ptr<arrow::Array>> finish();

  // A value needed another form than the plan's (or, after decide(), another select): the
  // column measures from here on, and its array must not be written.
  bool misfit() const { return misfit_; }
  // Measure every value from here on, appending none.
  void stop_appending() { mode_ = Mode::kMeasuring; }
  // What the values so far showed, for planning the column again.
  const std::vector<ValueShape>& shapes() const { return seen_; }

  const std::string& name() const { return name_; }
  const ColumnPlan& plan() const { return plan_; }

 private:
  enum class Mode { kSampling, kDecoding, kMeasuring };

  ColumnBuilder(std::string name, PgType type, std::vector<ValueShape> shapes, ColumnPlan plan,
                Mode mode);
  Result<void> make_builder();
  // Measures the value-dependent parts of `value`, a non-NULL binary value of `type`, and
  // appends it to `builder` unless that is null (or a part misfits).
  Result<void> visit(const ValueType& type, std::string_view value, arrow::ArrayBuilder* builder);
  Result<void> visit_array(const ValueType& type, std::string_view value,
                           arrow::ArrayBuilder* builder);
  Result<void> visit_record(const ValueType& type, std::string_view value,
                            arrow::ArrayBuilder* builder);
  // Appends a date or time moved to Arrow's epoch; one beyond Arrow's range ('infinity',
  // 24:00:00) is measured as such instead.
  template <typename Builder, typename T>
  Result<void> append_time(const ValueType& type, const Result<T>& converted,
                           arrow::ArrayBuilder* builder);
  // Takes what `value` showed of the part `type` into seen_; false if it no longer fits.
  bool measure(const ValueType& type, const ValueShape& value);
  std::unexpected<Error> column_error(const Error& error) const;

  std::string name_;
  PgType type_;
  std::vector<ValueShape> decided_;  // what plan_ was made from
  std::vector<ValueShape> seen_;     // decided_ and what this run's values showed
  ColumnPlan plan_;
  Select select_;  // how the COPY selects the column
  Mode mode_;
  bool misfit_ = false;
  std::shared_ptr<arrow::ArrayBuilder> builder_;
  // Sampled values: a 4-byte length (-1 for NULL) and the bytes of each.
  std::string samples_;
};

// An arrow::Status as a Result: "<what>: <status>".
Result<void> from_status(const arrow::Status& status, std::string_view what);

}  // namespace quarry::data

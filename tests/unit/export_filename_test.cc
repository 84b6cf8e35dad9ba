#include <gtest/gtest.h>

#include "data/sandbox_export.h"

namespace quarry::data {
namespace {

TEST(ExportFilename, AcceptsPlainNames) {
  for (const char* name : {"data.parquet", "views_by_category.parquet", "2024-01.events.parquet",
                           "A.parquet", "x_y-z.1.parquet"}) {
    SCOPED_TRACE(name);
    EXPECT_TRUE(validate_export_filename(name));
  }
  EXPECT_TRUE(validate_export_filename(std::string(100, 'a') + ".parquet"));
}

TEST(ExportFilename, RefusesPathsAndOddNames) {
  struct Case {
    std::string name;
    const char* expected;
  } cases[] = {
      {"data.csv", "must end in .parquet"},
      {"data", "must end in .parquet"},
      {".parquet", "needs a name before .parquet"},
      {"../data.parquet", "must not contain a path"},
      {"/etc/data.parquet", "must not contain a path"},
      {"sub/data.parquet", "must not contain a path"},
      {"a..b.parquet", "must not contain '..'"},
      {".hidden.parquet", "must start with a letter or digit"},
      {"-rf.parquet", "must start with a letter or digit"},
      {"my data.parquet", "character that is not allowed"},
      {"da\nta.parquet", "character that is not allowed"},
      {"caf\xc3\xa9.parquet", "character that is not allowed"},
      {"a;rm.parquet", "character that is not allowed"},
      {"back\\slash.parquet", "character that is not allowed"},
      {std::string(101, 'a') + ".parquet", "too long"},
      {"", "must end in .parquet"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    auto valid = validate_export_filename(c.name);
    ASSERT_FALSE(valid);
    EXPECT_EQ(valid.error().code, ErrorCode::kInvalidArgument);
    EXPECT_NE(valid.error().message.find(c.expected), std::string::npos) << valid.error().message;
    // Every refusal says what a good name looks like.
    EXPECT_NE(valid.error().message.find("use a plain name"), std::string::npos);
  }
}

}  // namespace
}  // namespace quarry::data

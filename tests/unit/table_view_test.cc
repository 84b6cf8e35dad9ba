// A table artifact as pages: CSV and Parquet files as analyses write them, sorted over the whole
// file, values as a JavaScript client can hold them, and clear refusals.
#include "data/table_view.h"

#include <arrow/api.h>
#include <arrow/io/file.h>
#include <gtest/gtest.h>
#include <parquet/arrow/writer.h>
#include <unistd.h>

#include <fstream>

namespace quarry::data {
namespace {

class TableViewTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / fmt::format("quarry-table-{}", ::getpid());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // 45 rows: n 0..44, name "row-n", score (n * 7) % 45 + 0.5 (each value once), but null for
  // n 9, 19, 29 and 39 (the scores 18.5, 43.5, 23.5, 3.5).
  std::filesystem::path scores_csv() {
    auto path = dir_ / "scores.csv";
    std::ofstream out(path);
    out << "n,name,score\n";
    for (int n = 0; n < 45; ++n) {
      out << n << ",row-" << n << ",";
      if (n % 10 != 9) out << (n * 7) % 45 << ".5";
      out << "\n";
    }
    return path;
  }

  std::filesystem::path parquet(const std::shared_ptr<arrow::Table>& table) {
    auto path = dir_ / "table.parquet";
    auto file = arrow::io::FileOutputStream::Open(path.string());
    EXPECT_TRUE(file.ok());
    EXPECT_TRUE(parquet::arrow::WriteTable(*table, arrow::default_memory_pool(), *file, 1024).ok());
    EXPECT_TRUE((*file)->Close().ok());
    return path;
  }

  std::filesystem::path dir_;
};

TablePageRequest rows(uint64_t offset, uint64_t limit, std::string sort = "",
                      bool descending = false) {
  TablePageRequest request;
  request.offset = offset;
  request.limit = limit;
  request.sort = std::move(sort);
  request.descending = descending;
  return request;
}

std::vector<nlohmann::json> column(const nlohmann::json& page, size_t index) {
  std::vector<nlohmann::json> values;
  for (const auto& row : page["rows"])
    values.push_back(row[index]);
  return values;
}

TEST_F(TableViewTest, ACsvFileComesAPageAtATimeWithItsColumnTypes) {
  auto page = read_table_page(scores_csv(), "csv", rows(0, 20));
  ASSERT_TRUE(page) << page.error().message;
  EXPECT_EQ((*page)["total_rows"], 45);
  EXPECT_EQ((*page)["columns"], nlohmann::json::parse(R"([{"name": "n", "type": "int64"},
      {"name": "name", "type": "string"}, {"name": "score", "type": "double"}])"));
  ASSERT_EQ((*page)["rows"].size(), 20u);
  EXPECT_EQ((*page)["rows"][0], nlohmann::json::parse(R"([0, "row-0", 0.5])"));
  EXPECT_EQ((*page)["rows"][9], nlohmann::json::parse(R"([9, "row-9", null])"));

  auto last = read_table_page(scores_csv(), "csv", rows(40, 20));
  ASSERT_TRUE(last);
  EXPECT_EQ((*last)["offset"], 40);
  EXPECT_EQ(column(*last, 0), (std::vector<nlohmann::json>{40, 41, 42, 43, 44}));
  auto past = read_table_page(scores_csv(), "csv", rows(100, 20));
  ASSERT_TRUE(past);
  EXPECT_TRUE((*past)["rows"].empty());
  EXPECT_EQ((*past)["total_rows"], 45);
}

TEST_F(TableViewTest, SortingOrdersTheWholeFileBeforeThePageIsTaken) {
  const auto path = scores_csv();
  // Ascending: 0.5, 1.5, ... across page boundaries, the nulls last.
  std::vector<nlohmann::json> ascending;
  for (uint64_t offset = 0; offset < 45; offset += 20) {
    auto page = read_table_page(path, "csv", rows(offset, 20, "score"));
    ASSERT_TRUE(page) << page.error().message;
    for (auto& value : column(*page, 2))
      ascending.push_back(value);
  }
  ASSERT_EQ(ascending.size(), 45u);
  for (size_t i = 0; i + 1 < 41; ++i)
    EXPECT_LT(ascending[i].get<double>(), ascending[i + 1].get<double>()) << i;
  for (size_t i = 41; i < 45; ++i)
    EXPECT_TRUE(ascending[i].is_null()) << i;

  auto top = read_table_page(path, "csv", rows(0, 3, "score", true));
  ASSERT_TRUE(top);
  EXPECT_EQ(column(*top, 2), (std::vector<nlohmann::json>{44.5, 42.5, 41.5}));
  auto names = read_table_page(path, "csv", rows(0, 2, "name", true));
  ASSERT_TRUE(names);
  EXPECT_EQ(column(*names, 1), (std::vector<nlohmann::json>{"row-9", "row-8"}));
}

TEST_F(TableViewTest, IntegersAJavaScriptNumberCannotHoldComeAsText) {
  arrow::Int64Builder ids;
  ASSERT_TRUE(ids.AppendValues({1, (int64_t{1} << 53) - 1, int64_t{1} << 53,
                                std::numeric_limits<int64_t>::min()})
                  .ok());
  arrow::DoubleBuilder ratios;
  ASSERT_TRUE(ratios
                  .AppendValues({0.25, std::numeric_limits<double>::quiet_NaN(),
                                 std::numeric_limits<double>::infinity(), -1.5})
                  .ok());
  auto table = arrow::Table::Make(
      arrow::schema({arrow::field("id", arrow::int64()), arrow::field("ratio", arrow::float64())}),
      {*ids.Finish(), *ratios.Finish()});
  auto page = read_table_page(parquet(table), "parquet", {});
  ASSERT_TRUE(page) << page.error().message;
  EXPECT_EQ((*page)["rows"], nlohmann::json::parse(R"([[1, 0.25], [9007199254740991, "nan"],
      ["9007199254740992", "inf"], ["-9223372036854775808", -1.5]])"));
}

TEST_F(TableViewTest, AnUnknownColumnABrokenFileAndAHugeOneAreRefusedClearly) {
  auto unknown = read_table_page(scores_csv(), "csv", rows(0, 20, "scroe"));
  ASSERT_FALSE(unknown);
  EXPECT_EQ(unknown.error().code, ErrorCode::kInvalidArgument);
  EXPECT_EQ(unknown.error().message, "there is no column 'scroe' to sort by (n, name, score)");

  auto broken = dir_ / "broken.parquet";
  std::ofstream(broken) << "PAR1 this is not a Parquet file";
  auto unreadable = read_table_page(broken, "parquet", {});
  ASSERT_FALSE(unreadable);
  EXPECT_EQ(unreadable.error().code, ErrorCode::kFailedPrecondition);
  EXPECT_TRUE(unreadable.error().message.starts_with("the file is not a readable parquet table"))
      << unreadable.error().message;

  auto small_limit = rows(0, 20);
  small_limit.max_file_bytes = 100;
  auto large = read_table_page(scores_csv(), "csv", small_limit);
  ASSERT_FALSE(large);
  EXPECT_EQ(large.error().code, ErrorCode::kResourceExhausted);
  EXPECT_NE(large.error().message.find("download it instead"), std::string::npos);
}

// A file from a sandbox can be small and hold many values: showing it must not take the
// server's memory (50 million copies of one number are a 200 KB Parquet file and 400 MB read).
TEST_F(TableViewTest, ATableTakingMoreMemoryThanAllowedIsRefusedNotRead) {
  arrow::Int64Builder same;
  ASSERT_TRUE(same.AppendValues(std::vector<int64_t>(4'000'000, 7)).ok());
  auto many = parquet(
      arrow::Table::Make(arrow::schema({arrow::field("n", arrow::int64())}), {*same.Finish()}));
  EXPECT_LT(std::filesystem::file_size(many), 1u << 20) << "a small file";
  auto limited = rows(0, 20);
  limited.max_memory_bytes = 8ull << 20;
  auto refused = read_table_page(many, "parquet", limited);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code, ErrorCode::kResourceExhausted);
  EXPECT_EQ(refused.error().message,
            "the table takes more than 8 MiB in memory to show; download it instead");
}

}  // namespace
}  // namespace quarry::data

// What the browser UI reads besides the API it shares with scripts: its page and assets, served
// under a strict policy (or a clear 503 when the UI is not built), and tables of CSV and
// Parquet artifacts, a page at a time.
#include <gtest/gtest.h>

#include "api_environment.h"

namespace quarry::testing {
namespace {

TEST(Ui, ThePageAndItsAssetsComeFromTheServerUnderAStrictPolicy) {
  QuarryServer server;
  ASSERT_TRUE(server.started());
  ApiClient browser(server.url());
  auto page = browser.get("/");
  ASSERT_EQ(page.status, 200) << page.body;
  EXPECT_EQ(page.header("Content-Type"), "text/html; charset=utf-8");
  EXPECT_NE(page.body.find("<script type=\"module\" src=\"/assets/app.js\""), std::string::npos)
      << page.body;
  const std::string policy = page.header("Content-Security-Policy");
  EXPECT_NE(policy.find("script-src 'self';"), std::string::npos) << policy;
  EXPECT_EQ(policy.find("unsafe-inline"), std::string::npos) << policy;
  EXPECT_NE(policy.find("frame-ancestors 'none'"), std::string::npos) << policy;

  auto script = browser.get("/assets/app.js");
  ASSERT_EQ(script.status, 200);
  EXPECT_EQ(script.header("Content-Type"), "text/javascript; charset=utf-8");
  EXPECT_EQ(script.header("X-Content-Type-Options"), "nosniff");
  EXPECT_GT(script.body.size(), 10'000u);
  auto style = browser.get("/assets/app.css");
  ASSERT_EQ(style.status, 200);
  EXPECT_EQ(style.header("Content-Type"), "text/css; charset=utf-8");
  auto head = browser.send("HEAD", "/assets/app.js", "", {});
  EXPECT_EQ(head.status, 200);
  EXPECT_EQ(head.header("Content-Length"), std::to_string(script.body.size()));
  EXPECT_TRUE(head.body.empty());

  // Only the files in assets/: no other path, no hidden file, nothing above it.
  for (const char* path : {"/assets/nothing.js", "/assets/.hidden", "/assets/..%2Findex.html",
                           "/assets/%2e%2e%2f%2e%2e%2fetc%2fpasswd", "/assets/sub/app.js"}) {
    SCOPED_TRACE(path);
    auto refused = browser.get(path);
    EXPECT_EQ(refused.status, 404) << refused.body;
  }
  EXPECT_EQ(server.stop(SIGTERM), 0);
}

TEST(Ui, WithoutTheBuiltPageTheServerSaysHowToBuildIt) {
  QuarryServer server({.server_config = "  web_dir: /nonexistent/quarry-web\n"});
  ASSERT_TRUE(server.started());
  ApiClient browser(server.url());
  auto page = browser.get("/");
  EXPECT_EQ(page.status, 503);
  EXPECT_EQ(page.json["error"]["code"], "ui_not_built");
  EXPECT_NE(page.json["error"]["message"].get<std::string>().find("scripts/build"),
            std::string::npos);
  EXPECT_EQ(browser.get("/api/v1/info").status, 200);  // the API works without it
  EXPECT_EQ(server.stop(SIGTERM), 0);
}

TEST(Ui, ATableArtifactIsPagedAndSortedOverTheWholeFile) {
  QuarryServer server;
  ASSERT_TRUE(server.started());
  ApiClient api(server.url());
  const auto id = api.create_conversation();
  // The same 45 rows as CSV and as Parquet (Polars writes both), and a JSON file that is none.
  auto cell = api.cell(id, "python",
                       "import polars as pl\n"
                       "df = pl.DataFrame({'n': range(45), 'score': [(n * 7) % 45 for n in "
                       "range(45)]})\n"
                       "df.write_csv('/home/sandbox/outputs/scores.csv')\n"
                       "df.write_parquet('/home/sandbox/outputs/scores.parquet')\n"
                       "open('/home/sandbox/outputs/meta.json', 'w').write('{\"rows\": 45}')\n");
  ASSERT_EQ(cell.events.back().data["status"], "completed");
  std::map<std::string, std::string> table_url;
  for (const auto& saved : of_type(cell.events, "artifact")) {
    table_url[saved.data["artifact"]["name"]] =
        saved.data["artifact"]["url"].get<std::string>() + "/table";
  }
  ASSERT_EQ(table_url.size(), 3u);

  for (const char* name : {"scores.csv", "scores.parquet"}) {
    SCOPED_TRACE(name);
    auto first = api.get(table_url[name] + "?limit=20");
    ASSERT_EQ(first.status, 200) << first.body;
    EXPECT_EQ(first.json["total_rows"], 45);
    EXPECT_EQ(first.json["columns"][0]["name"], "n");
    EXPECT_EQ(first.json["columns"][0]["type"], "int64");
    ASSERT_EQ(first.json["rows"].size(), 20u);
    EXPECT_EQ(first.json["rows"][1], nlohmann::json::parse("[1, 7]"));
    // Sorted by score, descending: the third page starts at the 41st largest score, 4.
    auto sorted = api.get(table_url[name] + "?sort=score&order=desc&offset=40&limit=20");
    ASSERT_EQ(sorted.status, 200) << sorted.body;
    ASSERT_EQ(sorted.json["rows"].size(), 5u);
    EXPECT_EQ(sorted.json["rows"][0][1], 4);
    EXPECT_EQ(sorted.json["rows"][4][1], 0);
    EXPECT_EQ(sorted.json["offset"], 40);
  }

  // Bad input says what was wrong; a file that is no table is refused as such.
  struct Refusal {
    std::string query;
    int status;
    std::string code;
    std::string says;
  } refusals[] = {
      {"?sort=scroe", 400, "invalid_parameter", "there is no column 'scroe' to sort by (n, score)"},
      {"?order=sideways", 400, "invalid_parameter", "order must be asc or desc"},
      {"?offset=-1", 400, "invalid_parameter", "offset must be a whole number"},
      {"?limit=0", 400, "invalid_parameter", "limit"},
      {"?colour=red", 400, "unknown_parameter", "colour"},
  };
  for (const auto& refusal : refusals) {
    SCOPED_TRACE(refusal.query);
    auto refused = api.get(table_url["scores.csv"] + refusal.query);
    EXPECT_EQ(refused.status, refusal.status) << refused.body;
    EXPECT_EQ(refused.json["error"]["code"], refusal.code);
    EXPECT_NE(refused.json["error"]["message"].get<std::string>().find(refusal.says),
              std::string::npos)
        << refused.body;
  }
  auto not_a_table = api.get(table_url["meta.json"]);
  EXPECT_EQ(not_a_table.status, 400);
  EXPECT_EQ(not_a_table.json["error"]["code"], "not_a_table");
  EXPECT_EQ(server.stop(SIGTERM), 0);
}

}  // namespace
}  // namespace quarry::testing

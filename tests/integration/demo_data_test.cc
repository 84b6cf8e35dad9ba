// seed-demo: the demo tables have the reference cases' shape and are the same for the same seed.
#include "data/demo_data.h"

#include <gtest/gtest.h>

#include "data/query.h"
#include "postgres_environment.h"

namespace quarry::data {
namespace {

using quarry::testing::PostgresEnvironment;

std::string query_one(const std::string& sql) {
  auto result =
      query_database(PostgresEnvironment::get().server().reader_conninfo, sql, QueryOptions{});
  EXPECT_TRUE(result) << result.error().message;
  return result && !result->rows.empty() && result->rows[0][0] ? *result->rows[0][0] : "";
}

// A digest of both tables' contents.
std::string fingerprint() {
  return query_one(
      "SELECT md5((SELECT string_agg(t::text, ',' ORDER BY video_id, snapshot_date) "
      "FROM trending_videos t) || (SELECT string_agg(e::text, ',' ORDER BY session_id, "
      "event_time) FROM events e))");
}

TEST(DemoData, IsDeterministicGivenASeedAndHasTheReferenceShape) {
  const auto& admin = PostgresEnvironment::get().server().admin_conninfo;
  Progress progress("seed-demo", 3);
  auto first = seed_demo(admin, DemoOptions{1001, 7}, progress);
  ASSERT_TRUE(first) << first.error().message;
  EXPECT_EQ(first->videos, 6351u);
  EXPECT_EQ(first->events, 1001u);
  const std::string digest = fingerprint();

  auto again = seed_demo(admin, DemoOptions{1001, 7}, progress);
  ASSERT_TRUE(again) << again.error().message;
  EXPECT_EQ(fingerprint(), digest);
  EXPECT_EQ(query_one("SELECT count(*) FROM events"), "1001");
  EXPECT_EQ(query_one("SELECT count(DISTINCT category_name) FROM trending_videos"), "16");
  // Views only grow from one day to the next.
  EXPECT_EQ(query_one("SELECT count(*) FROM (SELECT views < lag(views) OVER (PARTITION BY "
                      "video_id ORDER BY snapshot_date) AS fell FROM trending_videos) d "
                      "WHERE fell"),
            "0");
  // Every session's events agree on its device and length.
  EXPECT_EQ(query_one("SELECT count(*) FROM (SELECT session_id FROM events GROUP BY session_id "
                      "HAVING count(DISTINCT device) > 1 OR count(DISTINCT "
                      "session_length_seconds) > 1) s"),
            "0");

  auto other = seed_demo(admin, DemoOptions{1001, 8}, progress);
  ASSERT_TRUE(other) << other.error().message;
  EXPECT_NE(fingerprint(), digest);
}

}  // namespace
}  // namespace quarry::data

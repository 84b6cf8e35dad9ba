#include "data/demo_data.h"

#include "data/connection.h"
#include "data/postgres_server.h"

namespace quarry::data {
namespace {

constexpr uint64_t kVideos = 6351;
constexpr uint64_t kEventsPerSession = 4;
constexpr uint64_t kSessionsPerBatch = 250'000;

struct Category {
  std::string_view name;
  int weight;        // per mille of the videos
  double log_views;  // mean of log(views on the first trending day)
};

// The categories of the YouTube trending data set, with roughly its mix.
constexpr Category kCategories[] = {
    {"Entertainment", 246, 12.4},
    {"Music", 130, 13.3},
    {"Howto & Style", 95, 11.9},
    {"Comedy", 85, 12.6},
    {"People & Blogs", 80, 11.8},
    {"News & Politics", 80, 11.2},
    {"Sports", 70, 12.0},
    {"Science & Technology", 60, 12.1},
    {"Film & Animation", 50, 12.5},
    {"Education", 40, 11.7},
    {"Pets & Animals", 23, 11.9},
    {"Gaming", 20, 12.2},
    {"Autos & Vehicles", 14, 11.5},
    {"Travel & Events", 5, 11.4},
    {"Nonprofits & Activism", 1, 11.6},
    {"Shows", 1, 12.0},
};

// pg_temp.quarry_uniform(i, stream): a uniform number in [0, 1) from a 64-bit hash of i, one
// independent stream per `stream`. Inlined by the planner, so it costs one hash call.
constexpr std::string_view kUniform = R"(
CREATE FUNCTION pg_temp.quarry_uniform(i bigint, stream bigint) RETURNS float8
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT ((hashint8extended(i, stream) >> 11) & 9007199254740991)::float8
             / 9007199254740992.0 $$;)";

std::string category_table() {
  std::string rows;
  int low = 0;
  for (const auto& category : kCategories) {
    rows += fmt::format("{}('{}', {}, {}, {})", rows.empty() ? "" : ", ", category.name,
                        low / 1000.0, (low + category.weight) / 1000.0, category.log_views);
    low += category.weight;
  }
  return fmt::format("(VALUES {}) AS c(name, low, high, log_views)", rows);
}

std::string videos_sql(uint64_t seed) {
  const uint64_t s = seed * 100;
  return fmt::format(R"(
CREATE TABLE trending_videos (
  video_id text NOT NULL,
  title text NOT NULL,
  category_name text NOT NULL,
  snapshot_date date NOT NULL,
  views bigint NOT NULL,
  PRIMARY KEY (video_id, snapshot_date)
);
COMMENT ON TABLE trending_videos IS
  'Trending videos: one row per video per day it was on the trending list (demo data)';
INSERT INTO trending_videos
SELECT v.video_id,
       v.title,
       c.name,
       v.first_day + d,
       (v.base_views * (1 + 2.5 * v.growth * ln(1 + d)))::bigint + d
FROM (
  SELECT n,
         translate(encode(int8send(hashint8extended(n, {0})), 'base64'), '+/=', '-_') AS video_id,
         (ARRAY['Official', 'Amazing', 'My First', 'The Best', 'Reacting to', 'Inside',
                'How I Made', 'Live:', 'Behind the Scenes of', 'Why We Love'])
           [1 + floor(pg_temp.quarry_uniform(n, {1}) * 10)::int]
         || ' ' ||
         (ARRAY['Music Video', 'Trailer', 'Recipe', 'Highlights', 'Pokémon Cards', 'Café Tour',
                'Science Fair', 'Road Trip', 'Interview', 'Unboxing', 'Stand-up Set',
                'Election Night', 'Puppy', 'Speedrun'])
           [1 + floor(pg_temp.quarry_uniform(n, {2}) * 14)::int]
         || ' #' || n AS title,
         pg_temp.quarry_uniform(n, {3}) AS category_draw,
         date '2017-11-14' + floor(pg_temp.quarry_uniform(n, {4}) * 205)::int AS first_day,
         least(30, 1 + floor(-ln(1 - pg_temp.quarry_uniform(n, {5})) * 5.5))::int AS days,
         sqrt(-2 * ln(1 - pg_temp.quarry_uniform(n, {6})))
           * cos(2 * pi() * pg_temp.quarry_uniform(n, {7})) AS normal,
         0.05 + 0.4 * pg_temp.quarry_uniform(n, {8}) AS growth
  FROM generate_series(1, {9}) AS n
) AS raw
JOIN {10} ON raw.category_draw >= c.low AND raw.category_draw < c.high
CROSS JOIN LATERAL (SELECT raw.video_id, raw.title, raw.first_day, raw.growth,
                           exp(c.log_views + 1.2 * raw.normal) AS base_views) AS v
CROSS JOIN LATERAL generate_series(0, raw.days - 1) AS d;
)",
                     s + 1, s + 2, s + 3, s + 4, s + 5, s + 6, s + 7, s + 8, s + 9, kVideos,
                     category_table());
}

constexpr std::string_view kEventsTable = R"(
CREATE TABLE events (
  device text NOT NULL,
  session_id bigint NOT NULL,
  event_time timestamptz NOT NULL,
  session_length_seconds double precision NOT NULL
);
COMMENT ON TABLE events IS
  'App events, four per session; session_length_seconds is the length of the whole session (demo data)';
)";

// Sessions [first, last]: each has a device, a start in the first 90 days of 2024 and a
// log-normal length whose median depends on the device; its events are spread over it.
std::string events_sql(uint64_t seed, uint64_t first, uint64_t last, uint64_t total_events) {
  const uint64_t s = seed * 100 + 50;
  return fmt::format(R"(
INSERT INTO events
SELECT device, session, start + make_interval(secs => k * length / {0}), length
FROM (
  SELECT session,
         CASE WHEN draw < 0.45 THEN 'android' WHEN draw < 0.80 THEN 'ios'
              WHEN draw < 0.95 THEN 'web' ELSE 'desktop' END AS device,
         timestamptz '2024-01-01 00:00:00+00'
           + make_interval(secs => pg_temp.quarry_uniform(session, {1}) * 7776000) AS start,
         round(exp(CASE WHEN draw < 0.45 THEN 5.0 WHEN draw < 0.80 THEN 5.3
                        WHEN draw < 0.95 THEN 4.6 ELSE 5.8 END
                   + 0.9 * sqrt(-2 * ln(1 - pg_temp.quarry_uniform(session, {2})))
                         * cos(2 * pi() * pg_temp.quarry_uniform(session, {3}))) * 10) / 10
           AS length
  FROM (SELECT session, pg_temp.quarry_uniform(session, {4}) AS draw
        FROM generate_series({5}::bigint, {6}::bigint) AS session) AS drawn
) AS sessions
CROSS JOIN generate_series(0, {0} - 1) AS k
WHERE (session - 1) * {0} + k < {7};
)",
                     kEventsPerSession, s + 1, s + 2, s + 3, s + 4, first, last, total_events);
}

}  // namespace

Result<DemoSummary> seed_demo(const std::string& admin_conninfo, const DemoOptions& options,
                              Progress& progress) {
  ASSIGN_OR_RETURN(auto connection, Connection::open(admin_conninfo));
  RETURN_IF_ERROR(connection.exec_script(kUniform));
  // One transaction: the old tables stay until the new ones are complete, and tables created
  // in the loading transaction need no WAL (wal_level = minimal on the private server).
  RETURN_IF_ERROR(connection.exec_script("BEGIN"));
  DemoSummary summary;

  progress.step(fmt::format("trending_videos: {} videos", kVideos));
  RETURN_IF_ERROR(connection.exec_script("DROP TABLE IF EXISTS trending_videos"));
  RETURN_IF_ERROR(
      with_context(connection.exec_script(videos_sql(options.seed)), "trending_videos"));
  ASSIGN_OR_RETURN(
      auto counted,
      connection.exec("SELECT count(*), count(DISTINCT video_id) FROM trending_videos"));
  summary.video_rows = std::stoull(PQgetvalue(counted.get(), 0, 0));
  summary.videos = std::stoull(PQgetvalue(counted.get(), 0, 1));

  progress.step(fmt::format("events: {} rows", options.events));
  RETURN_IF_ERROR(connection.exec_script("DROP TABLE IF EXISTS events"));
  RETURN_IF_ERROR(connection.exec_script(kEventsTable));
  const uint64_t sessions = (options.events + kEventsPerSession - 1) / kEventsPerSession;
  for (uint64_t first = 1; first <= sessions; first += kSessionsPerBatch) {
    const uint64_t last = std::min(sessions, first + kSessionsPerBatch - 1);
    RETURN_IF_ERROR(with_context(
        connection.exec_script(events_sql(options.seed, first, last, options.events)), "events"));
    progress.detail(fmt::format("events: {} of {} rows",
                                std::min(options.events, last * kEventsPerSession),
                                options.events));
  }
  summary.events = options.events;

  progress.step("grants and statistics");
  // The read-only role of the private server reads them; an external server's roles are its
  // owner's business.
  RETURN_IF_ERROR(connection.exec_script(fmt::format(R"(
DO $$ BEGIN
  IF EXISTS (SELECT FROM pg_roles WHERE rolname = '{0}') THEN
    GRANT SELECT ON trending_videos, events TO {0};
  END IF;
END $$;
COMMIT;
ANALYZE trending_videos;
ANALYZE events;)",
                                                     kReaderRole)));
  return summary;
}

}  // namespace quarry::data

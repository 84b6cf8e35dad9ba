// `quarry db seed-demo`: the demo data of the seed's two reference cases, made inside
// PostgreSQL (generate_series and hash-based pseudo-random numbers), deterministic given a
// seed:
//   trending_videos(video_id, title, category_name, snapshot_date, views): 6,351 videos of
//     the YouTube trending categories, one row per video per day it trended, views rising
//     day by day (case 1: median and P90 of peak views per category).
//   events(device, session_id, event_time, session_length_seconds): app events, four per
//     session, 20 million rows by default (case 2: typical session length per device).
#pragma once

#include <string>

#include "common/error.h"
#include "common/progress.h"

namespace quarry::data {

struct DemoOptions {
  uint64_t events = 20'000'000;
  uint64_t seed = 42;
};

struct DemoSummary {
  uint64_t videos = 0;
  uint64_t video_rows = 0;
  uint64_t events = 0;
};

// Replaces both tables in one transaction: on failure the old ones are still there.
Result<DemoSummary> seed_demo(const std::string& admin_conninfo, const DemoOptions& options,
                              Progress& progress);

}  // namespace quarry::data

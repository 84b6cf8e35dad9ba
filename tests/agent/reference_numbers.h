// The seed's reference cases are judged by their numbers: these read the tables the scenarios'
// code prints and compute the same statistics in PostgreSQL itself, for the agent's tests and
// the API's.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace quarry::testing {

// "name\tnumber\tnumber..." lines, as the scenarios' code prints its results: name -> numbers.
std::map<std::string, std::vector<double>> parse_table(const std::string& text);

// The same statistics computed by PostgreSQL (the test binary's own): the first column is the
// name, the others numbers.
std::map<std::string, std::vector<double>> sql_table(const std::string& sql);

// Both tables have the same names and, within rounding, the same numbers.
void expect_same_numbers(const std::map<std::string, std::vector<double>>& reported,
                         const std::map<std::string, std::vector<double>>& expected);

// The SQL of the two reference cases: median, P90 and count of peak views per video by
// category; median session length by device.
inline constexpr const char* kPeakViewsSql =
    "SELECT category_name, percentile_cont(0.5) WITHIN GROUP (ORDER BY peak), "
    "percentile_cont(0.9) WITHIN GROUP (ORDER BY peak), count(*) FROM (SELECT "
    "category_name, video_id, max(views) AS peak FROM trending_videos GROUP BY 1, 2) "
    "videos GROUP BY 1";
inline constexpr const char* kSessionLengthSql =
    "SELECT device, percentile_cont(0.5) WITHIN GROUP (ORDER BY session_length_seconds) FROM "
    "(SELECT DISTINCT device, session_id, session_length_seconds FROM events) sessions GROUP BY "
    "device";

}  // namespace quarry::testing

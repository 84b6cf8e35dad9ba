#include "server/api_json.h"

#include <fmt/format.h>

#include "conversation/history_json.h"

namespace quarry::server {

std::string artifact_url(int64_t id) {
  return fmt::format("/api/v1/artifacts/{}", id);
}

nlohmann::json artifact_json(const conversation::Artifact& artifact) {
  auto json = conversation::to_json(artifact);
  json["url"] = artifact_url(artifact.id);
  return json;
}

nlohmann::json capacity_json(const capacity::Stats& stats) {
  const auto& limits = stats.limits;
  nlohmann::json accounts = nlohmann::json::array();
  for (const auto& account : stats.accounts) {
    accounts.push_back({{"name", account.name},
                        {"max_sandboxes", account.max_sandboxes},
                        {"in_use", account.in_use}});
  }
  return {{"limits",
           {{"max_sandboxes", limits.max_sandboxes},
            {"max_per_user", limits.max_per_user},
            {"max_queue", limits.max_queue},
            {"queue_timeout_ms", limits.queue_timeout.count()},
            {"warm_min_idle", limits.warm_min_idle}}},
          {"accounts", accounts},
          {"sandboxes",
           {{"warm", stats.warm},
            {"starting", stats.starting},
            {"busy", stats.busy},
            {"idle", stats.idle},
            {"deleting", stats.deleting},
            {"elsewhere", stats.elsewhere}}},
          {"queue", {{"waiting", stats.waiting}, {"longest_wait_ms", stats.longest_wait_ms}}},
          {"waits", {{"p50_ms", stats.wait_p50_ms}, {"p99_ms", stats.wait_p99_ms}}},
          {"starts",
           {{"cold", stats.cold_starts},
            {"warm", stats.warm_starts},
            {"cold_p50_ms", stats.cold_p50_ms},
            {"warm_p50_ms", stats.warm_p50_ms}}},
          {"evictions", stats.evictions},
          {"timeouts", stats.timeouts},
          {"refused", stats.refused},
          {"dead_warm", stats.dead_warm}};
}

}  // namespace quarry::server

// Fuzzes parse_config with config.yml text. Besides crashes (an exception escaping is one) it
// checks that what was accepted keeps the rules the rest of quarry relies on.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "check.h"
#include "common/url.h"
#include "config/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto config = quarry::parse_config(text, "config.yml");
  if (!config) return 0;
  check(quarry::validate_resources(config->sandbox.resources).has_value(),
        "accepted resources that validate_resources refuses");
  check(config->sandbox.exec_timeout.count() > 0 && config->sandbox.idle_timeout.count() > 0 &&
            config->database.statement_timeout.count() > 0 && config->model.timeout.count() > 0 &&
            config->model.connect_timeout.count() > 0 &&
            config->server.session_lifetime.count() > 0,
        "accepted a duration that must be positive but is not");
  check(config->server.shutdown_grace.count() >= 0, "accepted a negative shutdown_grace");
  check(config->sandbox.data_dir != config->sandbox.output_dir, "data_dir equals output_dir");
  check(quarry::parse_url(config->model.base_url).has_value(), "accepted a bad model.base_url");
  return 0;
}

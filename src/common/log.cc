#include "common/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>

namespace quarry {

Result<void> setup_logging(std::string_view level_name) {
  auto level = spdlog::level::from_str(std::string(level_name));
  if (level == spdlog::level::off && level_name != "off") {
    return make_error(ErrorCode::kInvalidArgument,
                      "unknown log level '{}' (use trace, debug, info, warn, error or off)",
                      level_name);
  }
  auto logger = spdlog::stderr_color_mt("quarry");
  logger->set_pattern("%^%Y-%m-%d %H:%M:%S.%e %l%$ %v");
  logger->set_level(level);
  spdlog::set_default_logger(logger);
  return {};
}

}  // namespace quarry

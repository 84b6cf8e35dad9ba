#include "common/json.h"

namespace quarry {

namespace {

struct TooDeep {};

}  // namespace

Result<nlohmann::json> parse_json(std::string_view text) {
  auto refuse_deep = [](int depth, nlohmann::json::parse_event_t, nlohmann::json&) {
    if (depth > kMaxJsonDepth) throw TooDeep{};
    return true;
  };
  try {
    return nlohmann::json::parse(text, refuse_deep);
  } catch (const TooDeep&) {
    return make_error(ErrorCode::kInvalidArgument, "it nests deeper than {} levels", kMaxJsonDepth);
  } catch (const nlohmann::json::exception& error) {
    // "[json.exception.parse_error.101] parse error at line 1, column 9: ..." without the tag.
    std::string what = error.what();
    if (auto tag = what.find("] "); tag != std::string::npos) what = what.substr(tag + 2);
    return make_error(ErrorCode::kInvalidArgument, "{}", what);
  }
}

nlohmann::json parse_json_or_discarded(std::string_view text) {
  auto parsed = parse_json(text);
  return parsed ? std::move(*parsed) : nlohmann::json(nlohmann::json::value_t::discarded);
}

}  // namespace quarry

// A request's JSON body, read strictly: it must be a JSON object sent as application/json,
// each field of the right type, and no field the route does not know. Every refusal is a 400
// (415 for another media type) that names the field and says what to send instead.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "server/api_error.h"

namespace quarry::server {

class JsonBody {
 public:
  // `content_type` is the request's header; an empty body reads as {} (every field absent).
  // A field not in `fields` is refused at once, with the fields that are allowed.
  static ApiResult<JsonBody> parse(std::string_view body, std::string_view content_type,
                                   std::initializer_list<std::string_view> fields);

  // A string field; `max_bytes` bounds its length.
  ApiResult<std::string> string(std::string_view name, size_t max_bytes = 1 << 20) const;
  ApiResult<std::optional<std::string>> optional_string(std::string_view name,
                                                        size_t max_bytes = 1 << 20) const;
  // An object field as it is (absent or null: nullopt), for the caller to read.
  ApiResult<std::optional<nlohmann::json>> optional_object(std::string_view name) const;
  // A list of strings (empty when absent): at most `max_items`, each of at most `max_bytes`.
  ApiResult<std::vector<std::string>> string_list(std::string_view name, size_t max_items,
                                                  size_t max_bytes) const;

 private:
  explicit JsonBody(nlohmann::json object) : object_(std::move(object)) {}

  nlohmann::json object_;
};

}  // namespace quarry::server

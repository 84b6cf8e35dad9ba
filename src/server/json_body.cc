#include "server/json_body.h"

#include <algorithm>
#include <boost/beast/core/string.hpp>

#include "common/json.h"

namespace quarry::server {

ApiResult<JsonBody> JsonBody::parse(std::string_view body, std::string_view content_type,
                                    std::initializer_list<std::string_view> fields) {
  const auto media = content_type.substr(0, content_type.find(';'));
  if (!body.empty() && !boost::beast::iequals(boost::beast::string_view(media.data(), media.size()),
                                              "application/json")) {
    return api_error(415, "unsupported_media_type",
                     "the body must be JSON sent as 'Content-Type: application/json', not '{}'",
                     content_type.empty() ? "(none)" : content_type);
  }
  if (body.find_first_not_of(" \t\r\n") == std::string_view::npos) {
    return JsonBody(nlohmann::json::object());
  }
  auto object = parse_json(body);
  if (!object) {
    return api_error(400, "invalid_json", "the body is not valid JSON: {}", object.error().message);
  }
  if (!object->is_object()) {
    return api_error(400, "invalid_json", "the body must be a JSON object, not {}",
                     object->type_name());
  }
  for (const auto& [name, value] : object->items()) {
    if (std::find(fields.begin(), fields.end(), name) == fields.end()) {
      return api_error(
          400, "unknown_field", "unknown field '{}' (the fields here are: {})", name,
          fields.size() == 0 ? std::string("none") : fmt::format("{}", fmt::join(fields, ", ")));
    }
  }
  return JsonBody(std::move(*object));
}

ApiResult<std::optional<std::string>> JsonBody::optional_string(std::string_view name,
                                                                size_t max_bytes) const {
  auto value = object_.find(name);
  if (value == object_.end() || value->is_null()) return std::nullopt;
  if (!value->is_string()) {
    return api_error(400, "invalid_field", "'{}' must be a string, not {}", name,
                     value->type_name());
  }
  const auto& text = value->get_ref<const std::string&>();
  if (text.size() > max_bytes) {
    return api_error(400, "invalid_field", "'{}' is {} bytes; at most {} are allowed", name,
                     text.size(), max_bytes);
  }
  return text;
}

ApiResult<std::optional<nlohmann::json>> JsonBody::optional_object(std::string_view name) const {
  auto value = object_.find(name);
  if (value == object_.end() || value->is_null()) return std::nullopt;
  if (!value->is_object()) {
    return api_error(400, "invalid_field", "'{}' must be an object, not {}", name,
                     value->type_name());
  }
  return *value;
}

ApiResult<std::vector<std::string>> JsonBody::string_list(std::string_view name, size_t max_items,
                                                          size_t max_bytes) const {
  auto value = object_.find(name);
  if (value == object_.end() || value->is_null()) return std::vector<std::string>{};
  if (!value->is_array()) {
    return api_error(400, "invalid_field", "'{}' must be a list of strings, not {}", name,
                     value->type_name());
  }
  if (value->size() > max_items) {
    return api_error(400, "invalid_field", "'{}' has {} items; at most {} are allowed", name,
                     value->size(), max_items);
  }
  std::vector<std::string> items;
  for (size_t index = 0; index < value->size(); ++index) {
    const auto& item = (*value)[index];
    if (!item.is_string()) {
      return api_error(400, "invalid_field", "'{}[{}]' must be a string, not {}", name, index,
                       item.type_name());
    }
    const auto& text = item.get_ref<const std::string&>();
    if (text.size() > max_bytes) {
      return api_error(400, "invalid_field", "'{}[{}]' is {} bytes; at most {} are allowed", name,
                       index, text.size(), max_bytes);
    }
    items.push_back(text);
  }
  return items;
}

ApiResult<std::string> JsonBody::string(std::string_view name, size_t max_bytes) const {
  auto value = optional_string(name, max_bytes);
  if (!value) return std::unexpected(value.error());
  if (!*value) return api_error(400, "missing_field", "'{}' is required", name);
  return std::move(**value);
}

}  // namespace quarry::server

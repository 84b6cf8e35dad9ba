#include "server/openapi.h"

#include <yaml-cpp/yaml.h>

namespace quarry::server {
namespace {

// A YAML node as JSON: a quoted scalar stays a string; a plain one is read as null, a boolean
// or a number when it is one, as YAML's core schema reads it.
nlohmann::json to_json(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Map: {
      nlohmann::json object = nlohmann::json::object();
      for (const auto& entry : node)
        object[entry.first.as<std::string>()] = to_json(entry.second);
      return object;
    }
    case YAML::NodeType::Sequence: {
      nlohmann::json array = nlohmann::json::array();
      for (const auto& item : node)
        array.push_back(to_json(item));
      return array;
    }
    case YAML::NodeType::Scalar: {
      const std::string& text = node.Scalar();
      if (node.Tag() == "!") return text;  // quoted
      if (text == "null" || text == "~") return nullptr;
      if (text == "true") return true;
      if (text == "false") return false;
      if (auto number = nlohmann::json::parse(text, nullptr, false);
          number.is_number() && !text.empty() && text.find_first_of(" \t") == std::string::npos) {
        return number;
      }
      return text;
    }
    case YAML::NodeType::Null:
    case YAML::NodeType::Undefined:
      break;
  }
  return nullptr;
}

}  // namespace

Result<nlohmann::json> openapi_document() {
  try {
    return to_json(YAML::Load(std::string(openapi_yaml())));
  } catch (const YAML::Exception& error) {
    return make_error(ErrorCode::kInternal, "openapi.yaml:{}: {}", error.mark.line + 1, error.msg);
  }
}

}  // namespace quarry::server

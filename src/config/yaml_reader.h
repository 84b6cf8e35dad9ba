// Reading YAML into typed values with errors that name the file, the line and the key's
// dotted path ("config.yml:12: sandbox.memory: ..."), so a user can find and fix the setting.
// Shared by config.yml and the scripted model's scenario files.
#pragma once

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <charconv>
#include <concepts>
#include <initializer_list>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.h"
#include "common/units.h"

namespace quarry {

class YamlReader {
 public:
  // `source` names the document in errors, usually its file path.
  explicit YamlReader(std::string_view source) : source_(source) {}

  // Parses `text`; a syntax error names the line and column.
  Result<YAML::Node> load(std::string_view text) const;

  template <typename... Args>
  std::unexpected<Error> fail(const YAML::Node& node, std::string_view path,
                              fmt::format_string<Args...> format, Args&&... args) const {
    return make_error(ErrorCode::kInvalidArgument, "{}: {}: {}", where(node, path), path,
                      fmt::format(format, std::forward<Args>(args)...));
  }

  // Fails on a node that is not a mapping, or on a key not in `known`. A null node (an
  // empty section) is an empty mapping. Keeps the line of each key, for errors about an empty
  // value, which yaml-cpp marks where the next token is (often a later line).
  Result<void> check_map(const YAML::Node& node, std::string_view path,
                         std::initializer_list<std::string_view> known) const;
  // A mapping whose keys are names of the user's (labels, accounts): each a single value, and
  // none twice. yaml-cpp keeps both of two equal keys, and a reader would take one silently.
  Result<void> check_names(const YAML::Node& node, std::string_view path) const;

  Result<std::string> scalar(const YAML::Node& node, std::string_view path) const;

  // A list of single values, e.g. [a, b].
  Result<std::vector<std::string>> scalar_list(const YAML::Node& node, std::string_view path) const;

  // `true` or `false`.
  Result<bool> boolean(const YAML::Node& node, std::string_view path) const;

  Result<double> number(const YAML::Node& node, std::string_view path) const;

  // A duration such as 30s or 250ms (parse_duration); zero is allowed.
  Result<Duration> duration(const YAML::Node& node, std::string_view path) const;

  // A whole number from `min` to `max`.
  template <std::integral T>
  Result<T> whole_number(const YAML::Node& node, std::string_view path, T min, T max) const {
    ASSIGN_OR_RETURN(auto text, scalar(node, path));
    T value{};
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (ec != std::errc() || end != text.data() + text.size()) {
      return fail(node, path, "'{}' is not a whole number", text);
    }
    if (value < min || value > max) {
      return fail(node, path, "{} is out of range (allowed: {} to {})", value, min, max);
    }
    return value;
  }

 private:
  // "config.yml:12", the node's file and line; an empty value's is its key's.
  std::string where(const YAML::Node& node, std::string_view path = {}) const;

  std::string source_;
  // The line of each key check_map saw, by its dotted path.
  mutable std::map<std::string, int, std::less<>> key_lines_;
};

}  // namespace quarry

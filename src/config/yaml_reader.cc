#include "config/yaml_reader.h"

#include <fmt/ranges.h>

#include <algorithm>

namespace quarry {

namespace {

// The character at a YAML mark's line and column, or '\0'.
char at_mark(std::string_view text, const YAML::Mark& mark) {
  size_t offset = 0;
  for (int line = 0; line < mark.line; ++line) {
    offset = text.find('\n', offset);
    if (offset == std::string_view::npos) return '\0';
    ++offset;
  }
  if (mark.column < 0) return '\0';
  offset += static_cast<size_t>(mark.column);
  return offset < text.size() ? text[offset] : '\0';
}

}  // namespace

Result<YAML::Node> YamlReader::load(std::string_view text) const {
  try {
    return YAML::Load(std::string(text));
  } catch (const YAML::Exception& error) {
    // A value starting with '*' is an alias in YAML: an unquoted *.example.com reads as a
    // reference to an anchor named ".example.com", and yaml-cpp's words do not say to quote it.
    const std::string_view hint =
        at_mark(text, error.mark) == '*'
            ? " (a value starting with * must be quoted, e.g. \"*.example.com\")"
            : "";
    return make_error(ErrorCode::kInvalidArgument, "{}:{}:{}: not valid YAML: {}{}", source_,
                      error.mark.line + 1, error.mark.column + 1, error.msg, hint);
  }
}

std::string YamlReader::where(const YAML::Node& node, std::string_view path) const {
  int line = node.Mark().line;
  if (node.IsNull()) {
    if (auto key = key_lines_.find(path); key != key_lines_.end()) line = key->second;
  }
  std::string text(source_);
  if (line >= 0) text += fmt::format(":{}", line + 1);
  return text;
}

Result<void> YamlReader::check_map(const YAML::Node& node, std::string_view path,
                                   std::initializer_list<std::string_view> known) const {
  if (node.IsNull()) return {};
  if (!node.IsMap() && path.empty()) {
    return make_error(ErrorCode::kInvalidArgument,
                      "{}: the file must be a mapping of sections ({}:)", where(node),
                      fmt::join(known, ":, "));
  }
  if (!node.IsMap()) return fail(node, path, "must be a mapping of keys to values");
  for (const auto& entry : node) {
    // A key may be any node in YAML ("? [a, b]: c"); ours are names.
    if (!entry.first.IsScalar()) {
      return fail(entry.first, path.empty() ? "top level" : path,
                  "has a key that is not a name (known keys here: {})", fmt::join(known, ", "));
    }
    const std::string& key = entry.first.Scalar();
    const std::string key_path = path.empty() ? key : fmt::format("{}.{}", path, key);
    if (std::find(known.begin(), known.end(), key) == known.end()) {
      return fail(entry.first, key_path, "unknown key (known keys here: {})",
                  fmt::join(known, ", "));
    }
    key_lines_.try_emplace(key_path, entry.first.Mark().line);
  }
  // node[key] finds the first of two equal keys: the second would be neither read nor checked.
  return check_names(node, path);
}

Result<void> YamlReader::check_names(const YAML::Node& node, std::string_view path) const {
  std::vector<std::pair<std::string, int>> seen;  // key, line
  for (const auto& entry : node) {
    if (!entry.first.IsScalar()) return fail(entry.first, path, "has a key that is not a name");
    const std::string& key = entry.first.Scalar();
    auto first = std::find_if(seen.begin(), seen.end(),
                              [&](const auto& earlier) { return earlier.first == key; });
    if (first != seen.end()) {
      return fail(entry.first, path.empty() ? key : fmt::format("{}.{}", path, key),
                  "set twice (first on line {}); keep one", first->second + 1);
    }
    seen.emplace_back(key, entry.first.Mark().line);
  }
  return {};
}

Result<std::string> YamlReader::scalar(const YAML::Node& node, std::string_view path) const {
  // "key:" with nothing after it, or "key: ~".
  if (node.IsNull()) return fail(node, path, "is empty: give it a value, or remove it");
  if (!node.IsScalar()) return fail(node, path, "must be a single value");
  return node.Scalar();
}

Result<std::vector<std::string>> YamlReader::scalar_list(const YAML::Node& node,
                                                         std::string_view path) const {
  if (!node.IsSequence()) return fail(node, path, "must be a list, e.g. [a, b]");
  std::vector<std::string> values;
  for (size_t i = 0; i < node.size(); ++i) {
    ASSIGN_OR_RETURN(auto value, scalar(node[i], fmt::format("{}[{}]", path, i)));
    values.push_back(std::move(value));
  }
  return values;
}

Result<bool> YamlReader::boolean(const YAML::Node& node, std::string_view path) const {
  ASSIGN_OR_RETURN(auto text, scalar(node, path));
  if (text == "true") return true;
  if (text == "false") return false;
  return fail(node, path, "'{}' must be true or false", text);
}

Result<double> YamlReader::number(const YAML::Node& node, std::string_view path) const {
  ASSIGN_OR_RETURN(auto text, scalar(node, path));
  double value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size()) {
    return fail(node, path, "'{}' is not a number", text);
  }
  return value;
}

Result<Duration> YamlReader::duration(const YAML::Node& node, std::string_view path) const {
  ASSIGN_OR_RETURN(auto text, scalar(node, path));
  auto value = parse_duration(text);
  if (!value) return fail(node, path, "{}", value.error().message);
  return *value;
}

}  // namespace quarry

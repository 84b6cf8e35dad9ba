#include "common/text.h"

#include <algorithm>
#include <cctype>
#include <sstream>

namespace quarry {

std::vector<std::string> words(std::string_view text) {
  std::vector<std::string> out;
  std::istringstream stream{std::string(text)};
  for (std::string word; stream >> word;)
    out.push_back(word);
  return out;
}

std::string ascii_lower(std::string_view text) {
  std::string out(text);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

std::string shell_quote(std::string_view word) {
  const bool plain = !word.empty() && word.find_first_not_of(
                                          "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                          "0123456789-_./=:,+@%") == std::string_view::npos;
  if (plain) return std::string(word);
  std::string out = "'";
  for (char c : word)
    out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

namespace {

bool continues_a_character(char c) {
  return (static_cast<unsigned char>(c) & 0xC0) == 0x80;
}

}  // namespace

std::string_view utf8_head(std::string_view text, size_t bytes) {
  if (text.size() <= bytes) return text;
  size_t cut = bytes;
  while (cut > 0 && continues_a_character(text[cut]))
    --cut;
  return text.substr(0, cut);
}

std::string_view utf8_tail(std::string_view text, size_t bytes) {
  if (text.size() <= bytes) return text;
  size_t start = text.size() - bytes;
  while (start < text.size() && continues_a_character(text[start]))
    ++start;
  return text.substr(start);
}

std::string_view trim_blanks(std::string_view text) {
  while (!text.empty() && (text.front() == ' ' || text.front() == '\t'))
    text.remove_prefix(1);
  while (!text.empty() && (text.back() == ' ' || text.back() == '\t'))
    text.remove_suffix(1);
  return text;
}

}  // namespace quarry

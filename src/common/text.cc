#include "common/text.h"

#include <sstream>

namespace quarry {

std::vector<std::string> words(std::string_view text) {
  std::vector<std::string> out;
  std::istringstream stream{std::string(text)};
  for (std::string word; stream >> word;)
    out.push_back(word);
  return out;
}

}  // namespace quarry

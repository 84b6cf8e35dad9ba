// Small text helpers shared by parsers of tool output and lock files.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace quarry {

// The whitespace-separated words of `text`, in order.
std::vector<std::string> words(std::string_view text);

}  // namespace quarry

// Small text helpers shared by parsers (header fields, host names, query values).
#pragma once

#include <string>
#include <string_view>

namespace quarry {

// `text` with its ASCII letters in lower case (header names, host names: no locale).
std::string ascii_lower(std::string_view text);

// `text` without the spaces and tabs at either end (an HTTP header's value).
std::string_view trim_blanks(std::string_view text);

}  // namespace quarry

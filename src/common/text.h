// Small text helpers shared by parsers (tool output, lock files, header fields, host names).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace quarry {

// The whitespace-separated words of `text`, in order.
std::vector<std::string> words(std::string_view text);

// `text` with its ASCII letters in lower case (header names, host names: no locale).
std::string ascii_lower(std::string_view text);

// `text` without the spaces and tabs at either end (an HTTP header's value).
std::string_view trim_blanks(std::string_view text);

// The longest start of `text` of at most `bytes` bytes, and the longest end of it, that do not
// cut a UTF-8 character in two (text cut for the model or a title stays valid UTF-8).
std::string_view utf8_head(std::string_view text, size_t bytes);
std::string_view utf8_tail(std::string_view text, size_t bytes);

// `word` as one word of a POSIX shell's command line: as it is when it has only characters the
// shell takes literally, else in single quotes (a quote inside as '\'').
std::string shell_quote(std::string_view word);

}  // namespace quarry

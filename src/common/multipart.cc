#include "common/multipart.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>

#include "common/random_id.h"

namespace quarry {
namespace {

std::string lower(std::string_view text) {
  std::string out(text);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

std::string_view trim(std::string_view text) {
  while (!text.empty() && (text.front() == ' ' || text.front() == '\t'))
    text.remove_prefix(1);
  while (!text.empty() && (text.back() == ' ' || text.back() == '\t'))
    text.remove_suffix(1);
  return text;
}

// A quoted string's content with its backslash escapes undone, or a token as it is.
std::string unquote(std::string_view value) {
  if (value.size() < 2 || value.front() != '"' || value.back() != '"') return std::string(value);
  value = value.substr(1, value.size() - 2);
  std::string out;
  for (size_t i = 0; i < value.size(); ++i) {
    if (value[i] == '\\' && i + 1 < value.size()) ++i;
    out += value[i];
  }
  return out;
}

std::string quote(std::string_view value) {
  std::string out = "\"";
  for (char c : value) {
    if (c == '"' || c == '\\') out += '\\';
    // A line break would end the header: percent-encode it as browsers do.
    if (c == '\r') {
      out += "%0D";
    } else if (c == '\n') {
      out += "%0A";
    } else {
      out += c;
    }
  }
  return out + "\"";
}

// The parameters after the first ';' of a header value: name=value pairs, names lower-cased.
// A ';' inside a quoted value does not split it.
std::vector<std::pair<std::string, std::string>> parameters(std::string_view value) {
  std::vector<std::pair<std::string, std::string>> out;
  std::vector<std::string_view> pieces;
  bool quoted = false;
  size_t start = 0;
  for (size_t i = 0; i < value.size(); ++i) {
    if (value[i] == '\\' && quoted) {
      ++i;
    } else if (value[i] == '"') {
      quoted = !quoted;
    } else if (value[i] == ';' && !quoted) {
      pieces.push_back(value.substr(start, i - start));
      start = i + 1;
    }
  }
  pieces.push_back(value.substr(start));
  for (size_t i = 1; i < pieces.size(); ++i) {
    const auto piece = trim(pieces[i]);
    const size_t equals = piece.find('=');
    if (equals == std::string_view::npos) continue;
    out.emplace_back(lower(trim(piece.substr(0, equals))), unquote(trim(piece.substr(equals + 1))));
  }
  return out;
}

}  // namespace

std::string random_multipart_boundary() {
  return "quarry-" + random_id() + random_id();
}

std::string write_multipart(const std::vector<MultipartPart>& parts, std::string_view boundary) {
  std::string body;
  for (const auto& part : parts) {
    body +=
        fmt::format("--{}\r\nContent-Disposition: form-data; name={}", boundary, quote(part.name));
    if (!part.filename.empty()) body += "; filename=" + quote(part.filename);
    body += "\r\n";
    if (!part.content_type.empty()) body += "Content-Type: " + part.content_type + "\r\n";
    body += "\r\n";
    body += part.data;
    body += "\r\n";
  }
  body += fmt::format("--{}--\r\n", boundary);
  return body;
}

Result<std::string> multipart_boundary(std::string_view content_type) {
  const std::string type = lower(trim(content_type.substr(0, content_type.find(';'))));
  if (!type.starts_with("multipart/")) {
    return make_error(ErrorCode::kInvalidArgument, "'{}' is not a multipart content type",
                      content_type);
  }
  for (const auto& [name, value] : parameters(content_type)) {
    if (name != "boundary") continue;
    // RFC 2046: 1 to 70 characters.
    if (value.empty() || value.size() > 70) break;
    return value;
  }
  return make_error(ErrorCode::kInvalidArgument,
                    "the content type '{}' has no boundary of 1 to 70 characters", content_type);
}

Result<std::vector<MultipartPart>> parse_multipart(std::string_view body, std::string_view boundary,
                                                   size_t max_parts) {
  const std::string delimiter = fmt::format("--{}", boundary);
  // The first delimiter may follow a preamble; each later one starts a line.
  size_t at = body.starts_with(delimiter) ? 0 : body.find("\r\n" + delimiter);
  if (at == std::string_view::npos) {
    return make_error(ErrorCode::kInvalidArgument,
                      "the body has no '{}' line: not multipart with that boundary", delimiter);
  }
  if (at != 0) at += 2;
  std::vector<MultipartPart> parts;
  for (;;) {
    at += delimiter.size();
    if (body.substr(at).starts_with("--")) return parts;  // the closing delimiter
    // The rest of the delimiter's line (transport padding), then the part's headers.
    const size_t line_end = body.find("\r\n", at);
    if (line_end == std::string_view::npos) {
      return make_error(ErrorCode::kInvalidArgument,
                        "the body ends inside part {} (no closing '{}--')", parts.size() + 1,
                        delimiter);
    }
    const size_t headers_end = body.find("\r\n\r\n", line_end);
    const size_t next = body.find("\r\n" + delimiter, line_end);
    if (next == std::string_view::npos) {
      return make_error(ErrorCode::kInvalidArgument,
                        "part {} has no end: the closing '{}--' is missing", parts.size() + 1,
                        delimiter);
    }
    if (parts.size() == max_parts) {
      return make_error(ErrorCode::kResourceExhausted, "the body has more than {} parts",
                        max_parts);
    }
    MultipartPart part;
    std::string_view headers;
    if (line_end + 2 <= next && body.substr(line_end, 4) == "\r\n\r\n") {
      part.data = std::string(body.substr(line_end + 4, next - std::min(next, line_end + 4)));
    } else if (headers_end != std::string_view::npos && headers_end < next + 2) {
      headers = body.substr(line_end + 2, headers_end - line_end - 2);
      part.data = std::string(body.substr(headers_end + 4, next - std::min(next, headers_end + 4)));
    } else {
      return make_error(ErrorCode::kInvalidArgument,
                        "part {} has no blank line between its headers and its data",
                        parts.size() + 1);
    }
    while (!headers.empty()) {
      const size_t end = headers.find("\r\n");
      const auto line = headers.substr(0, end);
      headers = end == std::string_view::npos ? std::string_view() : headers.substr(end + 2);
      const size_t colon = line.find(':');
      if (colon == std::string_view::npos) {
        return make_error(ErrorCode::kInvalidArgument, "part {} has a header line without ':'",
                          parts.size() + 1);
      }
      const std::string name = lower(trim(line.substr(0, colon)));
      const auto value = trim(line.substr(colon + 1));
      if (name == "content-type") {
        part.content_type = std::string(value);
      } else if (name == "content-disposition") {
        for (const auto& [key, parameter] : parameters(value)) {
          if (key == "name") part.name = parameter;
          if (key == "filename") part.filename = parameter;
        }
      }
    }
    parts.push_back(std::move(part));
    at = next + 2;
  }
}

}  // namespace quarry

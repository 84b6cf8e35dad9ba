#include "common/multipart.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>

#include "common/random_id.h"
#include "common/text.h"

namespace quarry {
namespace {

constexpr std::string_view kCrlf = "\r\n";

// RFC 2046: 1 to 70 of digits, letters and '()+_,-./:=? , not ending in a space.
bool valid_boundary(std::string_view boundary) {
  if (boundary.empty() || boundary.size() > 70 || boundary.back() == ' ') return false;
  return std::all_of(boundary.begin(), boundary.end(), [](unsigned char c) {
    return std::isalnum(c) ||
           std::string_view("'()+_,-./:=? ").find(static_cast<char>(c)) != std::string_view::npos;
  });
}

struct Parameters {
  std::string value;  // what comes before the first ';' (form-data, multipart/form-data)
  std::vector<std::pair<std::string, std::string>> pairs;  // names in lower case
};

// `value; name="quoted \" value"; other=token`: quoted strings lose their quotes and escapes.
Result<Parameters> parse_parameters(std::string_view header) {
  Parameters parsed;
  size_t position = header.find(';');
  parsed.value = ascii_lower(trim_blanks(header.substr(0, position)));
  while (position != std::string_view::npos && position < header.size()) {
    ++position;  // past ';'
    const size_t equals = header.find('=', position);
    if (equals == std::string_view::npos) break;
    std::string name = ascii_lower(trim_blanks(header.substr(position, equals - position)));
    position = equals + 1;
    while (position < header.size() && header[position] == ' ')
      ++position;
    std::string value;
    if (position < header.size() && header[position] == '"') {
      ++position;
      bool closed = false;
      while (position < header.size()) {
        char c = header[position++];
        if (c == '\\' && position < header.size()) {
          value += header[position++];
        } else if (c == '"') {
          closed = true;
          break;
        } else {
          value += c;
        }
      }
      if (!closed) {
        return make_error(ErrorCode::kInvalidArgument, "the quoted value of '{}' never ends", name);
      }
      position = header.find(';', position);
    } else {
      const size_t end = header.find(';', position);
      value = std::string(trim_blanks(header.substr(position, end - position)));
      position = end;
    }
    parsed.pairs.emplace_back(std::move(name), std::move(value));
  }
  return parsed;
}

const std::string* parameter(const Parameters& parameters, std::string_view name) {
  for (const auto& [key, value] : parameters.pairs) {
    if (key == name) return &value;
  }
  return nullptr;
}

// filename*=UTF-8''%2Fhome%2F... (RFC 5987), decoded; nullopt if malformed.
std::optional<std::string> decode_extended(std::string_view value) {
  constexpr std::string_view kUtf8 = "utf-8''";
  if (value.size() < kUtf8.size() || ascii_lower(value.substr(0, kUtf8.size())) != kUtf8) {
    return std::nullopt;
  }
  value.remove_prefix(kUtf8.size());
  std::string out;
  for (size_t i = 0; i < value.size(); ++i) {
    if (value[i] != '%') {
      out += value[i];
      continue;
    }
    if (i + 2 >= value.size() || !std::isxdigit(static_cast<unsigned char>(value[i + 1])) ||
        !std::isxdigit(static_cast<unsigned char>(value[i + 2]))) {
      return std::nullopt;
    }
    out += static_cast<char>(std::stoi(std::string(value.substr(i + 1, 2)), nullptr, 16));
    i += 2;
  }
  return out;
}

Result<void> read_headers(std::string_view headers, size_t index, Part& part) {
  bool disposition = false;
  while (!headers.empty()) {
    const size_t end = headers.find(kCrlf);
    std::string_view line = headers.substr(0, end);
    headers = end == std::string_view::npos ? std::string_view() : headers.substr(end + 2);
    if (line.empty()) continue;
    const size_t colon = line.find(':');
    if (colon == std::string_view::npos) {
      return make_error(ErrorCode::kInvalidArgument, "part {} has a header line without ':'",
                        index);
    }
    const std::string name = ascii_lower(trim_blanks(line.substr(0, colon)));
    const std::string_view value = trim_blanks(line.substr(colon + 1));
    if (name == "content-type") {
      part.content_type = std::string(value);
    } else if (name == "content-disposition") {
      ASSIGN_OR_RETURN(auto parsed, parse_parameters(value));
      if (parsed.value != "form-data") {
        return make_error(ErrorCode::kInvalidArgument,
                          "part {} is '{}', not form-data (Content-Disposition)", index,
                          parsed.value);
      }
      const std::string* field = parameter(parsed, "name");
      if (!field) {
        return make_error(ErrorCode::kInvalidArgument,
                          "part {} has no name in its Content-Disposition", index);
      }
      part.name = *field;
      if (const std::string* extended = parameter(parsed, "filename*")) {
        part.filename = decode_extended(*extended);
        if (!part.filename) {
          return make_error(ErrorCode::kInvalidArgument,
                            "part {} has a malformed filename* (want UTF-8''percent-encoded)",
                            index);
        }
      } else if (const std::string* filename = parameter(parsed, "filename")) {
        part.filename = *filename;
      }
      disposition = true;
    }
  }
  if (!disposition) {
    return make_error(ErrorCode::kInvalidArgument, "part {} has no Content-Disposition", index);
  }
  return {};
}

}  // namespace

Result<std::string> multipart_boundary(std::string_view content_type) {
  auto parsed = parse_parameters(content_type);
  if (!parsed || parsed->value != "multipart/form-data") {
    return make_error(ErrorCode::kInvalidArgument, "the body must be multipart/form-data, not '{}'",
                      content_type);
  }
  const std::string* boundary = parameter(*parsed, "boundary");
  if (!boundary || !valid_boundary(*boundary)) {
    return make_error(ErrorCode::kInvalidArgument,
                      "the multipart/form-data Content-Type has no valid boundary");
  }
  return *boundary;
}

Result<std::vector<Part>> parse_multipart(std::string_view body, std::string_view boundary) {
  const std::string delimiter = fmt::format("--{}", boundary);
  const std::string inner = fmt::format("\r\n--{}", boundary);
  // The first delimiter starts the body or a line (what comes before it is a preamble).
  size_t position = body.starts_with(delimiter) ? 0 : body.find(inner);
  if (position == std::string_view::npos) {
    return make_error(ErrorCode::kInvalidArgument, "the body has no part (no boundary line)");
  }
  position += body.starts_with(delimiter) ? delimiter.size() : inner.size();
  std::vector<Part> parts;
  for (;;) {
    if (body.substr(position, 2) == "--") return parts;  // the closing delimiter
    while (position < body.size() && (body[position] == ' ' || body[position] == '\t'))
      ++position;  // transport padding
    if (body.substr(position, 2) != kCrlf) {
      return make_error(ErrorCode::kInvalidArgument,
                        "a boundary line is not followed by a line break (part {})", parts.size());
    }
    position += 2;
    if (parts.size() == kMaxParts) {
      return make_error(ErrorCode::kInvalidArgument, "the body has more than {} parts", kMaxParts);
    }
    // An empty header block is a bare CRLF right after the boundary line.
    const size_t headers_end =
        body.substr(position, 2) == kCrlf ? position : body.find("\r\n\r\n", position);
    if (headers_end == std::string_view::npos || headers_end - position > kMaxPartHeaderBytes) {
      return make_error(ErrorCode::kInvalidArgument,
                        "part {}'s headers never end or are longer than {} bytes", parts.size(),
                        kMaxPartHeaderBytes);
    }
    Part part;
    RETURN_IF_ERROR(
        read_headers(body.substr(position, headers_end - position), parts.size(), part));
    const size_t data_start = headers_end + (headers_end == position ? 2 : 4);
    const size_t data_end = body.find(inner, data_start);
    if (data_end == std::string_view::npos) {
      return make_error(ErrorCode::kInvalidArgument,
                        "part {} ('{}') is cut short: the body ends before its boundary",
                        parts.size(), part.name);
    }
    part.data = body.substr(data_start, data_end - data_start);
    parts.push_back(std::move(part));
    position = data_end + inner.size();
  }
}

Multipart write_multipart(const std::vector<OutPart>& parts) {
  auto quoted = [](std::string_view text) {
    std::string out;
    for (unsigned char c : text) {
      if (c == '"' || c == '\\') out += '\\';
      // Line breaks would end the header: only filename* carries them.
      out += (c == '\r' || c == '\n') ? '_' : static_cast<char>(c);
    }
    return out;
  };
  auto extended = [](std::string_view text) {
    std::string out = "UTF-8''";
    for (unsigned char c : text) {
      const bool plain = std::isalnum(c) || std::string_view("-._~/").find(static_cast<char>(c)) !=
                                                std::string_view::npos;
      out += plain ? std::string(1, static_cast<char>(c)) : fmt::format("%{:02X}", c);
    }
    return out;
  };
  std::string boundary;
  do {
    boundary = fmt::format("quarry-{}{}", random_id(), random_id());
  } while (std::any_of(parts.begin(), parts.end(), [&](const OutPart& part) {
    return part.data.find(boundary) != std::string::npos;
  }));
  Multipart out;
  out.content_type = fmt::format("multipart/form-data; boundary={}", boundary);
  for (const auto& part : parts) {
    out.body += fmt::format("--{}\r\nContent-Disposition: form-data; name=\"{}\"", boundary,
                            quoted(part.name));
    if (!part.filename.empty()) {
      out.body += fmt::format("; filename=\"{}\"; filename*={}", quoted(part.filename),
                              extended(part.filename));
    }
    out.body += fmt::format("\r\nContent-Type: {}\r\n\r\n", part.content_type);
    out.body += part.data;
    out.body += kCrlf;
  }
  out.body += fmt::format("--{}--\r\n", boundary);
  return out;
}

}  // namespace quarry

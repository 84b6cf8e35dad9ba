// multipart/form-data (RFC 7578) as Daytona's toolbox speaks it: the parts of a bulk upload read
// out of a body held in memory, and the answer of a bulk download written. Reading is strict and
// bounded (at most kMaxParts parts, kMaxPartHeaderBytes of headers each); every refusal says
// what was wrong, for a 400.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.h"

namespace quarry {

inline constexpr size_t kMaxParts = 2000;
inline constexpr size_t kMaxPartHeaderBytes = 16 * 1024;

struct Part {
  std::string name;                     // Content-Disposition's name
  std::optional<std::string> filename;  // and its filename, if any
  std::string content_type;             // "" when the part has none
  std::string_view data;                // within the body parsed
};

// The boundary of a "multipart/form-data; boundary=..." Content-Type (kInvalidArgument for any
// other type, or a boundary RFC 2046 does not allow).
Result<std::string> multipart_boundary(std::string_view content_type);

// The parts of `body`, in order; their data point into `body`.
Result<std::vector<Part>> parse_multipart(std::string_view body, std::string_view boundary);

struct OutPart {
  std::string name;
  std::string filename;  // sent as filename="..." and, exactly, as filename*=UTF-8''...
  std::string content_type;
  std::string data;
};

struct Multipart {
  std::string content_type;  // multipart/form-data; boundary=...
  std::string body;
};

// A body of `parts` with a boundary that none of them contains.
Multipart write_multipart(const std::vector<OutPart>& parts);

}  // namespace quarry

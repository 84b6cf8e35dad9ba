// multipart/form-data bodies (RFC 7578), written and read whole: the file uploads and downloads
// of Daytona's toolbox.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "common/error.h"

namespace quarry {

struct MultipartPart {
  std::string name{};          // the form field (Content-Disposition's name)
  std::string filename{};      // "" when the part has none
  std::string content_type{};  // "" when the part gives none
  std::string data{};
};

// A boundary no part's data is likely to hold: "quarry-" and 32 random hex digits.
std::string random_multipart_boundary();

// The body of `parts` with `boundary` (Content-Type: multipart/form-data; boundary=...).
std::string write_multipart(const std::vector<MultipartPart>& parts, std::string_view boundary);

// The boundary of a "multipart/form-data; boundary=..." (or multipart/mixed) Content-Type;
// kInvalidArgument for another type or no boundary.
Result<std::string> multipart_boundary(std::string_view content_type);

// The parts of `body`, at most `max_parts` of them (else kResourceExhausted); kInvalidArgument,
// saying where, for a body that is not multipart with that boundary.
Result<std::vector<MultipartPart>> parse_multipart(std::string_view body, std::string_view boundary,
                                                   size_t max_parts);

}  // namespace quarry

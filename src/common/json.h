// JSON from peers quarry does not trust: a request's body, a sandbox's answer, a model's reply.
#pragma once

#include <nlohmann/json.hpp>
#include <string_view>

#include "common/error.h"

namespace quarry {

// nlohmann parses and destroys a value without recursion, but copies, compares and dumps it with
// one frame a level: a body of a few hundred thousand '[' would overflow a thread's stack there.
// Nothing quarry reads nests anywhere near this deep.
inline constexpr int kMaxJsonDepth = 64;

// The value in `text`; an kInvalidArgument error says why there is none: not JSON (where and
// what, without the library's tag), a number past a double's range, or nesting deeper than
// kMaxJsonDepth.
Result<nlohmann::json> parse_json(std::string_view text);

// The same for a caller that only needs to know whether there is a value: a discarded one
// (is_discarded()) when there is none.
nlohmann::json parse_json_or_discarded(std::string_view text);

}  // namespace quarry

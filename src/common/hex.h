// Bytes as lowercase hex digits, and back.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace quarry {

std::string to_hex(std::span<const uint8_t> bytes);
// nullopt unless `text` is lowercase hex digits in pairs.
std::optional<std::vector<uint8_t>> from_hex(std::string_view text);

}  // namespace quarry

// SHA-256 of a byte string as lowercase hex (OpenSSL's libcrypto, without initialising it).
#pragma once

#include <string>
#include <string_view>

namespace quarry {

std::string sha256_hex(std::string_view data);

}  // namespace quarry

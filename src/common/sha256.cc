#include "common/sha256.h"

#include <openssl/evp.h>

#include "common/hex.h"

namespace quarry {

std::string sha256_hex(std::string_view data) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  EVP_Digest(data.data(), data.size(), digest, &length, EVP_sha256(), nullptr);
  return to_hex(std::span(digest, length));
}

}  // namespace quarry

#include "common/sha256.h"

// SHA256_Init/Update/Final are deprecated in OpenSSL 3 in favour of EVP, whose first use in a
// process initialises the library (reading openssl.cnf, loading the default provider, fetching
// the digest): about 1 ms, the largest part of `quarry sandbox run` after its sandbox work,
// there only to hash the image's definition. These are the same implementation (and assembly)
// without that, and they touch no global state.
#define OPENSSL_SUPPRESS_DEPRECATED
#include <openssl/sha.h>

#include "common/hex.h"

namespace quarry {

std::string sha256_hex(std::string_view data) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256_CTX context;
  SHA256_Init(&context);
  SHA256_Update(&context, data.data(), data.size());
  SHA256_Final(digest, &context);
  return to_hex(std::span(digest, sizeof digest));
}

}  // namespace quarry

// sha256_hex against FIPS 180-4's examples and OpenSSL's EVP interface.
#include "common/sha256.h"

#include <gtest/gtest.h>
#include <openssl/evp.h>

#include "common/hex.h"

namespace quarry {
namespace {

TEST(Sha256, MatchesTheStandardsExamples) {
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(sha256_hex(std::string(1'000'000, 'a')),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256, AgreesWithEvpAtEveryLengthAroundABlock) {
  for (size_t length = 0; length <= 130; ++length) {
    SCOPED_TRACE(length);
    std::string data(length, '\0');
    for (size_t at = 0; at < length; ++at)
      data[at] = static_cast<char>(at * 37 + length);
    unsigned char digest[EVP_MAX_MD_SIZE];
    unsigned int size = 0;
    ASSERT_EQ(EVP_Digest(data.data(), data.size(), digest, &size, EVP_sha256(), nullptr), 1);
    EXPECT_EQ(sha256_hex(data), to_hex(std::span(digest, size)));
  }
}

}  // namespace
}  // namespace quarry

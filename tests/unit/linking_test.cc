// The pyarrow wheel's libarrow exports a static OpenSSL of its own; programs linking Arrow must
// still call the system's (cmake/FindArrowWheel.cmake puts libssl and libcrypto first).
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <openssl/evp.h>
#include <openssl/ssl.h>

#include <string>

#include "data/parquet_export.h"

namespace quarry {
namespace {

std::string library_of(void* function) {
  Dl_info info{};
  if (::dladdr(function, &info) == 0 || info.dli_fname == nullptr) return "?";
  return info.dli_fname;
}

TEST(Linking, OpenSslCallsGoToTheSystemLibraries) {
  // This binary links Arrow (through the data room), so the question is real here.
  ASSERT_NE(reinterpret_cast<void*>(&data::export_parquet), nullptr);
  EXPECT_NE(library_of(reinterpret_cast<void*>(&SSL_CTX_new)).find("libssl.so"), std::string::npos)
      << library_of(reinterpret_cast<void*>(&SSL_CTX_new));
  EXPECT_NE(library_of(reinterpret_cast<void*>(&EVP_sha256)).find("libcrypto.so"),
            std::string::npos)
      << library_of(reinterpret_cast<void*>(&EVP_sha256));
}

}  // namespace
}  // namespace quarry

// The OpenAPI document and the server's routes are the same list: every route is documented
// and every documented operation is a route. (tests/api/check_openapi.py holds the responses
// the other tests recorded against the document's schemas.)
#include "server/openapi.h"

#include <gtest/gtest.h>

#include <set>

#include "server/router.h"

namespace quarry::server {
namespace {

TEST(OpenApi, DocumentsEveryRouteAndNothingElse) {
  auto document = openapi_document();
  ASSERT_TRUE(document) << document.error().message;
  EXPECT_EQ((*document)["openapi"], "3.1.0");
  std::set<std::string> documented;
  for (const auto& [path, operations] : (*document)["paths"].items()) {
    for (const auto& [method, operation] : operations.items()) {
      if (method == "parameters") continue;
      std::string upper = method;
      std::transform(upper.begin(), upper.end(), upper.begin(), ::toupper);
      documented.insert(upper + " " + path);
      EXPECT_TRUE(operation.contains("operationId")) << upper << " " << path;
      EXPECT_TRUE(operation.contains("responses")) << upper << " " << path;
    }
  }
  std::set<std::string> served;
  for (const auto& route : routes())
    served.insert(fmt::format("{} {}", route.method, route.pattern));
  EXPECT_EQ(documented, served);
}

}  // namespace
}  // namespace quarry::server

// The scripted model's scenario files (tests/scripted_model/scenario.h): what they refuse.
#include "scenario.h"

#include <gtest/gtest.h>

namespace quarry::scripted_model {
namespace {

// Found by fuzz/scenario_fuzzer: YAML takes bytes that are not UTF-8, and writing such tool
// call arguments out as JSON threw nlohmann's type_error out of parse_scenario.
TEST(Scenario, RefusesArgumentsThatAreNotUtf8) {
  auto scenario = parse_scenario(
      "steps:\n  - tool_calls:\n      - name: run_python\n        arguments: {code: \"\xff\"}\n",
      "broken.yml", "broken");
  ASSERT_FALSE(scenario);
  EXPECT_EQ(scenario.error().code, ErrorCode::kInvalidArgument);
  EXPECT_NE(scenario.error().message.find(
                "broken.yml:4: steps[0].tool_calls[0].arguments: cannot be sent as JSON"),
            std::string::npos)
      << scenario.error().message;
}

TEST(Scenario, SendsArgumentsAsJson) {
  auto scenario = parse_scenario(
      "steps:\n  - tool_calls:\n      - name: run_python\n        arguments: {code: \"é\", n: 2}\n",
      "ok.yml", "ok");
  ASSERT_TRUE(scenario) << scenario.error().message;
  EXPECT_EQ(scenario->steps[0].otherwise->tool_calls[0].arguments, R"({"code":"é","n":2})");
}

}  // namespace
}  // namespace quarry::scripted_model

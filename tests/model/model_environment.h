// What the model tests share: a temporary directory for scenario files and request records,
// a scripted model server started per test, and a ModelConfig pointing at it.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "agent/model_client.h"
#include "server_process.h"

namespace quarry::testing {

// The environment variable the tests' ModelConfig reads the key from.
inline constexpr const char* kKeyVariable = "QUARRY_TEST_MODEL_KEY";
inline constexpr const char* kKey = "sk-test-0123456789";

class ModelTest : public ::testing::Test {
 protected:
  void SetUp() override;
  void TearDown() override;

  // Writes <dir>/<name>.yml; the model name `name` then selects it.
  void write_scenario(const std::string& name, const std::string& yaml);
  // A server over the scenario directory, recording requests; `options` adds to that.
  ScriptedModelServer& start_server(ScriptedModelOptions options = {});
  // model.* for the running server and the scenario `name`: short timeouts, 3 retries.
  ModelConfig config_for(const std::string& name) const;
  std::unique_ptr<agent::ModelClient> client_for(const ModelConfig& config) const;
  // The requests the server received, in order.
  std::vector<nlohmann::json> requests() const;

  // A system prompt, a user question and the two tools of the reference cases.
  static agent::ChatRequest question(const std::string& user_text);

  std::filesystem::path dir_;
  std::unique_ptr<ScriptedModelServer> server_;
};

}  // namespace quarry::testing

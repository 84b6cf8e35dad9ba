#include "model_environment.h"

#include <stdlib.h>

#include <fstream>

#include "common/file_util.h"

namespace quarry::testing {

void ModelTest::SetUp() {
  std::string pattern = (std::filesystem::temp_directory_path() / "quarry-model-XXXXXX").string();
  ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
  dir_ = pattern;
  ::setenv(kKeyVariable, kKey, 1);
}

void ModelTest::TearDown() {
  server_.reset();
  ::unsetenv(kKeyVariable);
  std::error_code ignored;
  std::filesystem::remove_all(dir_, ignored);
}

void ModelTest::write_scenario(const std::string& name, const std::string& yaml) {
  std::ofstream(dir_ / (name + ".yml")) << yaml;
}

ScriptedModelServer& ModelTest::start_server(ScriptedModelOptions options) {
  if (options.scenario_dir.empty()) options.scenario_dir = dir_;
  if (options.record.empty()) options.record = dir_ / "requests.jsonl";
  auto server = ScriptedModelServer::start(options);
  EXPECT_TRUE(server) << server.error().message;
  if (!server) std::abort();
  server_ = std::move(*server);
  return *server_;
}

ModelConfig ModelTest::config_for(const std::string& name) const {
  ModelConfig config;
  config.base_url = server_ ? server_->base_url() : "http://127.0.0.1:9/v1";
  config.name = name;
  config.api_key_env = kKeyVariable;
  config.timeout = std::chrono::seconds(20);
  config.connect_timeout = std::chrono::seconds(2);
  config.max_retries = 3;
  return config;
}

std::unique_ptr<agent::ModelClient> ModelTest::client_for(const ModelConfig& config) const {
  auto client = agent::make_model_client(config);
  EXPECT_TRUE(client) << client.error().message;
  return client ? std::move(*client) : nullptr;
}

std::vector<nlohmann::json> ModelTest::requests() const {
  std::vector<nlohmann::json> lines;
  auto text = read_file(dir_ / "requests.jsonl");
  if (!text) return lines;
  // Whole lines only: a test may read while the server is still writing one.
  std::string_view rest(*text);
  for (auto end = rest.find('\n'); end != std::string_view::npos; end = rest.find('\n')) {
    auto parsed = nlohmann::json::parse(rest.substr(0, end));
    rest.remove_prefix(end + 1);
    if (!parsed.contains("hangup")) lines.push_back(std::move(parsed));  // not a request
  }
  return lines;
}

agent::ChatRequest ModelTest::question(const std::string& user_text) {
  agent::ChatRequest request;
  request.messages = {
      {.role = "system",
       .content = "You analyse data. Filter and aggregate in SQL first; use DuckDB for large data, "
                  "median and percentiles."},
      {.role = "user", .content = user_text},
  };
  const nlohmann::json code = {
      {"type", "object"}, {"properties", {{"code", {{"type", "string"}}}}}, {"required", {"code"}}};
  const nlohmann::json sql = {
      {"type", "object"},
      {"properties", {{"sql", {{"type", "string"}}}, {"name", {{"type", "string"}}}}},
      {"required", {"sql", "name"}}};
  request.tools = {
      {.name = "export_query", .description = "Exports SQL results as Parquet", .parameters = sql},
      {.name = "execute", .description = "Runs Python in the sandbox", .parameters = code},
  };
  return request;
}

}  // namespace quarry::testing

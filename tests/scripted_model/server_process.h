// Starts scripted_model_server for a test and stops it at the end of the test's scope.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "common/error.h"

namespace quarry::testing {

struct ScriptedModelOptions {
  std::filesystem::path scenario{};      // --scenario: for every model name
  std::filesystem::path scenario_dir{};  // --scenario-dir: <dir>/<model>.yml
  std::string api_key{};                 // --api-key: require this key
  std::filesystem::path record{};        // --record: one JSON line per request
  std::filesystem::path tls_cert{};      // --tls-cert and --tls-key: serve https
  std::filesystem::path tls_key{};
  std::vector<std::string> extra_args{};
};

class ScriptedModelServer {
 public:
  // Starts the server on a free port of 127.0.0.1 and waits until it listens.
  static Result<std::unique_ptr<ScriptedModelServer>> start(const ScriptedModelOptions& options);
  ~ScriptedModelServer();  // SIGTERM, then waits for it
  ScriptedModelServer(const ScriptedModelServer&) = delete;
  ScriptedModelServer& operator=(const ScriptedModelServer&) = delete;

  uint16_t port() const { return port_; }
  // "http://127.0.0.1:<port>/v1" ("https://..." when serving TLS): model.base_url.
  std::string base_url() const;

 private:
  ScriptedModelServer(pid_t pid, uint16_t port, bool tls) : pid_(pid), port_(port), tls_(tls) {}
  pid_t pid_;
  uint16_t port_;
  bool tls_;
};

}  // namespace quarry::testing

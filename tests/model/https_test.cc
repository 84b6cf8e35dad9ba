// The model client over https: certificate verification against a CA file (model.ca_file) or
// the system's store, host name and IP checks, SNI. The server is the scripted model server
// with a certificate made by the openssl command for each test.
#include "common/command.h"
#include "model_environment.h"

namespace quarry::testing {
namespace {

class HttpsTest : public ModelTest {
 protected:
  void SetUp() override {
    ModelTest::SetUp();
    if (!find_program("openssl")) GTEST_SKIP() << "the openssl command is not installed";
    write_scenario("secure", "steps:\n  - content: \"Sent over TLS.\"\n");
  }

  // A self-signed certificate (its own CA) for the names in `san`; returns the cert's path.
  std::filesystem::path make_certificate(const std::string& name, const std::string& san) {
    const auto cert = dir_ / (name + ".pem");
    const auto key = dir_ / (name + ".key");
    auto made = run_command({"openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                             "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", key.string(),
                             "-out", cert.string(), "-days", "2", "-subj", "/CN=quarry test",
                             "-addext", "subjectAltName=" + san});
    EXPECT_TRUE(made) << made.error().message;
    return cert;
  }

  ScriptedModelServer& start_tls(const std::string& name) {
    return start_server({.tls_cert = dir_ / (name + ".pem"), .tls_key = dir_ / (name + ".key")});
  }
};

TEST_F(HttpsTest, StreamsOverTlsTrustingTheGivenCa) {
  const auto cert = make_certificate("server", "DNS:localhost,IP:127.0.0.1");
  auto& server = start_tls("server");
  for (const std::string host : {"127.0.0.1", "localhost"}) {
    SCOPED_TRACE(host);
    auto config = config_for("secure");
    config.base_url = fmt::format("https://{}:{}/v1", host, server.port());
    config.ca_file = cert.string();
    auto client = client_for(config);
    std::string text;
    auto response = client->complete(question("q"), [&](std::string_view piece) { text += piece; });
    ASSERT_TRUE(response) << response.error().message;
    EXPECT_EQ(text, "Sent over TLS.");
  }
  EXPECT_EQ(requests().size(), 2u);
}

TEST_F(HttpsTest, RefusesACertificateTheSystemStoreDoesNotTrust) {
  make_certificate("server", "DNS:localhost,IP:127.0.0.1");
  auto& server = start_tls("server");
  auto client = client_for(config_for("secure"));  // no ca_file: the system's CAs
  auto response = client->complete(question("q"), nullptr);
  ASSERT_FALSE(response);
  EXPECT_EQ(response.error().code, ErrorCode::kFailedPrecondition);
  EXPECT_EQ(response.error().message,
            fmt::format("cannot reach {} securely: its TLS certificate was not accepted "
                        "(self-signed certificate); trusted are the system's CA certificates; "
                        "model.ca_file names a CA file to trust instead",
                        server.base_url()));
  EXPECT_TRUE(requests().empty());  // nothing was sent, and nothing retried
}

TEST_F(HttpsTest, RefusesACertificateForAnotherName) {
  const auto cert = make_certificate("stranger", "DNS:models.other.test");
  start_tls("stranger");
  auto config = config_for("secure");
  config.ca_file = cert.string();
  for (const std::string host : {"127.0.0.1", "localhost"}) {
    SCOPED_TRACE(host);
    config.base_url = fmt::format("https://{}:{}/v1", host, server_->port());
    auto response = client_for(config)->complete(question("q"), nullptr);
    ASSERT_FALSE(response);
    EXPECT_EQ(response.error().code, ErrorCode::kFailedPrecondition);
    EXPECT_NE(response.error().message.find(host == "localhost" ? "(hostname mismatch)"
                                                                : "(IP address mismatch)"),
              std::string::npos)
        << response.error().message;
    EXPECT_NE(response.error().message.find(fmt::format("only the CAs in {}", cert.string())),
              std::string::npos);
  }
}

TEST_F(HttpsTest, AnUnreadableCaFileStopsTheClientFromStarting) {
  ModelConfig config;
  config.base_url = "https://127.0.0.1:1/v1";
  config.ca_file = (dir_ / "missing.pem").string();
  auto client = agent::make_model_client(config);
  ASSERT_FALSE(client);
  EXPECT_EQ(client.error().code, ErrorCode::kFailedPrecondition);
  EXPECT_NE(client.error().message.find(
                fmt::format("model.ca_file: cannot load CA certificates from {}", config.ca_file)),
            std::string::npos)
      << client.error().message;
}

}  // namespace
}  // namespace quarry::testing

// What the API tests share: `quarry serve` started as a separate process per test (with its own
// config: the scripted model's scenario, tokens or none, limits), real sandboxes in the test
// binary's state directory, the test binary's PostgreSQL, and an HTTP client that speaks to
// the server as any other program would and records every exchange for the OpenAPI check.
#pragma once

#include <gtest/gtest.h>
#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "child_process.h"
#include "common/http_client.h"
#include "server_process.h"

namespace quarry::testing {

// The scripted model server (over tests/api/scenarios and tests/agent/scenarios) and where the
// model's requests are recorded. Started on first use (the sandbox environment must be set up
// first), stopped when the test binary's environments are torn down.
class ApiEnvironment : public ::testing::Environment {
 public:
  static ApiEnvironment& get();
  void TearDown() override;
  const std::string& model_url() const { return model_url_; }
  const std::filesystem::path& model_requests() const { return model_requests_; }
  // The requests the model received, in order (one JSON object each: method, target, body).
  std::vector<nlohmann::json> requests_to_model() const;
  // The requests whose client closed the connection while the scripted model made it wait, in
  // order (each: model, step, during, waited_ms).
  std::vector<nlohmann::json> model_hangups() const;
  // The demo data at full size (20 million events), loaded once per test binary.
  void load_demo_data();

 private:
  void start();
  bool started_ = false;
  std::filesystem::path scenarios_;
  std::filesystem::path model_requests_;
  std::unique_ptr<ScriptedModelServer> model_;
  std::string model_url_;
  bool demo_data_ = false;
};

// Every member has a default, so designated initializers may name only what they set.
struct ServerOptions {
  std::string scenario = "peak_views";  // the model's name: the scenario that answers
  bool tokens = false;                  // a tokens file with users alice and bob
  std::string listen = "127.0.0.1:0";
  std::string server_config{};    // YAML lines under "server:", each indented two spaces
  std::string sandbox_config{};   // YAML lines under "sandbox:", each indented two spaces
  std::string database_url{};     // database.url; empty: the test binary's PostgreSQL
  std::string database_config{};  // more YAML lines under "database:", each indented two spaces
  std::string model_config{};     // instead of the scripted model: YAML lines under "model:"
  std::string capacity_config{};  // YAML lines under "capacity:", each indented two spaces
  std::string instance_id = "api-test";  // conversations.instance_id
  std::string conversations_config{};    // more YAML lines under "conversations:", indented two
  // KEY=VALUE set in the environment of the server and of quarry() (e.g. a Daytona key).
  std::vector<std::string> env{};
  bool expect_start = true;  // false: the server is to refuse to start
  // A state directory of its own instead of the one the test binary's sandboxes live in, as a
  // server on another machine has (its artifacts, tokens); it should start no sandbox.
  bool own_state_dir = false;
  // The state directory of a server stopped before (as when it is started again); overrides
  // own_state_dir.
  std::filesystem::path state_dir{};
};

// A `quarry serve` process of the test; stopped with SIGKILL when it goes out of scope, unless
// stopped before.
class QuarryServer {
 public:
  // Starts the server and waits until it listens; fails the test if it does not.
  explicit QuarryServer(ServerOptions options = {});
  ~QuarryServer();
  QuarryServer(const QuarryServer&) = delete;
  QuarryServer& operator=(const QuarryServer&) = delete;

  bool started() const { return !url_.empty(); }
  const std::string& url() const { return url_; }
  // The token of a user of a server started with tokens ("alice", "bob"), and the user's name
  // (made unique to this server, so tests sharing the history do not see each other's).
  std::string token(const std::string& user) const;
  std::string user(const std::string& user) const;
  const std::filesystem::path& tokens_file() const { return tokens_file_; }
  const std::filesystem::path& config() const { return config_; }
  const std::filesystem::path& state_dir() const { return state_dir_; }
  // Sends `signal` and returns the wait status.
  int stop(int signal);
  // Sends `signal` and returns at once; wait() then waits for the exit and returns its status.
  void signal(int signal) const;
  int wait();
  // What the server wrote on stderr so far.
  std::string log() const;

  // Runs the quarry command line with this server's config and environment (e.g. {"token",
  // "rm", "bob"}). Returns its exit status; `output` receives stdout and stderr.
  int quarry(const std::vector<std::string>& args, std::string* output = nullptr) const;
  // The argv that runs the quarry command line so (for a ChildProcess).
  std::vector<std::string> quarry_argv(const std::vector<std::string>& args) const;

 private:
  std::filesystem::path dir_;
  std::filesystem::path config_;
  std::filesystem::path state_dir_;
  std::filesystem::path tokens_file_;
  std::filesystem::path log_;
  std::map<std::string, std::string> tokens_;
  std::string user_suffix_;
  std::vector<std::string> env_;
  std::unique_ptr<ChildProcess> process_;
  std::string url_;
};

// One event of a stream.
struct StreamEvent {
  std::string id;
  std::string type;
  nlohmann::json data;
  std::string raw;  // the data as it came
};

struct ApiResponse {
  int status = 0;
  std::string body;
  nlohmann::json json;  // the body parsed, when it is JSON
  std::vector<HttpHeader> headers;
  std::vector<StreamEvent> events;  // for text/event-stream
  std::string header(std::string_view name) const;
};

// Speaks HTTP to the server like any client (real sockets, one connection per request), with a
// token, a session cookie or neither.
class ApiClient {
 public:
  explicit ApiClient(std::string base_url);

  void use_token(std::string token) { token_ = std::move(token); }
  // The server is going to be killed: a connection it breaks is no test failure.
  void expect_breaks() { expect_breaks_ = true; }
  void use_cookie(std::string cookie, std::string csrf) {
    cookie_ = std::move(cookie);
    csrf_ = std::move(csrf);
  }

  ApiResponse get(const std::string& path, std::vector<HttpHeader> headers = {});
  ApiResponse post(const std::string& path, const nlohmann::json& body,
                   std::vector<HttpHeader> headers = {});
  ApiResponse del(const std::string& path, std::vector<HttpHeader> headers = {});
  // Any request, the body sent as it is.
  ApiResponse send(const std::string& method, const std::string& path, const std::string& body,
                   std::vector<HttpHeader> headers = {});

  // A request whose answer is a stream: each event goes to `on_event` as it arrives; returning
  // false drops the connection there. The events are in the response too.
  // `cancel_fd` readable drops it too, even while nothing arrives. `on_open` is called once,
  // when the first piece of the body arrives (for a stream: the server is sending it).
  ApiResponse stream(const std::string& method, const std::string& path, const std::string& body,
                     const std::function<bool(const StreamEvent&)>& on_event = {},
                     std::vector<HttpHeader> headers = {},
                     std::chrono::seconds timeout = std::chrono::seconds(300), int cancel_fd = -1,
                     const std::function<void()>& on_open = {});

  // POST {"content": question} to a conversation: the turn's whole stream.
  ApiResponse ask(const std::string& conversation, const std::string& question);
  // POST a cell: the turn's whole stream.
  ApiResponse cell(const std::string& conversation, const std::string& kind,
                   const std::string& code, const std::string& filename = "");
  // A new conversation's id.
  std::string create_conversation(const std::string& title = "");

 private:
  friend class KeptConnection;
  HttpRequest request(const std::string& method, const std::string& path, const std::string& body,
                      std::vector<HttpHeader> headers) const;

  std::string base_url_;
  std::string token_, cookie_, csrf_;
  bool expect_breaks_ = false;
};

// A stream read on a thread of its own, so the test can act while it runs (cancel the turn,
// stop the server) and wait for what it expects to see.
class BackgroundStream {
 public:
  BackgroundStream(ApiClient client, std::string method, std::string path, std::string body = "",
                   std::vector<HttpHeader> headers = {});
  ~BackgroundStream();  // drops the stream if it still runs
  // The first event (counting from the start) that satisfies `match`, waiting up to `timeout`.
  std::optional<StreamEvent> wait_for(const std::function<bool(const StreamEvent&)>& match,
                                      std::chrono::seconds timeout = std::chrono::seconds(60));
  std::optional<StreamEvent> wait_for_type(std::string_view type,
                                           std::chrono::seconds timeout = std::chrono::seconds(60));
  // Whether the server began sending the stream within `timeout`.
  bool wait_open(std::chrono::seconds timeout = std::chrono::seconds(60));
  // Drops the connection now.
  void drop();
  // Waits for the stream to end and returns it.
  ApiResponse finish();

 private:
  ApiClient client_;
  int cancel_fd_ = -1;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<StreamEvent> events_;
  bool open_ = false;
  bool ended_ = false;
  ApiResponse response_;
  std::thread thread_;
};

// One connection kept open across requests (HTTP/1.1 keep-alive), as browsers and proxies keep
// them: for what a server does with a connection it accepted before something changed. Records
// its exchanges as ApiClient does.
// A database server that takes connections and never answers (overloaded, or a firewall that
// drops what follows the handshake): each connection waits out libpq's connect timeout.
class HungDatabase {
 public:
  HungDatabase();
  ~HungDatabase();
  HungDatabase(const HungDatabase&) = delete;
  HungDatabase& operator=(const HungDatabase&) = delete;
  int accepted() const { return accepted_; }
  // database.url for it.
  std::string url() const;

 private:
  int listener_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_ = false;
  std::atomic<int> accepted_ = 0;
  std::vector<int> held_;  // the accepting thread's
  std::thread thread_;
};

class KeptConnection {
 public:
  // Connects to the server now; fails the test if it cannot.
  explicit KeptConnection(ApiClient client);
  ~KeptConnection();
  KeptConnection(const KeptConnection&) = delete;
  KeptConnection& operator=(const KeptConnection&) = delete;

  // Sends a request on this connection and reads the whole answer (not a stream).
  ApiResponse send(const std::string& method, const std::string& path, const std::string& body = "",
                   std::vector<HttpHeader> headers = {});
  // Whether the server closed the connection (read: end of stream) within a second.
  bool closed_by_server();

 private:
  struct State;
  ApiClient client_;
  std::unique_ptr<State> state_;
};

// The events of a given type.
std::vector<StreamEvent> of_type(const std::vector<StreamEvent>& events, std::string_view type);
// What the "output" events carried, joined: output comes in pieces as it is written (print()
// may write "42" and "\n" apart).
std::string printed(const std::vector<StreamEvent>& events);

// Where the API tests write what they record (build/test-results/api).
std::filesystem::path results_dir();

}  // namespace quarry::testing

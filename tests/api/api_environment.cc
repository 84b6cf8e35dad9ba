#include "api_environment.h"

#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <fstream>
#include <mutex>

#include "agent/sse_parser.h"
#include "common/command.h"
#include "common/file_util.h"
#include "common/progress.h"
#include "common/url.h"
#include "data/demo_data.h"
#include "postgres_environment.h"
#include "sandbox_environment.h"

namespace quarry::testing {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;

// The running test's name, usable in a file name (a parameterized test's has slashes).
std::string test_name() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string name = info ? fmt::format("{}.{}", info->test_suite_name(), info->name()) : "setup";
  std::ranges::replace(name, '/', '-');
  return name;
}

}  // namespace

std::filesystem::path results_dir() {
  auto dir = std::filesystem::path(QUARRY_BUILD_DIR) / "test-results" / "api";
  std::filesystem::create_directories(dir);
  return dir;
}

namespace {
ApiEnvironment* g_api = nullptr;
// Registered before main() runs, so it is torn down after the sandbox environment.
[[maybe_unused]] ::testing::Environment* const g_registered =
    ::testing::AddGlobalTestEnvironment(g_api = new ApiEnvironment);
}  // namespace

ApiEnvironment& ApiEnvironment::get() {
  if (!g_api->started_) g_api->start();
  return *g_api;
}

void ApiEnvironment::TearDown() {
  model_.reset();
}

void ApiEnvironment::start() {
  started_ = true;
  scenarios_ = SandboxEnvironment::get().state_dir() / "scenarios";
  std::filesystem::create_directories(scenarios_);
  for (const char* dir : {"tests/agent/scenarios", "tests/api/scenarios"}) {
    for (const auto& entry :
         std::filesystem::directory_iterator(std::filesystem::path(QUARRY_SOURCE_DIR) / dir)) {
      std::filesystem::copy_file(entry.path(), scenarios_ / entry.path().filename(),
                                 std::filesystem::copy_options::overwrite_existing);
    }
  }
  model_requests_ = results_dir() / "model-requests.jsonl";
  std::filesystem::remove(model_requests_);
  auto server = ScriptedModelServer::start({.scenario_dir = scenarios_, .record = model_requests_});
  if (!server) {
    ADD_FAILURE() << server.error().message;
    return;
  }
  model_ = std::move(*server);
  model_url_ = model_->base_url();
}

std::vector<nlohmann::json> ApiEnvironment::requests_to_model() const {
  std::vector<nlohmann::json> requests;
  std::ifstream in(model_requests_);
  for (std::string line; std::getline(in, line);) {
    auto parsed = nlohmann::json::parse(line);
    if (!parsed.contains("hangup")) requests.push_back(std::move(parsed));
  }
  return requests;
}

std::vector<nlohmann::json> ApiEnvironment::model_hangups() const {
  std::vector<nlohmann::json> hangups;
  std::ifstream in(model_requests_);
  for (std::string line; std::getline(in, line);) {
    auto parsed = nlohmann::json::parse(line);
    if (parsed.contains("hangup")) hangups.push_back(std::move(parsed["hangup"]));
  }
  return hangups;
}

void ApiEnvironment::load_demo_data() {
  if (demo_data_) return;
  Progress progress("seed-demo", 3);
  auto seeded = data::seed_demo(PostgresEnvironment::get().server().admin_conninfo, {}, progress);
  ASSERT_TRUE(seeded) << seeded.error().message;
  demo_data_ = true;
}

QuarryServer::QuarryServer(ServerOptions options) {
  static int counter = 0;
  auto& sandboxes = SandboxEnvironment::get();
  dir_ = sandboxes.state_dir() / "servers" / fmt::format("{}-{}", test_name(), ++counter);
  std::filesystem::create_directories(dir_);
  config_ = dir_ / "config.yml";
  state_dir_ = !options.state_dir.empty() ? options.state_dir
               : options.own_state_dir    ? dir_ / "state"
                                          : sandboxes.state_dir();
  tokens_file_ = dir_ / "tokens.json";
  log_ = results_dir() / fmt::format("{}-{}.log", test_name(), counter);
  // The server appends to it: an earlier run's lines must not answer this run's questions.
  std::filesystem::remove(log_);
  const std::string model =
      !options.model_config.empty()
          ? options.model_config
          : fmt::format(
                "  base_url: {}\n  name: {}\n  api_key_env: \"\"\n  timeout: 120s\n"
                "  max_retries: 0\n",
                ApiEnvironment::get().model_url(), options.scenario);
  std::ofstream(config_) << fmt::format(
      "sandbox:\n"
      "  export_max_rows: 50000000\n"
      "{}"
      "database:\n"
      "  url: \"{}\"\n"
      "{}"
      "conversations:\n"
      "  instance_id: {}\n"
      "{}"
      "model:\n"
      "{}"
      "server:\n"
      "{}"
      "{}"
      "{}",
      options.sandbox_config,
      options.database_url.empty() ? PostgresEnvironment::get().server().reader_conninfo
                                   : options.database_url,
      options.database_config, options.instance_id, options.conversations_config, model,
      // Named only where it is made: a tokens_file that does not exist is refused.
      options.tokens ? fmt::format("  tokens_file: {}\n", tokens_file_.string()) : "",
      options.server_config,
      options.capacity_config.empty() ? "" : "capacity:\n" + options.capacity_config);
  user_suffix_ = fmt::format("-{}", counter);
  env_ = options.env;
  if (options.tokens) {
    for (const char* name : {"alice", "bob"}) {
      std::string output;
      EXPECT_EQ(quarry({"token", "create", user(name)}, &output), 0) << output;
      tokens_[name] = output.substr(0, output.find('\n'));
    }
  }

  process_ =
      std::make_unique<ChildProcess>(quarry_argv({"--cache-dir", sandboxes.cache_dir().string(),
                                                  "serve", "--listen", options.listen}),
                                     log_);
  const std::string line = process_->line().value_or("");
  constexpr std::string_view kReady = "quarry is serving on ";
  if (!line.starts_with(kReady)) {
    if (options.expect_start) ADD_FAILURE() << "quarry serve did not start; its log:\n" << log();
    return;
  }
  url_ = line.substr(kReady.size());
}

QuarryServer::~QuarryServer() {
  stop(SIGKILL);
}

std::string QuarryServer::token(const std::string& user) const {
  auto found = tokens_.find(user);
  return found == tokens_.end() ? "" : found->second;
}

std::string QuarryServer::user(const std::string& user) const {
  return user + user_suffix_;
}

int QuarryServer::stop(int signal) {
  if (!process_ || !process_->started()) return -1;
  const int status = process_->stop(signal);
  reap_orphaned_inits();
  return status;
}

void QuarryServer::signal(int signal) const {
  if (process_ && process_->started()) ::kill(process_->pid(), signal);
}

int QuarryServer::wait() {
  if (!process_ || !process_->started()) return -1;
  const int status = process_->wait();
  reap_orphaned_inits();
  return status;
}

std::string QuarryServer::log() const {
  auto text = read_file(log_);
  return text ? *text : "";
}

std::vector<std::string> QuarryServer::quarry_argv(const std::vector<std::string>& args) const {
  auto& sandboxes = SandboxEnvironment::get();
  std::vector<std::string> argv;
  if (!env_.empty()) {
    argv.push_back("/usr/bin/env");
    argv.insert(argv.end(), env_.begin(), env_.end());
  }
  for (const auto& word : {sandboxes.quarry_binary().string(), std::string("--config"),
                           config_.string(), std::string("--state-dir"), state_dir_.string()}) {
    argv.push_back(word);
  }
  argv.insert(argv.end(), args.begin(), args.end());
  return argv;
}

int QuarryServer::quarry(const std::vector<std::string>& args, std::string* output) const {
  const auto argv = quarry_argv(args);
  auto ran = run_command(argv);
  if (ran) {
    if (output) *output = ran->output;
    return ran->exit_code;
  }
  if (output) *output = ran.error().message;
  return 1;
}

std::string ApiResponse::header(std::string_view name) const {
  HttpResponse response;
  response.headers = headers;
  return std::string(response.header(name));
}

ApiClient::ApiClient(std::string base_url) : base_url_(std::move(base_url)) {}

HttpRequest ApiClient::request(const std::string& method, const std::string& path,
                               const std::string& body, std::vector<HttpHeader> headers) const {
  HttpRequest request;
  request.method = method;
  request.url = *parse_url(base_url_);
  request.target = path;
  request.body = body;
  if (!token_.empty()) headers.push_back({"Authorization", "Bearer " + token_});
  if (!cookie_.empty()) {
    headers.push_back({"Cookie", cookie_});
    if (!csrf_.empty() && method != "GET") headers.push_back({"X-CSRF-Token", csrf_});
  }
  request.headers = std::move(headers);
  return request;
}

namespace {

// Every exchange, for tests/api/check_openapi.py to hold against the OpenAPI document.
void record(const HttpRequest& request, const ApiResponse& response) {
  static std::mutex mutex;
  nlohmann::json line = {{"test", test_name()},
                         {"method", request.method},
                         {"target", request.target},
                         {"status", response.status},
                         {"content_type", response.header("Content-Type")}};
  if (!response.json.is_discarded() && !response.json.is_null()) line["json"] = response.json;
  if (response.header("Content-Type").starts_with("text/event-stream")) {
    line["events"] = nlohmann::json::array();
    for (const auto& event : response.events) {
      // Data that is not JSON is kept as text, for the checker to refuse.
      line["events"].push_back(
          {{"id", event.id},
           {"event", event.type},
           {"data", event.data.is_discarded() ? nlohmann::json(event.raw) : event.data}});
    }
  }
  std::lock_guard lock(mutex);
  std::ofstream(results_dir() / "exchanges.jsonl", std::ios::app)
      << line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
}

}  // namespace

ApiResponse ApiClient::send(const std::string& method, const std::string& path,
                            const std::string& body, std::vector<HttpHeader> headers) {
  auto client = HttpClient::create({});
  EXPECT_TRUE(client);
  auto http = request(method, path, body, std::move(headers));
  auto sent = client->send(http);
  ApiResponse response;
  if (!sent) {
    ADD_FAILURE() << method << " " << path << ": " << sent.error().message;
    return response;
  }
  response.status = sent->status;
  response.headers = sent->headers;
  response.body = sent->body;
  response.json = nlohmann::json::parse(response.body, nullptr, false);
  record(http, response);
  return response;
}

ApiResponse ApiClient::get(const std::string& path, std::vector<HttpHeader> headers) {
  return send("GET", path, "", std::move(headers));
}

ApiResponse ApiClient::post(const std::string& path, const nlohmann::json& body,
                            std::vector<HttpHeader> headers) {
  headers.push_back({"Content-Type", "application/json"});
  return send("POST", path, body.is_null() ? "" : body.dump(), std::move(headers));
}

ApiResponse ApiClient::del(const std::string& path, std::vector<HttpHeader> headers) {
  return send("DELETE", path, "", std::move(headers));
}

ApiResponse ApiClient::stream(const std::string& method, const std::string& path,
                              const std::string& body,
                              const std::function<bool(const StreamEvent&)>& on_event,
                              std::vector<HttpHeader> headers, std::chrono::seconds timeout,
                              int cancel_fd, const std::function<void()>& on_open) {
  HttpClientOptions options;
  options.timeout = timeout;
  auto client = HttpClient::create(options);
  EXPECT_TRUE(client);
  if (!body.empty()) headers.push_back({"Content-Type", "application/json"});
  auto http = request(method, path, body, std::move(headers));
  ApiResponse response;
  agent::SseParser parser;
  bool dropped = false;
  bool opened = false;
  auto sent = client->send(
      http,
      [&](const HttpResponse& head, std::string_view piece) -> Result<void> {
        response.status = head.status;
        response.headers = head.headers;
        if (!opened && on_open) on_open();
        opened = true;
        if (!std::string_view(head.header("Content-Type")).starts_with("text/event-stream")) {
          response.body.append(piece);
          return {};
        }
        ASSIGN_OR_RETURN(auto events, parser.feed(piece));
        for (auto& event : events) {
          StreamEvent parsed{event.id, event.event,
                             nlohmann::json::parse(event.data, nullptr, false), event.data};
          response.events.push_back(parsed);
          if (on_event && !on_event(parsed)) {
            dropped = true;
            return make_error(ErrorCode::kCancelled, "the test dropped the stream");
          }
        }
        return {};
      },
      cancel_fd);
  dropped = dropped || (!sent && sent.error().code == ErrorCode::kCancelled);
  if (!sent && !dropped && !expect_breaks_) {
    ADD_FAILURE() << method << " " << path << ": " << sent.error().message;
  }
  if (sent) response.status = sent->status;
  if (!response.body.empty()) response.json = nlohmann::json::parse(response.body, nullptr, false);
  record(http, response);
  return response;
}

ApiResponse ApiClient::ask(const std::string& conversation, const std::string& question) {
  return stream("POST", fmt::format("/api/v1/conversations/{}/messages", conversation),
                nlohmann::json({{"content", question}}).dump());
}

ApiResponse ApiClient::cell(const std::string& conversation, const std::string& kind,
                            const std::string& code, const std::string& filename) {
  nlohmann::json body = {{"kind", kind}, {"code", code}};
  if (!filename.empty()) body["filename"] = filename;
  return stream("POST", fmt::format("/api/v1/conversations/{}/cells", conversation), body.dump());
}

std::string ApiClient::create_conversation(const std::string& title) {
  auto created = post("/api/v1/conversations", title.empty() ? nlohmann::json::object()
                                                             : nlohmann::json({{"title", title}}));
  EXPECT_EQ(created.status, 201) << created.body;
  return created.json.value("id", "");
}

BackgroundStream::BackgroundStream(ApiClient client, std::string method, std::string path,
                                   std::string body, std::vector<HttpHeader> headers)
    : client_(std::move(client)), cancel_fd_(::eventfd(0, EFD_CLOEXEC)) {
  thread_ = std::thread([this, method = std::move(method), path = std::move(path),
                         body = std::move(body), headers = std::move(headers)] {
    auto response = client_.stream(
        method, path, body,
        [this](const StreamEvent& event) {
          std::lock_guard lock(mutex_);
          events_.push_back(event);
          changed_.notify_all();
          return true;
        },
        headers, std::chrono::seconds(300), cancel_fd_,
        [this] {
          std::lock_guard lock(mutex_);
          open_ = true;
          changed_.notify_all();
        });
    std::lock_guard lock(mutex_);
    response_ = std::move(response);
    ended_ = true;
    changed_.notify_all();
  });
}

BackgroundStream::~BackgroundStream() {
  drop();
  if (thread_.joinable()) thread_.join();
  ::close(cancel_fd_);
}

std::optional<StreamEvent> BackgroundStream::wait_for(
    const std::function<bool(const StreamEvent&)>& match, std::chrono::seconds timeout) {
  std::unique_lock lock(mutex_);
  std::optional<StreamEvent> found;
  changed_.wait_for(lock, timeout, [&] {
    for (const auto& event : events_) {
      if (match(event)) {
        found = event;
        return true;
      }
    }
    return ended_;
  });
  return found;
}

std::optional<StreamEvent> BackgroundStream::wait_for_type(std::string_view type,
                                                           std::chrono::seconds timeout) {
  return wait_for([type](const StreamEvent& event) { return event.type == type; }, timeout);
}

bool BackgroundStream::wait_open(std::chrono::seconds timeout) {
  std::unique_lock lock(mutex_);
  changed_.wait_for(lock, timeout, [&] { return open_ || ended_; });
  return open_;
}

void BackgroundStream::drop() {
  const uint64_t one = 1;
  (void)!::write(cancel_fd_, &one, sizeof one);
}

ApiResponse BackgroundStream::finish() {
  if (thread_.joinable()) thread_.join();
  std::lock_guard lock(mutex_);
  return response_;
}

struct KeptConnection::State {
  net::io_context io;
  beast::tcp_stream stream{io};
  beast::flat_buffer buffer;
};

KeptConnection::KeptConnection(ApiClient client)
    : client_(std::move(client)), state_(std::make_unique<State>()) {
  auto url = parse_url(client_.base_url_);
  EXPECT_TRUE(url);
  if (!url) return;
  boost::system::error_code error;
  state_->stream.expires_after(std::chrono::seconds(10));
  state_->stream.connect(
      tcp::endpoint(net::ip::make_address(url->host, error), static_cast<uint16_t>(url->port)),
      error);
  EXPECT_FALSE(error) << "connecting to " << client_.base_url_ << ": " << error.message();
}

KeptConnection::~KeptConnection() {
  boost::system::error_code ignored;
  state_->stream.socket().close(ignored);
}

ApiResponse KeptConnection::send(const std::string& method, const std::string& path,
                                 const std::string& body, std::vector<HttpHeader> headers) {
  if (!body.empty()) headers.push_back({"Content-Type", "application/json"});
  const HttpRequest request = client_.request(method, path, body, std::move(headers));
  http::request<http::string_body> out{http::string_to_verb(method), request.target, 11};
  out.set(http::field::host, fmt::format("{}:{}", request.url.host, request.url.port));
  out.keep_alive(true);
  for (const auto& header : request.headers)
    out.set(header.name, header.value);
  out.body() = body;
  out.prepare_payload();
  ApiResponse response;
  boost::system::error_code error;
  state_->stream.expires_after(std::chrono::seconds(60));
  http::write(state_->stream, out, error);
  http::response<http::string_body> in;
  if (!error) http::read(state_->stream, state_->buffer, in, error);
  if (error) {
    ADD_FAILURE() << method << " " << path << " on a kept connection: " << error.message();
    return response;
  }
  response.status = static_cast<int>(in.result_int());
  for (const auto& field : in)
    response.headers.push_back({std::string(field.name_string()), std::string(field.value())});
  response.body = in.body();
  response.json = nlohmann::json::parse(response.body, nullptr, false);
  record(request, response);
  return response;
}

bool KeptConnection::closed_by_server() {
  boost::system::error_code error;
  char byte;
  state_->stream.expires_after(std::chrono::seconds(1));
  state_->stream.read_some(net::buffer(&byte, 1), error);
  return error == net::error::eof || error == net::error::connection_reset;
}

std::vector<StreamEvent> of_type(const std::vector<StreamEvent>& events, std::string_view type) {
  std::vector<StreamEvent> found;
  for (const auto& event : events) {
    if (event.type == type) found.push_back(event);
  }
  return found;
}

std::string printed(const std::vector<StreamEvent>& events) {
  std::string text;
  for (const auto& event : of_type(events, "output"))
    text += event.data["text"].get<std::string>();
  return text;
}

HungDatabase::HungDatabase() {
  listener_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof address;
  EXPECT_EQ(::bind(listener_, reinterpret_cast<sockaddr*>(&address), length), 0);
  EXPECT_EQ(::listen(listener_, 64), 0);
  EXPECT_EQ(::getsockname(listener_, reinterpret_cast<sockaddr*>(&address), &length), 0);
  port_ = ntohs(address.sin_port);
  thread_ = std::thread([this] {
    while (!stop_) {
      pollfd ready{listener_, POLLIN, 0};
      if (::poll(&ready, 1, 50) != 1) continue;
      if (int connection = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC); connection >= 0) {
        held_.push_back(connection);
        ++accepted_;
      }
    }
  });
}

HungDatabase::~HungDatabase() {
  stop_ = true;
  thread_.join();
  for (int connection : held_)
    ::close(connection);
  ::close(listener_);
}

std::string HungDatabase::url() const {
  return fmt::format("postgresql://quarry_reader@127.0.0.1:{}/analytics", port_);
}

}  // namespace quarry::testing

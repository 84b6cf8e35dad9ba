// scripted_model_server: a test double for the language model. It speaks OpenAI's
// chat-completions protocol over HTTP/1.1 on 127.0.0.1 (streamed or not) and answers from
// scenario files (README.md). Never installed and never a default: tests start it.
#include <poll.h>
#include <signal.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "agent/openai_protocol.h"
#include "message_rules.h"
#include "responder.h"
#include "scenario.h"

namespace quarry::scripted_model {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using nlohmann::json;

struct Options {
  uint16_t port = 0;
  std::string scenario;      // served when no file in scenario_dir matches the model
  std::string scenario_dir;  // <dir>/<model>.yml per request
  std::string api_key;       // when set, requests need "Authorization: Bearer <key>"
  std::string record;        // a file that gets one JSON line per request
  std::string tls_cert;      // PEM certificate chain and key: serve https
  std::string tls_key;
  size_t chunk_size = 8;
};

// What the server remembers across requests: only how often each fault has fired.
class FaultCounter {
 public:
  // True while the fault at `key` has fired fewer than `times` times; counts this one.
  bool fire(const std::string& key, int times) {
    std::lock_guard lock(mutex_);
    return ++fired_[key] <= times;
  }

 private:
  std::mutex mutex_;
  std::map<std::string, int> fired_;
};

struct Server {
  Options options;
  FaultCounter faults;
  std::mutex record_mutex;
  std::atomic<uint64_t> next_id{1};
};

using Response = http::response<http::string_body>;

Response json_response(int status, const json& body) {
  Response response{static_cast<http::status>(status), 11};
  response.set(http::field::content_type, "application/json");
  response.body() = body.dump(-1, ' ', false, json::error_handler_t::replace);
  response.prepare_payload();
  return response;
}

// An error in OpenAI's shape: {"error": {"message", "type", "param", "code"}}.
Response error_response(int status, std::string_view message, std::string_view type,
                        std::string_view code = {}, std::string_view param = {}) {
  json error = {{"message", message}, {"type", type}};
  error["param"] = param.empty() ? json(nullptr) : json(param);
  error["code"] = code.empty() ? json(nullptr) : json(code);
  return json_response(status, {{"error", error}});
}

bool safe_model_name(std::string_view name) {
  return !name.empty() && name.size() <= 128 && name.front() != '.' &&
         std::all_of(name.begin(), name.end(), [](unsigned char c) {
           return std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == ':';
         });
}

// The scenario file for a model name, or "" if there is none.
std::filesystem::path scenario_path(const Options& options, std::string_view model) {
  if (!options.scenario_dir.empty() && safe_model_name(model)) {
    for (const char* extension : {".yml", ".yaml"}) {
      auto path = std::filesystem::path(options.scenario_dir) / (std::string(model) + extension);
      std::error_code ignored;
      if (std::filesystem::is_regular_file(path, ignored)) return path;
    }
  }
  return options.scenario;
}

std::vector<std::string> model_names(const Options& options) {
  std::vector<std::string> names;
  if (!options.scenario.empty()) {
    names.push_back(std::filesystem::path(options.scenario).stem().string());
  }
  std::error_code error;
  if (!options.scenario_dir.empty()) {
    for (const auto& entry : std::filesystem::directory_iterator(options.scenario_dir, error)) {
      const auto extension = entry.path().extension();
      if (extension == ".yml" || extension == ".yaml")
        names.push_back(entry.path().stem().string());
    }
  }
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  return names;
}

void record(Server& server, const http::request<http::string_body>& request) {
  if (server.options.record.empty()) return;
  json body = json::parse(request.body(), nullptr, /*allow_exceptions=*/false);
  json line = {{"method", std::string(request.method_string())},
               {"target", std::string(request.target())},
               {"authorization", std::string(request[http::field::authorization])},
               {"body", body.is_discarded() ? json(request.body()) : body}};
  std::lock_guard lock(server.record_mutex);
  std::ofstream(server.options.record, std::ios::app)
      << line.dump(-1, ' ', false, json::error_handler_t::replace) << "\n";
}

// A client that closed its connection while a step waited (in a delay, between chunks or in a
// stall): one line {"hangup": {...}} in the record, so a test can tell that its client gave up
// the request instead of waiting it out.
void record_hangup(Server& server, std::string_view model, size_t step, std::string_view during,
                   std::chrono::steady_clock::time_point since) {
  const double waited_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - since).count();
  std::fprintf(stderr, "scripted_model_server: the client of '%.*s' step %zu hung up during %.*s\n",
               static_cast<int>(model.size()), model.data(), step, static_cast<int>(during.size()),
               during.data());
  if (server.options.record.empty()) return;
  json line = {{"hangup",
                {{"model", model},
                 {"step", step},
                 {"during", during},
                 {"waited_ms", std::round(waited_ms)}}}};
  std::lock_guard lock(server.record_mutex);
  std::ofstream(server.options.record, std::ios::app) << line.dump() << "\n";
}

// Waits up to `duration` and returns false early if the client hung up meanwhile.
bool wait_for_client(int fd, Duration duration) {
  const auto deadline = std::chrono::steady_clock::now() + duration;
  for (;;) {
    const auto left =
        std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return true;
    pollfd watch{.fd = fd, .events = POLLRDHUP, .revents = 0};
    const int ready = ::poll(&watch, 1, static_cast<int>(std::min<int64_t>(left.count(), 1000)));
    if (ready > 0) return false;
  }
}

// One connection: requests until the client closes or a scripted fault ends it.
template <typename Stream>
class Session {
 public:
  Session(Server& server, Stream& stream, int fd) : server_(server), stream_(stream), fd_(fd) {}

  void run() {
    beast::flat_buffer buffer;
    for (;;) {
      http::request_parser<http::string_body> parser;
      parser.body_limit(256 * 1024 * 1024);
      beast::error_code error;
      http::read(stream_, buffer, parser, error);
      if (error) return;
      auto request = parser.release();
      if (!handle(request) || !request.keep_alive()) return;
    }
  }

 private:
  // Returns whether the connection may carry another request.
  bool handle(const http::request<http::string_body>& request) {
    record(server_, request);
    const Options& options = server_.options;
    std::string target(request.target());
    target = target.substr(0, target.find('?'));
    if (!options.api_key.empty() &&
        request[http::field::authorization] != "Bearer " + options.api_key) {
      return send(error_response(401,
                                 request[http::field::authorization].empty()
                                     ? "You didn't provide an API key."
                                     : "Incorrect API key provided.",
                                 "invalid_request_error", "invalid_api_key"),
                  request);
    }
    if (target == "/v1/models" || target == "/models") {
      json data = json::array();
      for (const auto& name : model_names(options)) {
        data.push_back({{"id", name}, {"object", "model"}, {"created", 0}, {"owned_by", "quarry"}});
      }
      return send(json_response(200, {{"object", "list"}, {"data", data}}), request);
    }
    if (target != "/v1/chat/completions" && target != "/chat/completions") {
      return send(error_response(404, fmt::format("no route {}", target), "invalid_request_error"),
                  request);
    }
    if (request.method() != http::verb::post) {
      return send(error_response(405, "use POST", "invalid_request_error"), request);
    }
    return complete(request);
  }

  bool complete(const http::request<http::string_body>& request) {
    json body = json::parse(request.body(), nullptr, /*allow_exceptions=*/false);
    if (!body.is_object()) {
      return send(error_response(400, "the body must be a JSON object", "invalid_request_error"),
                  request);
    }
    // Before the scenario: a request the real API would refuse is refused even when the
    // scenario would answer it.
    if (auto broken = check_messages(body)) return refuse_invalid(request, *broken);
    const std::string model = body.value("model", "");
    const auto path = scenario_path(server_.options, model);
    if (path.empty()) {
      return send(
          error_response(404,
                         fmt::format("The model '{}' does not exist (no scenario {}/{}.yml)", model,
                                     server_.options.scenario_dir, model),
                         "invalid_request_error", "model_not_found"),
          request);
    }
    auto scenario = load_scenario(path);
    if (!scenario) return refuse(request, scenario.error().message);

    Conversation conversation;
    for (const auto& message : body["messages"]) {
      auto parsed = agent::message_from_json(message);
      if (!parsed) {
        return send(error_response(400, parsed.error().message, "invalid_request_error"), request);
      }
      conversation.messages.push_back(std::move(*parsed));
    }
    if (auto tools = body.find("tools"); tools != body.end() && tools->is_array()) {
      for (const auto& tool : *tools) {
        if (tool.is_object() && tool.contains("function") && tool["function"].is_object()) {
          conversation.tools.push_back(tool["function"].value("name", ""));
        }
      }
    }

    auto index = step_index(*scenario, conversation);
    if (!index) return refuse(request, index.error().message);
    const Step& step = scenario->steps[*index];
    if (auto failure = step.expect.failure(conversation); !failure.empty()) {
      return refuse(request, fmt::format("scenario '{}' step {} ({}:{}): {}", scenario->name,
                                         *index, scenario->source, step.line, failure));
    }
    if (step.fail &&
        server_.faults.fire(fmt::format("{}#{}", path.string(), *index), step.fail->times)) {
      if (step.fail->disconnect) return false;
      auto response =
          error_response(step.fail->status, step.fail->message,
                         step.fail->status == 429 ? "rate_limit_exceeded" : "server_error");
      if (!step.fail->retry_after.empty()) {
        response.set(http::field::retry_after, step.fail->retry_after);
      }
      return send(std::move(response), request);
    }
    auto reply = choose_reply(*scenario, *index, conversation);
    if (!reply) return refuse(request, reply.error().message);
    if (auto failure = unoffered_tool_failure(*scenario, *index, **reply, conversation,
                                              body.value("tool_choice", json()));
        !failure.empty()) {
      return refuse(request, failure);
    }
    if (step.delay.count() > 0 && !wait(model, *index, "delay", step.delay)) return false;

    ReplyContext context;
    context.id = fmt::format("chatcmpl-scripted-{}", server_.next_id++);
    context.model = model;
    context.created = std::chrono::duration_cast<std::chrono::seconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
    context.step = *index;
    context.chunk_size = step.chunk_size > 0 ? step.chunk_size : server_.options.chunk_size;
    context.include_usage = body.contains("stream_options") && body["stream_options"].is_object() &&
                            body["stream_options"].value("include_usage", false);
    std::string prompt;
    for (const auto& message : conversation.messages)
      prompt += message.content;
    context.usage.prompt_tokens = estimate_tokens(prompt);
    std::string reply_text = (*reply)->content;
    for (const auto& call : (*reply)->tool_calls)
      reply_text += call.name + call.arguments;
    context.usage.completion_tokens = estimate_tokens(reply_text);

    if (!body.value("stream", false)) {
      return send(json_response(200, completion_json(**reply, context)), request);
    }
    return stream(**reply, context, step);
  }

  // A request the scenario cannot answer: HTTP 400 (clients do not retry it) whose message
  // says why, also on stderr for whoever reads the test's log.
  bool refuse(const http::request<http::string_body>& request, const std::string& message) {
    std::fprintf(stderr, "scripted_model_server: %s\n", message.c_str());
    return send(error_response(400, message, "scenario_error", "scenario_mismatch"), request);
  }

  // A request that breaks OpenAI's message rules: HTTP 400 in OpenAI's words, also on stderr.
  bool refuse_invalid(const http::request<http::string_body>& request,
                      const RuleViolation& broken) {
    std::fprintf(stderr, "scripted_model_server: %s (param %s)\n", broken.message.c_str(),
                 broken.param.empty() ? "null" : broken.param.c_str());
    return send(
        error_response(400, broken.message, "invalid_request_error", broken.code, broken.param),
        request);
  }

  bool stream(const Reply& reply, const ReplyContext& context, const Step& step) {
    http::response<http::empty_body> head{http::status::ok, 11};
    head.set(http::field::content_type, "text/event-stream");
    head.set(http::field::cache_control, "no-cache");
    head.chunked(true);
    http::response_serializer<http::empty_body> serializer{head};
    beast::error_code error;
    http::write_header(stream_, serializer, error);
    if (error) return false;
    const auto events = stream_events(reply, context);
    for (size_t i = 0; i < events.size(); ++i) {
      if (i > 0 && step.chunk_delay.count() > 0 &&
          !wait(context.model, context.step, "chunk_delay", step.chunk_delay)) {
        return false;
      }
      const std::string frame = fmt::format("data: {}\n\n", events[i]);
      net::write(stream_, http::make_chunk(net::buffer(frame)), error);
      if (error) return false;
      if (step.stall) {
        // Sent the first chunk; now nothing more until the client gives up.
        wait(context.model, context.step, "stall", std::chrono::minutes(10));
        return false;
      }
    }
    net::write(stream_, http::make_chunk_last(), error);
    return !error;
  }

  // wait_for_client, recording a client that hung up meanwhile.
  bool wait(std::string_view model, size_t step, std::string_view during, Duration duration) {
    const auto since = std::chrono::steady_clock::now();
    if (wait_for_client(fd_, duration)) return true;
    record_hangup(server_, model, step, during, since);
    return false;
  }

  bool send(Response response, const http::request<http::string_body>& request) {
    response.keep_alive(request.keep_alive());
    beast::error_code error;
    http::write(stream_, response, error);
    return !error;
  }

  Server& server_;
  Stream& stream_;
  int fd_;
};

void serve_connection(Server& server, net::ssl::context* tls, tcp::socket& socket) {
  const int fd = socket.native_handle();
  if (tls == nullptr) {
    Session<tcp::socket>(server, socket, fd).run();
  } else {
    net::ssl::stream<tcp::socket&> stream(socket, *tls);
    beast::error_code error;
    stream.handshake(net::ssl::stream_base::server, error);
    if (error) return;
    Session<net::ssl::stream<tcp::socket&>>(server, stream, fd).run();
    stream.shutdown(error);
  }
}

void serve(Server& server, net::ssl::context* tls, tcp::socket socket) {
  try {
    serve_connection(server, tls, socket);
  } catch (const std::exception& error) {
    // A request of a shape the server did not foresee: drop the connection, keep serving.
    std::fprintf(stderr, "scripted_model_server: %s\n", error.what());
  }
  beast::error_code ignored;
  socket.shutdown(tcp::socket::shutdown_both, ignored);
}

int run(const Options& options) {
  ::signal(SIGPIPE, SIG_IGN);
  Server server;
  server.options = options;
  std::unique_ptr<net::ssl::context> tls;
  if (!options.tls_cert.empty()) {
    tls = std::make_unique<net::ssl::context>(net::ssl::context::tls_server);
    tls->use_certificate_chain_file(options.tls_cert);
    tls->use_private_key_file(options.tls_key, net::ssl::context::pem);
  }
  net::io_context io;
  tcp::acceptor acceptor(io, tcp::endpoint(net::ip::make_address("127.0.0.1"), options.port));
  std::printf("listening 127.0.0.1:%u\n", acceptor.local_endpoint().port());
  std::fflush(stdout);
  for (;;) {
    tcp::socket socket(io);
    beast::error_code error;
    acceptor.accept(socket, error);
    if (error) continue;
    std::thread(serve, std::ref(server), tls.get(), std::move(socket)).detach();
  }
}

}  // namespace
}  // namespace quarry::scripted_model

int main(int argc, char** argv) {
  quarry::scripted_model::Options options;
  CLI::App app{
      "scripted_model_server: answers OpenAI chat completions from scenario files (a test "
      "double)"};
  app.add_option("--port", options.port, "port on 127.0.0.1; 0 picks a free one")
      ->capture_default_str();
  app.add_option("--scenario", options.scenario, "the scenario file for every model name")
      ->check(CLI::ExistingFile);
  app.add_option("--scenario-dir", options.scenario_dir,
                 "a directory of scenarios: the request's model M is answered from M.yml")
      ->check(CLI::ExistingDirectory);
  app.add_option("--api-key", options.api_key, "answer 401 without 'Authorization: Bearer KEY'");
  app.add_option("--record", options.record, "append each request as a JSON line to this file");
  app.add_option("--tls-cert", options.tls_cert, "PEM certificate chain: serve https")
      ->check(CLI::ExistingFile);
  app.add_option("--tls-key", options.tls_key, "PEM private key of --tls-cert")
      ->check(CLI::ExistingFile);
  app.add_option("--chunk-size", options.chunk_size, "bytes of content per streamed chunk")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  CLI11_PARSE(app, argc, argv);
  if (options.scenario.empty() && options.scenario_dir.empty()) {
    std::cerr << "scripted_model_server: give --scenario FILE, --scenario-dir DIR or both\n";
    return 2;
  }
  if (options.tls_cert.empty() != options.tls_key.empty()) {
    std::cerr << "scripted_model_server: --tls-cert and --tls-key go together\n";
    return 2;
  }
  try {
    return quarry::scripted_model::run(options);
  } catch (const std::exception& error) {
    std::cerr << "scripted_model_server: " << error.what() << "\n";
    return 1;
  }
}

#include "agent/model_client.h"

#include <poll.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <mutex>
#include <random>
#include <thread>

#include "agent/openai_protocol.h"
#include "agent/sse_parser.h"
#include "agent/stream_assembler.h"
#include "common/http_client.h"
#include "common/json.h"
#include "common/retry_policy.h"
#include "common/url.h"

namespace quarry::agent {
namespace {

using nlohmann::json;
using TextHandler = std::function<void(std::string_view)>;

// The longest Retry-After quarry waits for; a server that asks for more has given its answer.
constexpr Duration kMaxRetryAfter = std::chrono::seconds(60);
// Error bodies are kept only this long (their message is all that matters).
constexpr size_t kMaxErrorBody = 64 * 1024;

// One failed attempt, and whether trying again may help.
struct Failure {
  Error error{};
  bool retryable = false;
  std::optional<Duration> retry_after{};  // what the server asked for
};

std::string shorten(std::string_view text) {
  constexpr size_t kLimit = 200;
  if (text.size() <= kLimit) return std::string(text);
  return fmt::format("{}...", text.substr(0, kLimit));
}

// Waits `delay`, or less when cancel_fd becomes readable (then kCancelled).
Result<void> sleep_unless_cancelled(Duration delay, int cancel_fd) {
  if (cancel_fd < 0) {
    std::this_thread::sleep_for(delay);
    return {};
  }
  const auto deadline = std::chrono::steady_clock::now() + delay;
  for (;;) {
    const auto left =
        std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return {};
    pollfd watch{.fd = cancel_fd, .events = POLLIN, .revents = 0};
    const int ready = ::poll(&watch, 1, static_cast<int>(std::min<int64_t>(left.count(), 60'000)));
    if (ready > 0) return make_error(ErrorCode::kCancelled, "cancelled");
    if (ready < 0 && errno != EINTR) return errno_error("poll(cancel fd {})", cancel_fd);
  }
}

class OpenAiCompatibleClient final : public ModelClient {
 public:
  OpenAiCompatibleClient(ModelConfig config, Url base_url, std::string api_key, HttpClient http)
      : config_(std::move(config)),
        base_url_(std::move(base_url)),
        api_key_(std::move(api_key)),
        http_(std::move(http)) {}

  Result<ChatResponse> complete(const ChatRequest& request, const TextHandler& on_text,
                                int cancel_fd) override {
    // Tool output can hold bytes that are not UTF-8; they are replaced rather than refused.
    const std::string body =
        chat_request_json(
            request, {.model = config_.name, .temperature = config_.temperature, .stream = true})
            .dump(-1, ' ', false, json::error_handler_t::replace);
    const uint32_t attempts = config_.max_retries + 1;
    for (uint32_t attempt = 1;; ++attempt) {
      bool delivered = false;
      auto result = attempt_once(body, on_text, cancel_fd, delivered);
      if (result) return std::move(*result);
      Failure& failure = result.error();
      if (!failure.retryable || delivered) return std::unexpected(std::move(failure.error));
      if (attempt >= attempts) {
        if (attempts > 1) {
          failure.error.message += fmt::format(
              "; gave up after {} attempts (model.max_retries: {})", attempts, config_.max_retries);
        }
        return std::unexpected(std::move(failure.error));
      }
      const Duration delay =
          failure.retry_after ? *failure.retry_after : backoff_delay(attempt, random01());
      if (delay > kMaxRetryAfter) {
        failure.error.message += fmt::format(
            "; the server asks to wait {} before trying again, longer than quarry "
            "waits ({})",
            format_duration(delay), format_duration(kMaxRetryAfter));
        return std::unexpected(std::move(failure.error));
      }
      spdlog::warn("model: {}; trying again in {} (attempt {} of {})", failure.error.message,
                   format_duration(delay), attempt + 1, attempts);
      RETURN_IF_ERROR(sleep_unless_cancelled(delay, cancel_fd));
    }
  }

 private:
  // One HTTP request. `delivered` is set once text has gone to `on_text`: from then on a
  // failure must not be retried, or the caller would see the text twice.
  std::expected<ChatResponse, Failure> attempt_once(const std::string& body,
                                                    const TextHandler& on_text, int cancel_fd,
                                                    bool& delivered) {
    HttpRequest request;
    request.method = "POST";
    request.url = base_url_;
    request.target = base_url_.target("/chat/completions");
    request.headers = {{"Content-Type", "application/json"}, {"Accept", "text/event-stream"}};
    if (!api_key_.empty()) request.headers.push_back({"Authorization", "Bearer " + api_key_});
    request.body = body;

    // What the body turned out to be, decided by its first piece.
    enum class Kind { kUnknown, kEvents, kJson, kError } kind = Kind::kUnknown;
    std::string collected;  // a JSON answer or an error body
    SseParser events;
    StreamAssembler assembler;
    bool done = false;  // "data: [DONE]" arrived
    const TextHandler text = [&](std::string_view piece) {
      delivered = true;
      if (on_text) on_text(piece);
    };
    auto on_body = [&](const HttpResponse& head, std::string_view piece) -> Result<void> {
      if (kind == Kind::kUnknown) {
        kind = head.status != 200 ? Kind::kError
               : head.header("Content-Type").find("text/event-stream") != std::string_view::npos
                   ? Kind::kEvents
                   : Kind::kJson;
      }
      if (kind != Kind::kEvents) {
        // A complete JSON answer (a server that ignores "stream") is held whole, up to the
        // HTTP client's body limit.
        const size_t limit = kind == Kind::kError ? kMaxErrorBody : http_.options().max_body_bytes;
        if (collected.size() + piece.size() > limit) {
          if (kind == Kind::kJson) {
            return make_error(ErrorCode::kInternal, "{} sent an answer larger than {}",
                              base_url_.to_string(), format_size(limit));
          }
          piece = piece.substr(0, limit - std::min(limit, collected.size()));
        }
        collected.append(piece);
        return {};
      }
      ASSIGN_OR_RETURN(auto batch, events.feed(piece));
      for (const auto& event : batch) {
        if (done) break;
        if (event.data == "[DONE]") {
          done = true;
          break;
        }
        json chunk = parse_json_or_discarded(event.data);
        if (chunk.is_discarded()) {
          return make_error(ErrorCode::kInternal, "{} sent a stream event that is not JSON: {}",
                            base_url_.to_string(), shorten(event.data));
        }
        RETURN_IF_ERROR(assembler.add(chunk, text));
      }
      return {};
    };

    auto response = http_.send(request, on_body, cancel_fd);
    if (!response) return std::unexpected(transport_failure(std::move(response).error()));
    if (response->status != 200) {
      return std::unexpected(status_failure(response->status, *response, collected));
    }
    if (kind == Kind::kEvents) {
      if (!done && !assembler.finished()) {
        return std::unexpected(
            Failure{.error = {ErrorCode::kUnavailable,
                              fmt::format("the answer from {} ended before it was complete",
                                          base_url_.to_string())},
                    .retryable = true});
      }
      return assembler.take();
    }
    // A server that ignored "stream": true answers with one JSON object.
    json parsed = parse_json_or_discarded(collected);
    if (parsed.is_discarded()) {
      return std::unexpected(
          Failure{.error = {ErrorCode::kInternal,
                            fmt::format("{} answered with neither an event stream nor JSON: '{}'",
                                        base_url_.to_string(), shorten(collected))}});
    }
    auto answer = chat_response_from_json(parsed);
    if (!answer) {
      Error error = std::move(answer).error().with_context(base_url_.to_string());
      const bool retryable = error.code == ErrorCode::kUnavailable;
      return std::unexpected(Failure{.error = std::move(error), .retryable = retryable});
    }
    if (!answer->message.content.empty()) text(answer->message.content);
    return std::move(*answer);
  }

  Failure transport_failure(Error error) const {
    Failure failure;
    failure.retryable = error.code == ErrorCode::kUnavailable;
    if (error.code == ErrorCode::kUnavailable && error.message.starts_with("cannot reach")) {
      error.message += "; is the model server running? (model.base_url)";
    } else if (error.code == ErrorCode::kDeadlineExceeded) {
      error.message += " (model.timeout)";
    } else if (error.code == ErrorCode::kFailedPrecondition) {
      error.message += "; model.ca_file names a CA file to trust instead";
    }
    failure.error = std::move(error);
    return failure;
  }

  Failure status_failure(int status, const HttpResponse& head, std::string_view body) const {
    const std::string reason = error_message_from_body(body);
    const std::string detail = reason.empty() ? fmt::format("HTTP {}", status)
                                              : fmt::format("HTTP {}: {}", status, reason);
    const std::string url = base_url_.to_string();
    Failure failure;
    auto fail = [&](ErrorCode code, std::string message) {
      failure.error = Error{code, std::move(message)};
    };
    if (status == 401) {
      if (api_key_.empty()) {
        fail(ErrorCode::kPermissionDenied,
             fmt::format("{} wants an API key ({}); {}", url, detail,
                         config_.api_key_env.empty()
                             ? std::string("set model.api_key_env to the variable that holds it")
                             : fmt::format("set {} (model.api_key_env)", config_.api_key_env)));
      } else {
        fail(ErrorCode::kPermissionDenied,
             fmt::format("{} rejected the API key ({}); check {} (model.api_key_env)", url, detail,
                         config_.api_key_env));
      }
    } else if (status == 403) {
      fail(ErrorCode::kPermissionDenied,
           fmt::format("{} refused the request ({}); the API key in {} may not have access to "
                       "model '{}'",
                       url, detail, config_.api_key_env, config_.name));
    } else if (status == 404) {
      fail(ErrorCode::kNotFound,
           fmt::format("{}/chat/completions or the model '{}' was not found ({}); check "
                       "model.base_url (OpenAI-compatible servers usually end in /v1) and "
                       "model.name",
                       url, config_.name, detail));
    } else if (status == 400 || status == 413 || status == 422) {
      fail(ErrorCode::kInvalidArgument, fmt::format("{} refused the request ({})", url, detail));
    } else if (status == 429) {
      if (error_code_from_body(body) == "insufficient_quota") {
        fail(ErrorCode::kResourceExhausted,
             fmt::format("{} says the account is out of quota ({})", url, detail));
        return failure;  // waiting does not add quota
      }
      fail(ErrorCode::kResourceExhausted,
           fmt::format("{} is limiting the rate of requests ({})", url, detail));
    } else if (status >= 500 || status == 408) {
      fail(ErrorCode::kUnavailable, fmt::format("{} failed to answer ({})", url, detail));
    } else if (status >= 300 && status < 400 && !head.header("Location").empty()) {
      fail(ErrorCode::kInvalidArgument,
           fmt::format("{} redirects (HTTP {}) to {}; set model.base_url to where it points", url,
                       status, head.header("Location")));
    } else {
      fail(ErrorCode::kInternal, fmt::format("{} answered with an unexpected {}", url, detail));
    }
    if (is_retryable_status(status)) {
      failure.retryable = true;
      failure.retry_after = parse_retry_after_ms(head.header("retry-after-ms"));
      if (!failure.retry_after) {
        failure.retry_after =
            parse_retry_after(head.header("Retry-After"), std::chrono::system_clock::now());
      }
    }
    return failure;
  }

  double random01() {
    std::lock_guard lock(random_mutex_);
    return std::uniform_real_distribution<double>(0, 1)(random_);
  }

  const ModelConfig config_;
  const Url base_url_;
  const std::string api_key_;
  const HttpClient http_;
  std::mutex random_mutex_;  // complete() may run on several threads at once
  std::mt19937_64 random_{std::random_device{}()};
};

}  // namespace

Result<std::unique_ptr<ModelClient>> make_model_client(const ModelConfig& config) {
  auto base_url = parse_url(config.base_url);
  if (!base_url) return std::unexpected(std::move(base_url).error().with_context("model.base_url"));
  std::string api_key;
  if (!config.api_key_env.empty()) {
    const char* value = std::getenv(config.api_key_env.c_str());
    if (value != nullptr && *value != '\0') {
      api_key = value;
    } else if (!is_loopback_host(base_url->host)) {
      return make_error(ErrorCode::kFailedPrecondition,
                        "set {} (model.api_key_env) to the API key for {}; a server that needs "
                        "no key: model.api_key_env: \"\"",
                        config.api_key_env, base_url->to_string());
    }
  }
  if (std::any_of(api_key.begin(), api_key.end(),
                  [](unsigned char c) { return c <= ' ' || c == 0x7f; })) {
    return make_error(ErrorCode::kInvalidArgument,
                      "the API key in {} contains spaces or control characters; copy it again",
                      config.api_key_env);
  }
  HttpClientOptions options;
  options.connect_timeout = config.connect_timeout;
  options.timeout = config.timeout;
  options.ca_file = config.ca_file;
  auto http = HttpClient::create(options);
  if (!http) {
    return std::unexpected(std::move(http).error().with_context(
        config.ca_file.empty() ? std::string_view("model") : std::string_view("model.ca_file")));
  }
  return std::make_unique<OpenAiCompatibleClient>(config, std::move(*base_url), std::move(api_key),
                                                  std::move(*http));
}

}  // namespace quarry::agent

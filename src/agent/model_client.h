// The agent's language model: streamed chat completions with tools, from any server that
// speaks OpenAI's chat-completions protocol (OpenAI, llama.cpp, vLLM, Ollama, a
// gateway, or the scripted model server of the tests).
#pragma once

#include <functional>
#include <memory>
#include <string_view>

#include "agent/chat.h"
#include "common/error.h"
#include "config/config.h"

namespace quarry::agent {

// Implementations are thread-safe: several conversations may share one client.
class ModelClient {
 public:
  virtual ~ModelClient() = default;

  // One streamed chat completion. `on_text` gets the assistant's text deltas as they arrive
  // (it may be empty). Tool-call deltas are assembled into message.tool_calls. When `cancel_fd`
  // (>= 0) becomes readable the call stops with kCancelled, also while it waits to retry.
  //
  // Failures are retried (429, 408, 5xx, broken connections) with backoff, up to
  // model.max_retries, but never once text has reached `on_text`. Errors say what to do:
  //   kFailedPrecondition  TLS certificate not accepted
  //   kPermissionDenied    401/403: the key is wrong or lacks access
  //   kNotFound            404: wrong model.base_url or model.name
  //   kInvalidArgument     400/413/422: the server's reason
  //   kResourceExhausted   429 after the last retry, or out of quota
  //   kUnavailable         cannot connect, 5xx after the last retry, stream cut short
  //   kDeadlineExceeded    no complete answer within model.timeout
  //   kCancelled           cancel_fd
  //   kInternal            the server broke the protocol
  virtual Result<ChatResponse> complete(const ChatRequest& request,
                                        const std::function<void(std::string_view)>& on_text,
                                        int cancel_fd = -1) = 0;
};

// The client for `config`. The API key is read now from the environment variable named by
// model.api_key_env. Without it quarry refuses to start, unless the base_url is on this machine
// (localhost, 127.0.0.0/8, ::1: llama.cpp, vLLM or Ollama rarely want a key) or
// model.api_key_env is "" (a server elsewhere that needs no key); then no Authorization header
// is sent.
Result<std::unique_ptr<ModelClient>> make_model_client(const ModelConfig& config);

}  // namespace quarry::agent

// Fuzzes what the model client does with a model server's answer: each line of the input is
// one "data:" payload of a streamed answer (a chat.completion.chunk), parsed and given to
// StreamAssembler until it fails, as model_client.cc does; each line is also read as a
// complete (non-streamed) answer and as an error body.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "agent/openai_protocol.h"
#include "agent/stream_assembler.h"
#include "check.h"

namespace {

using nlohmann::json;
using namespace quarry::agent;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view input(reinterpret_cast<const char*>(data), size);
  StreamAssembler assembler;
  std::string streamed;  // the text handed on as it arrived
  const StreamAssembler::TextHandler on_text = [&](std::string_view text) { streamed += text; };
  bool failed = false;
  while (!input.empty()) {
    const size_t end = input.find('\n');
    const std::string_view line = input.substr(0, end);
    input.remove_prefix(end == std::string_view::npos ? input.size() : end + 1);

    (void)error_message_from_body(line);
    (void)error_code_from_body(line);
    const json chunk = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (chunk.is_discarded()) continue;
    if (auto answer = chat_response_from_json(chunk)) {
      for (const auto& call : answer->message.tool_calls)
        check(!call.id.empty(), "a tool call of a complete answer without an id");
      (void)to_json(answer->message);
    }
    if (!failed && !assembler.add(chunk, on_text)) failed = true;
  }
  const ChatResponse response = assembler.take();
  check(response.message.role == "assistant", "the assembled message is not the assistant's");
  check(response.message.content == streamed, "the text handed on differs from the message's");
  for (const auto& call : response.message.tool_calls)
    check(!call.id.empty(), "an assembled tool call without an id");
  // The message goes back to the server in the next request.
  (void)to_json(response.message).dump();
  return 0;
}

// Fuzzes SseParser with what a model server streams. The same bytes must give the same events
// however the network cuts them: whole, byte by byte, and in pieces of varying size.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>
#include <vector>

#include "agent/sse_parser.h"

namespace {

using quarry::agent::SseEvent;
using quarry::agent::SseParser;

// Feeds `stream` in pieces; piece_size(offset) says how long the piece at `offset` is.
template <typename PieceSize>
std::vector<SseEvent> parse(std::string_view stream, PieceSize piece_size) {
  SseParser parser;
  std::vector<SseEvent> all;
  for (size_t offset = 0; offset < stream.size();) {
    const size_t size = piece_size(offset);
    auto events = parser.feed(stream.substr(offset, size));
    if (!events) {
      fmt::print(stderr, "sse_fuzzer: {}\n", events.error().message);
      std::abort();  // only a line over kMaxLine fails, and no input here is that long
    }
    all.insert(all.end(), events->begin(), events->end());
    offset += size;
  }
  return all;
}

bool same(const std::vector<SseEvent>& a, const std::vector<SseEvent>& b) {
  if (a.size() != b.size()) return false;
  for (size_t event_idx = 0; event_idx < a.size(); ++event_idx) {
    if (a[event_idx].event != b[event_idx].event || a[event_idx].data != b[event_idx].data ||
        a[event_idx].id != b[event_idx].id) {
      return false;
    }
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view stream(reinterpret_cast<const char*>(data), size);
  const auto whole = parse(stream, [&](size_t) { return stream.size(); });
  const auto bytes = parse(stream, [](size_t) { return size_t{1}; });
  // Piece sizes from 1 to 13 bytes, taken from the stream itself so that they vary with it.
  const auto pieces = parse(stream, [&](size_t offset) {
    return static_cast<size_t>(static_cast<unsigned char>(stream[offset]) % 13 + 1);
  });
  if (!same(whole, bytes) || !same(whole, pieces)) {
    fmt::print(stderr, "sse_fuzzer: the events depend on how the stream was cut\n");
    std::abort();
  }
  return 0;
}

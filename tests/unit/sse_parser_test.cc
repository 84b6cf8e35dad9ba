#include "agent/sse_parser.h"

#include <gtest/gtest.h>

namespace quarry::agent {
namespace {

// Feeds `stream` in pieces of `piece_size` bytes and returns every event's data.
std::vector<std::string> data_of(std::string_view stream, size_t piece_size) {
  SseParser parser;
  std::vector<std::string> data;
  for (size_t offset = 0; offset < stream.size(); offset += piece_size) {
    auto events = parser.feed(stream.substr(offset, piece_size));
    EXPECT_TRUE(events) << events.error().message;
    for (auto& event : *events)
      data.push_back(event.data);
  }
  return data;
}

TEST(SseParser, SplitsEventsWhateverThePieces) {
  const std::string stream =
      "data: {\"a\":1}\n\n"
      ": keep-alive comment\n\n"
      "data: {\"b\":2}\r\n\r\n"
      "data:{\"c\":3}\r\r"
      "data: first\ndata: second\n\n"
      "event: ping\nid: 7\nretry: 100\ndata: x\n\n"
      "data: [DONE]\n\n";
  const std::vector<std::string> expected = {"{\"a\":1}",     "{\"b\":2}", "{\"c\":3}",
                                             "first\nsecond", "x",         "[DONE]"};
  // Every piece size splits lines, "\r\n" pairs and "data:" prefixes somewhere.
  for (size_t piece_size = 1; piece_size <= stream.size(); ++piece_size) {
    SCOPED_TRACE(piece_size);
    EXPECT_EQ(data_of(stream, piece_size), expected);
  }
}

TEST(SseParser, KeepsTheEventNameAndDropsEmptyEvents) {
  SseParser parser;
  auto events = parser.feed("event: error\ndata: {\"error\":{}}\n\nevent: nothing\n\n\n\n");
  ASSERT_TRUE(events);
  ASSERT_EQ(events->size(), 1u);
  EXPECT_EQ((*events)[0].event, "error");
  EXPECT_EQ((*events)[0].data, "{\"error\":{}}");
}

TEST(SseParser, WaitsForTheBlankLine) {
  SseParser parser;
  auto first = parser.feed("data: partial");
  ASSERT_TRUE(first);
  EXPECT_TRUE(first->empty());
  auto second = parser.feed(" line\n");
  ASSERT_TRUE(second);
  EXPECT_TRUE(second->empty());
  auto third = parser.feed("\n");
  ASSERT_TRUE(third);
  ASSERT_EQ(third->size(), 1u);
  EXPECT_EQ((*third)[0].data, "partial line");
}

TEST(SseParser, SkipsAByteOrderMarkEvenWhenSplit) {
  SseParser parser;
  ASSERT_TRUE(parser.feed("\xEF"));
  ASSERT_TRUE(parser.feed("\xBB"));
  auto events = parser.feed(
      "\xBF"
      "data: 1\n\n");
  ASSERT_TRUE(events);
  ASSERT_EQ(events->size(), 1u);
  EXPECT_EQ((*events)[0].data, "1");
}

TEST(SseParser, KeepsDataThatLooksLikeFields) {
  SseParser parser;
  auto events = parser.feed("data\ndata:  two spaces\ndata: a: b\n\n");
  ASSERT_TRUE(events);
  ASSERT_EQ(events->size(), 1u);
  EXPECT_EQ((*events)[0].data, "\n two spaces\na: b");
}

}  // namespace
}  // namespace quarry::agent

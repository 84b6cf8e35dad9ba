// Server-Sent Events: splits a byte stream that arrives in arbitrary pieces into events, as the
// HTML standard's event-stream parser does (any line ending, comments, multi-line data).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "common/error.h"

namespace quarry::agent {

struct SseEvent {
  std::string event;  // the "event:" field, "" for the default type ("message")
  std::string data;   // the "data:" lines joined with '\n'
  std::string id;     // the last "id:" field seen so far in the stream, as the standard keeps it
};

class SseParser {
 public:
  // Takes the next bytes and returns the events they complete (an event ends at a blank line).
  // Fails only on a line longer than kMaxLine.
  Result<std::vector<SseEvent>> feed(std::string_view bytes);

  static constexpr size_t kMaxLine = 16 * 1024 * 1024;

 private:
  void take_line(std::string_view line, std::vector<SseEvent>& events);

  std::string line_;       // the line read so far
  bool after_cr_ = false;  // the last byte was '\r', so a '\n' right after it ends nothing
  bool started_ = false;   // past a possible byte order mark
  SseEvent event_;
  std::string last_id_;
};

}  // namespace quarry::agent

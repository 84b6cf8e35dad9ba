#include "agent/sse_parser.h"

namespace quarry::agent {

Result<std::vector<SseEvent>> SseParser::feed(std::string_view bytes) {
  std::vector<SseEvent> events;
  if (!started_) {
    // The stream may begin with a UTF-8 byte order mark; it may also arrive split.
    constexpr std::string_view kBom = "\xEF\xBB\xBF";
    line_.append(bytes);
    if (line_.size() < kBom.size() && kBom.starts_with(line_)) return events;
    started_ = true;
    std::string pending = std::move(line_);
    line_.clear();
    std::string_view rest = pending;
    if (rest.starts_with(kBom)) rest.remove_prefix(kBom.size());
    return feed(rest);
  }
  size_t start = 0;
  for (size_t i = 0; i < bytes.size(); ++i) {
    const char c = bytes[i];
    if (c != '\r' && c != '\n') continue;
    if (c == '\n' && after_cr_ && i == start && line_.empty()) {
      // The '\n' of a "\r\n" whose '\r' ended the line already.
      after_cr_ = false;
      start = i + 1;
      continue;
    }
    line_.append(bytes.substr(start, i - start));
    take_line(line_, events);
    line_.clear();
    after_cr_ = c == '\r';
    start = i + 1;
  }
  if (start < bytes.size()) {
    after_cr_ = false;
    line_.append(bytes.substr(start));
    if (line_.size() > kMaxLine) {
      return make_error(ErrorCode::kInternal, "an event-stream line is longer than {} bytes",
                        kMaxLine);
    }
  }
  return events;
}

void SseParser::take_line(std::string_view line, std::vector<SseEvent>& events) {
  if (line.empty()) {
    // Every data line added its text and a '\n', so an event with data is not empty.
    if (!event_.data.empty()) {
      event_.data.pop_back();
      event_.id = last_id_;
      events.push_back(std::move(event_));
    }
    event_ = SseEvent{};
    return;
  }
  if (line.front() == ':') return;  // a comment, e.g. a keep-alive
  std::string_view field = line;
  std::string_view value;
  if (auto colon = line.find(':'); colon != std::string_view::npos) {
    field = line.substr(0, colon);
    value = line.substr(colon + 1);
    if (value.starts_with(' ')) value.remove_prefix(1);
  }
  if (field == "data") {
    event_.data.append(value);
    event_.data.push_back('\n');
  } else if (field == "event") {
    event_.event = std::string(value);
  } else if (field == "id" && value.find('\0') == std::string_view::npos) {
    last_id_ = std::string(value);
  }
  // "retry" matters to browsers reconnecting, not to a client reading one response.
}

}  // namespace quarry::agent

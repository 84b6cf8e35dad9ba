// The framing of PostgreSQL's binary COPY stream: an 11-byte signature, flags and a header
// extension, then tuples (a field count, then a length and the bytes of each field, -1 for
// NULL), then a -1 trailer. Bytes arrive in arbitrary chunks; complete tuples are handed on
// as views into the chunk (or into a small carry-over buffer when a tuple spans chunks).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.h"

namespace quarry::data {

struct CopyField {
  const char* data = nullptr;
  int32_t length = -1;  // -1: NULL
  bool is_null() const { return length < 0; }
  std::string_view bytes() const { return {data, static_cast<size_t>(length < 0 ? 0 : length)}; }
};

class CopyBinaryReader {
 public:
  explicit CopyBinaryReader(size_t columns) : columns_(columns), fields_(columns) {}

  // Parses `chunk` and calls `on_row(std::span<const CopyField>)` (returning Result<void>) for
  // each complete tuple. A tuple cut at the end of the chunk waits for the next one.
  template <typename OnRow>
  Result<void> consume(std::string_view chunk, OnRow&& on_row);

  // True once the trailer was read; the stream must end there.
  bool finished() const { return finished_; }
  // Checks that the stream ended cleanly (trailer seen, nothing left over).
  Result<void> finish() const;

 private:
  // Parses one item (header or tuple) at the start of `data`. Returns the bytes it used, or 0
  // if `data` does not hold all of it yet. Fills fields_ for a tuple and sets *is_row.
  Result<size_t> parse(std::string_view data, bool* is_row);

  size_t columns_;
  std::vector<CopyField> fields_;
  std::string pending_;  // the start of an item cut at the end of the previous chunk
  bool header_done_ = false;
  bool finished_ = false;
};

template <typename OnRow>
Result<void> CopyBinaryReader::consume(std::string_view chunk, OnRow&& on_row) {
  // Finish an item carried over from the previous chunk, taking bytes from this one until it is
  // complete. PostgreSQL sends one tuple per message, so this path is rare.
  while (!pending_.empty() && !chunk.empty()) {
    const size_t before = pending_.size();
    pending_.append(chunk);
    bool is_row = false;
    ASSIGN_OR_RETURN(size_t used, parse(pending_, &is_row));
    if (used == 0) return {};  // still incomplete; all of `chunk` is in pending_
    if (is_row) RETURN_IF_ERROR(on_row(std::span<const CopyField>(fields_)));
    chunk.remove_prefix(used - before);
    pending_.clear();
  }
  while (!chunk.empty()) {
    bool is_row = false;
    ASSIGN_OR_RETURN(size_t used, parse(chunk, &is_row));
    if (used == 0) {
      pending_.assign(chunk);
      return {};
    }
    if (is_row) RETURN_IF_ERROR(on_row(std::span<const CopyField>(fields_)));
    chunk.remove_prefix(used);
  }
  return {};
}

}  // namespace quarry::data

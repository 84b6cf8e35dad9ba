#include "data/copy_binary.h"

#include "data/pg_types.h"

namespace quarry::data {
namespace {

constexpr std::string_view kSignature("PGCOPY\n\377\r\n\0", 11);

}  // namespace

Result<size_t> CopyBinaryReader::parse(std::string_view data, bool* is_row) {
  *is_row = false;
  if (finished_) {
    return make_error(ErrorCode::kInternal, "COPY data continues after its end marker");
  }
  if (!header_done_) {
    if (data.size() < kSignature.size() + 8) return 0;
    if (data.substr(0, kSignature.size()) != kSignature) {
      return make_error(ErrorCode::kInternal, "COPY data does not start with the binary signature");
    }
    const int32_t flags = read_int32(data.data() + kSignature.size());
    if (flags & (1 << 16)) {
      return make_error(ErrorCode::kInternal, "COPY data has OIDs, which quarry does not ask for");
    }
    const int32_t extension = read_int32(data.data() + kSignature.size() + 4);
    if (extension < 0) return make_error(ErrorCode::kInternal, "COPY header is corrupt");
    const size_t size = kSignature.size() + 8 + static_cast<size_t>(extension);
    if (data.size() < size) return 0;
    header_done_ = true;
    return size;
  }
  if (data.size() < 2) return 0;
  const int16_t count = read_int16(data.data());
  if (count == -1) {
    finished_ = true;
    return 2;
  }
  if (count < 0 || static_cast<size_t>(count) != columns_) {
    return make_error(ErrorCode::kInternal, "a COPY tuple has {} fields where {} were expected",
                      count, columns_);
  }
  size_t offset = 2;
  for (auto& field : fields_) {
    if (data.size() < offset + 4) return 0;
    const int32_t length = read_int32(data.data() + offset);
    offset += 4;
    if (length < -1) return make_error(ErrorCode::kInternal, "a COPY field has a bad length");
    field.length = length;
    field.data = data.data() + offset;
    if (length > 0) {
      if (data.size() < offset + static_cast<size_t>(length)) return 0;
      offset += static_cast<size_t>(length);
    }
  }
  *is_row = true;
  return offset;
}

Result<void> CopyBinaryReader::finish() const {
  if (!finished_ || !pending_.empty()) {
    return make_error(ErrorCode::kInternal, "COPY data ended in the middle of a tuple");
  }
  return {};
}

}  // namespace quarry::data

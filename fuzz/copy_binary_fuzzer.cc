// Fuzzes CopyBinaryReader with what PostgreSQL sends for COPY ... TO STDOUT (FORMAT binary).
// The first byte is the number of columns the export expects (mod 8); the rest is the stream.
// The same stream must give the same rows and the same end however its chunks are cut: whole,
// byte by byte, and in pieces of varying size.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "data/copy_binary.h"

namespace {

using quarry::Result;
using quarry::data::CopyBinaryReader;
using quarry::data::CopyField;

struct Outcome {
  std::vector<std::vector<std::optional<std::string>>> rows;
  std::string error;  // "" when the stream ended cleanly

  bool operator==(const Outcome&) const = default;
};

template <typename PieceSize>
Outcome read(size_t columns, std::string_view stream, PieceSize piece_size) {
  CopyBinaryReader reader(columns);
  Outcome outcome;
  auto on_row = [&](std::span<const CopyField> fields) -> Result<void> {
    if (fields.size() != columns) {
      fmt::print(stderr, "copy_binary_fuzzer: a row of {} fields for {} columns\n", fields.size(),
                 columns);
      std::abort();
    }
    auto& row = outcome.rows.emplace_back();
    for (const auto& field : fields) {
      if (field.is_null()) {
        row.emplace_back();
      } else {
        row.emplace_back(std::string(field.bytes()));  // ASan checks the view is in bounds
      }
    }
    return {};
  };
  for (size_t offset = 0; offset < stream.size();) {
    const size_t size = piece_size(offset);
    if (auto consumed = reader.consume(stream.substr(offset, size), on_row); !consumed) {
      outcome.error = consumed.error().message;
      return outcome;
    }
    offset += size;
  }
  if (auto finished = reader.finish(); !finished) outcome.error = finished.error().message;
  return outcome;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const size_t columns = data[0] % 8;
  const std::string_view stream(reinterpret_cast<const char*>(data) + 1, size - 1);
  const Outcome whole = read(columns, stream, [&](size_t) { return stream.size(); });
  const Outcome bytes = read(columns, stream, [](size_t) { return size_t{1}; });
  const Outcome pieces = read(columns, stream, [&](size_t offset) {
    return static_cast<size_t>(static_cast<unsigned char>(stream[offset]) % 29 + 1);
  });
  if (!(whole == bytes) || !(whole == pieces)) {
    fmt::print(stderr, "copy_binary_fuzzer: the rows depend on how the stream was cut\n");
    std::abort();
  }
  return 0;
}

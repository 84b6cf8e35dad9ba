// multipart/form-data as the Daytona-compatible API reads and writes it
// (common/multipart.h): what the SDK's uploads look like, what it parses back, and the
// bodies it refuses.
#include "common/multipart.h"

#include <gtest/gtest.h>

namespace quarry {
namespace {

using namespace std::literals;

// A body as httpx writes the SDK's bulk upload: the path field, then the file.
constexpr std::string_view kUpload =
    "--b0undary\r\n"
    "Content-Disposition: form-data; name=\"files[0].path\"\r\n\r\n"
    "data/a.bin\r\n"
    "--b0undary\r\n"
    "Content-Disposition: form-data; name=\"files[0].file\"; filename=\"data/a.bin\"\r\n"
    "Content-Type: application/octet-stream\r\n\r\n"
    "\x00\r\n--b0undar\r\n\r\n"
    "\r\n--b0undary--\r\n"sv;

TEST(Multipart, ReadsTheSdksUploadByteForByte) {
  auto boundary = multipart_boundary("multipart/form-data; boundary=b0undary");
  ASSERT_TRUE(boundary) << boundary.error().message;
  EXPECT_EQ(*boundary, "b0undary");
  EXPECT_EQ(*multipart_boundary("Multipart/Form-Data; boundary=\"a b\""), "a b");
  auto parts = parse_multipart(kUpload, *boundary);
  ASSERT_TRUE(parts) << parts.error().message;
  ASSERT_EQ(parts->size(), 2u);
  EXPECT_EQ((*parts)[0].name, "files[0].path");
  EXPECT_EQ((*parts)[0].data, "data/a.bin");
  EXPECT_FALSE((*parts)[0].filename);
  EXPECT_EQ((*parts)[1].name, "files[0].file");
  EXPECT_EQ((*parts)[1].filename, "data/a.bin");
  EXPECT_EQ((*parts)[1].content_type, "application/octet-stream");
  // A delimiter-like line inside the data is data, and so are its line breaks.
  EXPECT_EQ((*parts)[1].data, std::string_view("\x00\r\n--b0undar\r\n\r\n", 16));
}

TEST(Multipart, WritesWhatItReadsBackAndEveryPathExactly) {
  const std::string binary("\r\n--quarry-\x00\xff", 13);
  const std::vector<OutPart> parts = {
      {"file", "/home/sandbox/a \"q\"\\b.txt", "application/octet-stream", binary},
      {"error", "dir/ü;x=1", "application/json", R"({"message":"gone"})"},
      {"file", "empty", "application/octet-stream", ""},
  };
  auto written = write_multipart(parts);
  auto boundary = multipart_boundary(written.content_type);
  ASSERT_TRUE(boundary) << written.content_type;
  auto read = parse_multipart(written.body, *boundary);
  ASSERT_TRUE(read) << read.error().message;
  ASSERT_EQ(read->size(), parts.size());
  for (size_t index = 0; index < parts.size(); ++index) {
    SCOPED_TRACE(index);
    EXPECT_EQ((*read)[index].name, parts[index].name);
    EXPECT_EQ((*read)[index].filename, parts[index].filename);  // from filename*
    EXPECT_EQ((*read)[index].content_type, parts[index].content_type);
    EXPECT_EQ((*read)[index].data, parts[index].data);
  }
}

TEST(Multipart, RefusesBrokenBodies) {
  const std::pair<std::string_view, std::string_view> broken[] = {
      {"", "no part"},
      {"--b\r\nContent-Disposition: form-data; name=\"x\"\r\n\r\nno end", "cut short"},
      {"--b\r\nContent-Type: text/plain\r\n\r\nx\r\n--b--", "no Content-Disposition"},
      {"--b\r\nContent-Disposition: attachment; name=\"x\"\r\n\r\nx\r\n--b--", "not form-data"},
      {"--b\r\nContent-Disposition: form-data\r\n\r\nx\r\n--b--", "no name"},
      {"--b\r\nContent-Disposition: form-data; name=\"x\r\n\r\nx\r\n--b--", "never ends"},
      {"--bx\r\n", "not followed by a line break"},
  };
  for (const auto& [body, says] : broken) {
    SCOPED_TRACE(body);
    auto parts = parse_multipart(body, "b");
    ASSERT_FALSE(parts);
    EXPECT_NE(parts.error().message.find(says), std::string::npos) << parts.error().message;
  }
  EXPECT_FALSE(multipart_boundary("application/json"));
  EXPECT_FALSE(multipart_boundary("multipart/form-data"));
  EXPECT_FALSE(multipart_boundary("multipart/form-data; boundary=" + std::string(71, 'a')));
  std::string many;
  for (size_t index = 0; index <= kMaxParts; ++index)
    many += "--b\r\nContent-Disposition: form-data; name=\"x\"\r\n\r\n\r\n";
  many += "--b--\r\n";
  auto too_many = parse_multipart(many, "b");
  ASSERT_FALSE(too_many);
  EXPECT_NE(too_many.error().message.find("more than"), std::string::npos);
}

}  // namespace
}  // namespace quarry

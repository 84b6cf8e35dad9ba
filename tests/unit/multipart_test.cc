#include "common/multipart.h"

#include <gtest/gtest.h>

namespace quarry {
namespace {

TEST(Multipart, WhatIsWrittenReadsBackWithNamesFilenamesAndBinaryData) {
  std::string binary = std::string("\0\r\n--x\r\n", 9) + std::string(1000, '\xff');
  const std::vector<MultipartPart> parts = {
      {.name = "files[0].path", .data = "/home/sandbox/a \"quoted\" name.bin"},
      {.name = "files[0].file",
       .filename = "a \"quoted\" name.bin",
       .content_type = "application/octet-stream",
       .data = binary},
      {.name = "empty", .data = ""}};
  const std::string boundary = random_multipart_boundary();
  const std::string body = write_multipart(parts, boundary);
  auto read = parse_multipart(body, boundary, 10);
  ASSERT_TRUE(read) << read.error().message;
  ASSERT_EQ(read->size(), 3u);
  EXPECT_EQ((*read)[0].name, "files[0].path");
  EXPECT_EQ((*read)[0].data, "/home/sandbox/a \"quoted\" name.bin");
  EXPECT_EQ((*read)[1].filename, "a \"quoted\" name.bin");
  EXPECT_EQ((*read)[1].content_type, "application/octet-stream");
  EXPECT_EQ((*read)[1].data, binary);
  EXPECT_EQ((*read)[2].data, "");
}

TEST(Multipart, ReadsWhatGoAndBrowsersWrite) {
  // A preamble, a part without a Content-Type, header names in any case, unquoted values.
  const std::string body =
      "preamble\r\n--b0undary\r\ncontent-disposition: form-data; name=file; "
      "filename=\"report.csv\"\r\n\r\na,b\r\n1,2\r\n--b0undary\r\nContent-Disposition: form-data; "
      "name=\"error\"\r\nContent-Type: application/json\r\n\r\n{\"message\":\"not found\"}\r\n"
      "--b0undary--\r\nepilogue";
  auto read = parse_multipart(body, "b0undary", 10);
  ASSERT_TRUE(read) << read.error().message;
  ASSERT_EQ(read->size(), 2u);
  EXPECT_EQ((*read)[0].name, "file");
  EXPECT_EQ((*read)[0].filename, "report.csv");
  EXPECT_EQ((*read)[0].data, "a,b\r\n1,2");
  EXPECT_EQ((*read)[1].name, "error");
  EXPECT_EQ((*read)[1].data, "{\"message\":\"not found\"}");
}

TEST(Multipart, BadBodiesAndTooManyPartsAreRefusedSayingWhy) {
  EXPECT_NE(parse_multipart("no parts here", "b", 10).error().message.find("no '--b' line"),
            std::string::npos);
  EXPECT_NE(parse_multipart("--b\r\n\r\ndata without an end", "b", 10)
                .error()
                .message.find("closing '--b--' is missing"),
            std::string::npos);
  EXPECT_NE(parse_multipart("--b\r\nbroken header\r\n\r\nx\r\n--b--", "b", 10)
                .error()
                .message.find("without ':'"),
            std::string::npos);
  std::vector<MultipartPart> many(3, MultipartPart{.name = "x", .data = "y"});
  auto refused = parse_multipart(write_multipart(many, "b"), "b", 2);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code, ErrorCode::kResourceExhausted);
}

TEST(Multipart, TheBoundaryComesFromTheContentType) {
  EXPECT_EQ(*multipart_boundary("multipart/form-data; boundary=abc"), "abc");
  EXPECT_EQ(*multipart_boundary("Multipart/Form-Data; charset=utf-8; boundary=\"a;b c\""), "a;b c");
  EXPECT_FALSE(multipart_boundary("application/json"));
  EXPECT_FALSE(multipart_boundary("multipart/form-data"));
  EXPECT_FALSE(multipart_boundary("multipart/form-data; boundary=" + std::string(71, 'x')));
}

}  // namespace
}  // namespace quarry

// The server name of a TLS ClientHello, from a real client's first bytes.
#include "sandbox/local/proxy/client_hello.h"

#include <gtest/gtest.h>

#include <vector>

namespace quarry::sandbox::local::proxy {
namespace {

void put16(std::vector<uint8_t>& out, size_t value) {
  out.push_back(static_cast<uint8_t>(value >> 8));
  out.push_back(static_cast<uint8_t>(value));
}

// A ClientHello message as TLS 1.3 clients send it, with `extensions` (type, body) in order.
std::vector<uint8_t> hello_message(
    const std::vector<std::pair<uint16_t, std::vector<uint8_t>>>& extensions) {
  std::vector<uint8_t> body = {0x03, 0x03};
  body.insert(body.end(), 32, 0xab);  // random
  body.push_back(32);                 // session id
  body.insert(body.end(), 32, 0xcd);
  put16(body, 4);  // cipher suites
  body.insert(body.end(), {0x13, 0x01, 0x13, 0x02});
  body.insert(body.end(), {0x01, 0x00});  // compression: null
  std::vector<uint8_t> all;
  for (const auto& [type, data] : extensions) {
    put16(all, type);
    put16(all, data.size());
    all.insert(all.end(), data.begin(), data.end());
  }
  put16(body, all.size());
  body.insert(body.end(), all.begin(), all.end());
  std::vector<uint8_t> message = {0x01, 0, static_cast<uint8_t>(body.size() >> 8),
                                  static_cast<uint8_t>(body.size())};
  message.insert(message.end(), body.begin(), body.end());
  return message;
}

std::vector<uint8_t> server_name(const std::string& name) {
  std::vector<uint8_t> entry = {0x00};
  put16(entry, name.size());
  entry.insert(entry.end(), name.begin(), name.end());
  std::vector<uint8_t> list;
  put16(list, entry.size());
  list.insert(list.end(), entry.begin(), entry.end());
  return list;
}

// The message cut into handshake records of at most `record_size` bytes.
std::vector<uint8_t> records(const std::vector<uint8_t>& message, size_t record_size = 16384) {
  std::vector<uint8_t> out;
  for (size_t at = 0; at < message.size(); at += record_size) {
    const size_t size = std::min(record_size, message.size() - at);
    out.insert(out.end(), {0x16, 0x03, 0x01});
    put16(out, size);
    out.insert(out.end(), message.begin() + static_cast<long>(at),
               message.begin() + static_cast<long>(at + size));
  }
  return out;
}

TEST(ClientHello, FindsTheServerNameAmongOtherExtensions) {
  const auto bytes = records(hello_message({{0x000a, {0x00, 0x02, 0x00, 0x1d}},
                                            {0x0000, server_name("pypi.org")},
                                            {0x002b, {0x02, 0x03, 0x04}}}));
  auto hello = parse_client_hello(bytes);
  EXPECT_EQ(hello.status, HelloStatus::kFound);
  EXPECT_EQ(hello.server_name, "pypi.org");
}

TEST(ClientHello, AMessageOverSeveralRecordsIsJoined) {
  const auto bytes = records(hello_message({{0x0015, std::vector<uint8_t>(600, 0)},
                                            {0x0000, server_name("files.pythonhosted.org")}}),
                             100);
  auto hello = parse_client_hello(bytes);
  EXPECT_EQ(hello.status, HelloStatus::kFound);
  EXPECT_EQ(hello.server_name, "files.pythonhosted.org");
}

TEST(ClientHello, EveryPrefixAsksForMore) {
  const auto bytes = records(hello_message({{0x0000, server_name("pypi.org")}}), 50);
  for (size_t size = 0; size < bytes.size(); ++size) {
    SCOPED_TRACE(size);
    EXPECT_EQ(parse_client_hello(std::span(bytes).first(size)).status, HelloStatus::kNeedMore);
  }
}

TEST(ClientHello, WithoutServerNameOrNotTls) {
  EXPECT_EQ(parse_client_hello(records(hello_message({{0x000a, {0x00, 0x02, 0x00, 0x1d}}}))).status,
            HelloStatus::kNoServerName);
  const std::string http = "GET / HTTP/1.1\r\nHost: a\r\n\r\n";
  EXPECT_EQ(
      parse_client_hello(std::span(reinterpret_cast<const uint8_t*>(http.data()), http.size()))
          .status,
      HelloStatus::kNotTls);
}

TEST(ClientHello, LiesAboutLengthsAreMalformed) {
  auto message = hello_message({{0x0000, server_name("pypi.org")}});
  auto short_list = message;
  short_list[message.size() - 12] = 0xff;  // the server name list's length, now past its end
  EXPECT_EQ(parse_client_hello(records(short_list)).status, HelloStatus::kMalformed);
  auto not_hello = message;
  not_hello[0] = 0x02;  // ServerHello
  EXPECT_EQ(parse_client_hello(records(not_hello)).status, HelloStatus::kMalformed);
  std::vector<uint8_t> huge = {0x16, 0x03, 0x01, 0x00, 0x04, 0x01, 0xff, 0xff, 0xff};
  EXPECT_EQ(parse_client_hello(huge).status, HelloStatus::kMalformed);
}

}  // namespace
}  // namespace quarry::sandbox::local::proxy

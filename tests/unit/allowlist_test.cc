// The domains of sandbox.network.allow: entries, matching, narrowing.
#include "config/allowlist.h"

#include <gtest/gtest.h>

namespace quarry {
namespace {

TEST(Allowlist, EntriesAreCanonical) {
  EXPECT_EQ(*parse_allow_entry("PyPI.org."), "pypi.org");
  EXPECT_EQ(*parse_allow_entry("*.Example.COM"), "*.example.com");
  EXPECT_EQ(*parse_allow_entry("index"), "index");
}

TEST(Allowlist, BadEntriesSayWhatIsWrong) {
  const std::pair<const char*, const char*> cases[] = {
      {"", "is empty"},
      {"10.0.0.1", "is an IP address"},
      {"2130706433", "is an IP address"},
      {"0x7f.1", "is an IP address"},
      {"[::1]", "is an IP address"},
      {"fe80::1", "is an IP address"},
      {"a..b", "empty label"},
      {"*.", "wildcard may only be the first label"},
      {"a.*.b", "wildcard may only be the first label"},
      {"*example.com", "wildcard may only be the first label"},
      {"exa mple.com", "letters, digits"},
      {"example.com:443", "letters, digits"},
      {"-a.com", "starts or ends with '-'"},
  };
  for (const auto& [entry, problem] : cases) {
    SCOPED_TRACE(entry);
    auto parsed = parse_allow_entry(entry);
    ASSERT_FALSE(parsed);
    EXPECT_EQ(parsed.error().code, ErrorCode::kInvalidArgument);
    EXPECT_NE(parsed.error().message.find(problem), std::string::npos) << parsed.error().message;
  }
}

TEST(Allowlist, HostsAreMatchedExactlyOrBelowAWildcard) {
  const std::vector<std::string> allow = {"pypi.org", "*.pythonhosted.org"};
  EXPECT_TRUE(host_allowed(allow, "pypi.org"));
  EXPECT_TRUE(host_allowed(allow, "files.pythonhosted.org"));
  EXPECT_TRUE(host_allowed(allow, "a.b.pythonhosted.org"));
  EXPECT_FALSE(host_allowed(allow, "pythonhosted.org"));  // the wildcard is below, not at
  EXPECT_FALSE(host_allowed(allow, "www.pypi.org"));
  EXPECT_FALSE(host_allowed(allow, "evilpypi.org"));
  EXPECT_FALSE(host_allowed(allow, "evilpythonhosted.org"));
  EXPECT_FALSE(host_allowed(allow, "pypi.org.evil.com"));
}

TEST(Allowlist, HostsFromClientsAreCanonicalOrRefused) {
  EXPECT_EQ(*canonical_host("PyPI.org."), "pypi.org");
  for (const char* host : {"127.0.0.1", "[::1]", "::ffff:127.0.0.1", "2130706433", "0177.0.0.1",
                           "a b", "", "*.pypi.org"}) {
    SCOPED_TRACE(host);
    EXPECT_FALSE(canonical_host(host));
  }
}

TEST(Allowlist, ANarrowerListIsCoveredAndAWiderOneIsNot) {
  const std::vector<std::string> server = {"pypi.org", "*.example.com"};
  EXPECT_EQ(first_not_covered(server, {}), std::nullopt);
  EXPECT_EQ(first_not_covered(server, {"pypi.org"}), std::nullopt);
  EXPECT_EQ(first_not_covered(server, {"a.example.com", "*.a.example.com", "*.example.com"}),
            std::nullopt);
  EXPECT_EQ(first_not_covered(server, {"pypi.org", "example.com"}), "example.com");
  EXPECT_EQ(first_not_covered(server, {"*.pypi.org"}), "*.pypi.org");
  EXPECT_EQ(first_not_covered({"a.example.com"}, {"*.example.com"}), "*.example.com");
  EXPECT_EQ(first_not_covered(server, {"*.com"}), "*.com");
}

}  // namespace
}  // namespace quarry

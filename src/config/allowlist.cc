// The domains of sandbox.network.allow.
#include "config/allowlist.h"

#include <arpa/inet.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "common/text.h"

namespace quarry {
namespace {

constexpr std::string_view kWildcard = "*.";

bool label_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

// Why `name` (lower case, no trailing dot) is not a host name, or empty if it is one.
std::string name_problem(std::string_view name) {
  if (name.empty()) return "is empty";
  if (name.size() > 253) return "is longer than 253 characters";
  size_t start = 0;
  std::string_view last;
  while (start <= name.size()) {
    size_t end = name.find('.', start);
    if (end == std::string_view::npos) end = name.size();
    std::string_view label = name.substr(start, end - start);
    if (label.empty()) return "has an empty label (two dots in a row)";
    if (label.size() > 63) return "has a label longer than 63 characters";
    if (!std::all_of(label.begin(), label.end(), label_char)) {
      return "may only have letters, digits, '-' and '_' between its dots";
    }
    if (label.front() == '-' || label.back() == '-')
      return "has a label that starts or ends with '-'";
    last = label;
    start = end + 1;
  }
  // No top-level domain is all digits; a name that is, or that inet_aton would read as an
  // address (0x7f.1, 2130706433), is an address in disguise.
  in_addr address{};
  if (std::all_of(last.begin(), last.end(), [](char c) { return c >= '0' && c <= '9'; }) ||
      ::inet_aton(std::string(name).c_str(), &address) != 0) {
    return "is an IP address";
  }
  return "";
}

std::string without_trailing_dot(std::string name) {
  if (!name.empty() && name.back() == '.') name.pop_back();
  return name;
}

bool is_ipv6_literal(std::string_view host) {
  std::string bare(host);
  if (bare.size() >= 2 && bare.front() == '[' && bare.back() == ']') {
    bare = bare.substr(1, bare.size() - 2);
  }
  in6_addr address{};
  return bare.find(':') != std::string::npos && ::inet_pton(AF_INET6, bare.c_str(), &address) == 1;
}

// Whether `host` is strictly below `suffix` ("a.example.com" below "example.com").
bool below(std::string_view host, std::string_view suffix) {
  return host.size() > suffix.size() + 1 && host.ends_with(suffix) &&
         host[host.size() - suffix.size() - 1] == '.';
}

}  // namespace

Result<std::string> parse_allow_entry(std::string_view entry) {
  if (is_ipv6_literal(entry)) {
    return make_error(ErrorCode::kInvalidArgument,
                      "'{}' is an IP address; the allowlist takes domain names (example.com, "
                      "*.example.com)",
                      entry);
  }
  std::string canonical = without_trailing_dot(ascii_lower(entry));
  std::string_view name = canonical;
  if (name.starts_with(kWildcard)) name.remove_prefix(kWildcard.size());
  if (name.find('*') != std::string_view::npos) {
    return make_error(ErrorCode::kInvalidArgument,
                      "'{}': a wildcard may only be the first label, as in *.example.com", entry);
  }
  if (auto problem = name_problem(name); !problem.empty()) {
    if (problem == "is an IP address") {
      return make_error(ErrorCode::kInvalidArgument,
                        "'{}' is an IP address; the allowlist takes domain names (example.com, "
                        "*.example.com)",
                        entry);
    }
    return make_error(ErrorCode::kInvalidArgument, "'{}' is not a domain: it {}", entry, problem);
  }
  return canonical;
}

Result<std::string> canonical_host(std::string_view host) {
  if (is_ipv6_literal(host)) {
    return make_error(ErrorCode::kInvalidArgument, "'{}' is an IP address, not a name", host);
  }
  std::string canonical = without_trailing_dot(ascii_lower(host));
  if (auto problem = name_problem(canonical); !problem.empty()) {
    if (problem == "is an IP address") {
      return make_error(ErrorCode::kInvalidArgument, "'{}' is an IP address, not a name", host);
    }
    return make_error(ErrorCode::kInvalidArgument, "'{}' is not a host name: it {}", host, problem);
  }
  return canonical;
}

bool host_allowed(const std::vector<std::string>& allow, std::string_view host) {
  return std::any_of(allow.begin(), allow.end(), [&](const std::string& entry) {
    std::string_view pattern = entry;
    if (pattern.starts_with(kWildcard)) return below(host, pattern.substr(kWildcard.size()));
    return host == pattern;
  });
}

std::optional<std::string> first_not_covered(const std::vector<std::string>& allowed,
                                             const std::vector<std::string>& wanted) {
  for (const auto& entry : wanted) {
    std::string_view want = entry;
    bool covered = false;
    if (want.starts_with(kWildcard)) {
      const std::string_view suffix = want.substr(kWildcard.size());
      covered = std::any_of(allowed.begin(), allowed.end(), [&](const std::string& have) {
        std::string_view pattern = have;
        if (!pattern.starts_with(kWildcard)) return false;
        pattern.remove_prefix(kWildcard.size());
        return suffix == pattern || below(suffix, pattern);
      });
    } else {
      covered = host_allowed(allowed, want);
    }
    if (!covered) return entry;
  }
  return std::nullopt;
}

Result<NetworkPolicy> narrow_allowlist(const NetworkPolicy& server,
                                       const std::vector<std::string>& wanted) {
  if (server.mode != NetworkMode::kAllowlist) {
    return make_error(ErrorCode::kInvalidArgument,
                      "this server's sandboxes have no network (sandbox.network.mode: none)");
  }
  NetworkPolicy narrowed{NetworkMode::kAllowlist, {}};
  for (const auto& entry : wanted) {
    ASSIGN_OR_RETURN(auto canonical, parse_allow_entry(entry));
    narrowed.allow.push_back(std::move(canonical));
  }
  if (auto wider = first_not_covered(server.allow, narrowed.allow)) {
    return make_error(
        ErrorCode::kInvalidArgument,
        "{} is not within this server's allowlist ({}); a sandbox's network may only narrow it",
        *wider, fmt::join(server.allow, ", "));
  }
  return narrowed;
}

}  // namespace quarry

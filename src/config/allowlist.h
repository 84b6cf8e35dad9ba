// The domains of sandbox.network.allow: what an entry may be, which host names it lets through,
// and whether one list only narrows another.
//
//   example.com     that name only
//   *.example.com   every name below example.com (a.example.com, a.b.example.com), not
//                   example.com itself: list both for both
//
// Names are compared without case and without a trailing dot. IP addresses are never entries:
// a sandbox reaches a service by the name the list gives, resolved on the host.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.h"
#include "config/config.h"

namespace quarry {

// The entry in its canonical form (lower case, no trailing dot), or kInvalidArgument saying
// what is wrong with it.
Result<std::string> parse_allow_entry(std::string_view entry);

// A host name as a client sent it (a CONNECT target's host, a URL's host, a TLS server name),
// in canonical form; kInvalidArgument for an IP address or anything that is not a host name.
Result<std::string> canonical_host(std::string_view host);

// Whether `host` (canonical) is let through by `allow` (canonical entries).
bool host_allowed(const std::vector<std::string>& allow, std::string_view host);

// The first entry of `wanted` that `allowed` does not cover (nullopt: `wanted` only narrows
// `allowed`). An exact name is covered by itself or a wildcard above it; a wildcard by a
// wildcard at or above it. All entries canonical.
std::optional<std::string> first_not_covered(const std::vector<std::string>& allowed,
                                             const std::vector<std::string>& wanted);

// The allowlist of the `wanted` entries, each parsed, if `server`'s allowlist covers every one:
// a narrowing of the server's network, never a widening. kInvalidArgument naming the first entry
// that is malformed or not covered, or saying that the server has no network to narrow.
Result<NetworkPolicy> narrow_allowlist(const NetworkPolicy& server,
                                       const std::vector<std::string>& wanted);

}  // namespace quarry

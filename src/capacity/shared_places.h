// SharedPlaces: the sandboxes every server sharing one history holds, so that the capacity
// limits (capacity.max_sandboxes, max_per_user, each account's max_sandboxes) hold across the
// servers and not only within each. Each scheduler counts its own sandboxes and asks this for a
// place before it starts one; a place is taken only if, counting every server's, the limits
// leave room. Only a history several servers share has them (PostgreSQL); one server alone needs
// none.
#pragma once

#include <map>
#include <set>
#include <string>
#include <string_view>

#include "common/error.h"

namespace quarry::capacity {

struct Place {
  std::string key;         // unique across servers: the server's boot id and its lease
  std::string server;      // the boot id of the server holding it
  std::string user;        // empty for a warm sandbox, until it is handed out
  std::string account;     // the account whose quota it counts against
  std::string sandbox_id;  // empty until the sandbox exists (name_place)
};

// The limits a place is taken under (the taking server's configuration).
struct PlaceLimits {
  int max_sandboxes = 0;
  int max_per_user = 0;
  int account_max = 0;  // of the place's account
};

// The places other servers hold, by a recent look, and the keys of those this one holds.
struct PlacesHeld {
  int total = 0;
  std::map<std::string, int> by_user, by_account;
  std::set<std::string> own;
};

class SharedPlaces {
 public:
  virtual ~SharedPlaces() = default;
  // Takes `place` if, with every server's places counted, the limits leave room: false when
  // they do not (another server holds it). Taking places is serialised across servers.
  virtual Result<bool> take_place(const Place& place, const PlaceLimits& limits) = 0;
  // The sandbox a place taken before it existed is for, once it does.
  virtual Result<void> name_place(std::string_view key, std::string_view sandbox_id) = 0;
  // A sandbox that exists already (an earlier process of this server made it, or another
  // server, whose conversation goes on here): its place, whatever the limits. A place another
  // server held for the same sandbox goes, so each sandbox is counted once, by the server that
  // holds it now.
  virtual Result<void> keep_place(const Place& place) = 0;
  // Gives a warm sandbox's place to `user`, if that user has room across the servers.
  virtual Result<bool> assign_place(std::string_view key, std::string_view user,
                                    int max_per_user) = 0;
  // Frees the place `key` (when not empty) and any place of sandbox `sandbox_id` (when not
  // empty), whichever server holds it: a sandbox is destroyed by any server, not only by the
  // one that holds it.
  virtual Result<void> free_place(std::string_view key, std::string_view sandbox_id) = 0;
  // What every other server than `server` holds now, and which places `server` still holds
  // (another server may have taken or freed one of its sandboxes' since).
  virtual Result<PlacesHeld> places_held(std::string_view server) = 0;
};

}  // namespace quarry::capacity

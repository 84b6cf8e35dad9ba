// Who is asking: API tokens kept hashed in a file (server.tokens_file, managed by `quarry
// token`), browser sessions (an HttpOnly, SameSite=Strict cookie got by signing in with a
// token once) and the checks a state-changing request must pass (CSRF token for cookies, same
// origin, and on a server without tokens a loopback Host, against DNS rebinding).
//
// A server whose tokens file does not exist has one user, "local", and listens on loopback only.
#pragma once

#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/error.h"
#include "config/config.h"
#include "server/api_error.h"

namespace quarry::server {

// One line of the tokens file: who the token is for and the SHA-256 of the token.
struct TokenEntry {
  std::string name;  // the user
  std::string sha256;
  Clock::time_point created_at;
};

// The tokens file a configuration names: server.tokens_file, else <state>/tokens.json.
std::filesystem::path tokens_path(const Config& config, const std::filesystem::path& state_dir);

// The tokens file: {"tokens": [{"name", "sha256", "created_at"}]}, mode 0600, replaced whole
// on every change.
namespace token_file {
// A missing file is kNotFound.
Result<std::vector<TokenEntry>> read(const std::filesystem::path& path);
Result<void> write(const std::filesystem::path& path, const std::vector<TokenEntry>& entries);
// Adds a token for `name` and returns it; the file keeps only its hash. A name that has a
// token already is refused.
Result<std::string> create(const std::filesystem::path& path, std::string_view name,
                           const Clock& clock);
// kNotFound if there is no such name.
Result<void> remove(const std::filesystem::path& path, std::string_view name);
// 1 to 64 of a-z, A-Z, 0-9, '.', '_', '-', starting with a letter or digit.
Result<void> check_name(std::string_view name);
}  // namespace token_file

// The tokens the server accepts, read again whenever the file changes (so `quarry token rm`
// takes effect at once).
class TokenStore {
 public:
  explicit TokenStore(std::filesystem::path path) : path_(std::move(path)) {}
  // The user a token belongs to, if it is valid now.
  std::optional<std::string> user_for(std::string_view token);
  // Whether the token whose SHA-256 is `token_sha256` is still `user`'s.
  bool holds(std::string_view token_sha256, std::string_view user);

 private:
  void reload_if_changed();

  std::filesystem::path path_;
  std::mutex mutex_;
  struct stat seen_ {};
  std::map<std::string, std::string, std::less<>> user_by_hash_;
};

struct Session {
  std::string user;
  std::string token_sha256;  // of the token signed in with: the session ends with it
  std::string csrf_token;
  Clock::time_point expires_at;
};

// Browser sessions, in memory: a server restart signs everyone out.
class Sessions {
 public:
  Sessions(const Clock& clock, std::chrono::milliseconds lifetime)
      : clock_(clock), lifetime_(lifetime) {}
  // A new session for `user`, signed in with `token`: its id (the cookie's value) and the
  // session.
  std::pair<std::string, Session> create(const std::string& user, std::string_view token);
  std::optional<Session> find(std::string_view id);
  void remove(std::string_view id);
  std::chrono::milliseconds lifetime() const { return lifetime_; }

 private:
  const Clock& clock_;
  std::chrono::milliseconds lifetime_;
  std::mutex mutex_;
  std::map<std::string, Session, std::less<>> by_hash_;  // sha256 of the id -> session
};

inline constexpr std::string_view kSessionCookie = "quarry_session";
// What every 401 carries in WWW-Authenticate (RFC 9110, 15.5.2).
inline constexpr std::string_view kBearerChallenge = "Bearer realm=\"quarry\"";
inline constexpr std::string_view kCsrfHeader = "X-CSRF-Token";

// What a request needs to say who it is.
struct Credentials {
  std::string_view authorization;  // the Authorization header
  std::string_view cookie;         // the Cookie header
};

enum class AuthMethod { kNone, kBearer, kCookie };

struct Identity {
  std::string user;
  AuthMethod method = AuthMethod::kNone;
  std::string session_id;  // kCookie
  std::string csrf_token;  // kCookie
};

// What a state-changing request (POST, PUT, PATCH, DELETE) must show besides who it is.
struct RequestOrigin {
  std::string_view host;    // the Host header
  std::string_view origin;  // the Origin header, if any
  std::string_view csrf;    // the X-CSRF-Token header, if any
};

class Authenticator {
 public:
  // `tokens` null: a server without tokens, whose one user is "local".
  Authenticator(std::unique_ptr<TokenStore> tokens, Sessions& sessions)
      : tokens_(std::move(tokens)), sessions_(sessions) {}

  bool requires_tokens() const { return tokens_ != nullptr; }
  ApiResult<Identity> authenticate(const Credentials& credentials);
  // For POST /api/v1/session: the user of a token (401 if it is not valid).
  ApiResult<std::string> sign_in(std::string_view token);
  ApiResult<void> check_change(const Identity& identity, const RequestOrigin& origin) const;
  // The Host and Origin checks alone, for requests made before signing in.
  ApiResult<void> check_origin(const RequestOrigin& origin) const;

 private:
  std::unique_ptr<TokenStore> tokens_;
  Sessions& sessions_;
};

// The value of cookie `name` in a Cookie header, if present.
std::optional<std::string_view> cookie_value(std::string_view header, std::string_view name);

// Whether a Host header names this machine: localhost, 127.0.0.0/8 or [::1], with any port.
bool is_loopback_host_header(std::string_view host);

}  // namespace quarry::server

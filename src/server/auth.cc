#include "server/auth.h"

#include <openssl/crypto.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <boost/beast/core/string.hpp>
#include <nlohmann/json.hpp>

#include "common/file_util.h"
#include "common/random_id.h"
#include "common/sha256.h"
#include "common/text.h"
#include "common/url.h"

namespace quarry::server {

std::filesystem::path tokens_path(const Config& config, const std::filesystem::path& state_dir) {
  if (!config.server.tokens_file.empty()) return config.server.tokens_file;
  return state_dir / "tokens.json";
}

namespace token_file {

Result<std::vector<TokenEntry>> read(const std::filesystem::path& path) {
  std::error_code ignored;
  if (!std::filesystem::exists(path, ignored)) {
    return make_error(ErrorCode::kNotFound, "there is no tokens file '{}'", path.string());
  }
  ASSIGN_OR_RETURN(auto text, read_file(path));
  auto json = nlohmann::json::parse(text, nullptr, false);
  auto damaged = [&](std::string_view what) {
    return make_error(ErrorCode::kFailedPrecondition,
                      "the tokens file '{}' is damaged ({}); fix it, or move it aside and create "
                      "the tokens again with quarry token create",
                      path.string(), what);
  };
  if (!json.is_object() || !json.contains("tokens") || !json["tokens"].is_array()) {
    return damaged("it is not {\"tokens\": [...]}");
  }
  std::vector<TokenEntry> entries;
  for (const auto& token : json["tokens"]) {
    if (!token.is_object() || !token.contains("name") || !token["name"].is_string() ||
        !token.contains("sha256") || !token["sha256"].is_string()) {
      return damaged("a token without a name or hash");
    }
    entries.push_back(
        {token["name"], token["sha256"], from_unix_ms(token.value("created_at_ms", int64_t{0}))});
  }
  return entries;
}

Result<void> write(const std::filesystem::path& path, const std::vector<TokenEntry>& entries) {
  nlohmann::json tokens = nlohmann::json::array();
  for (const auto& entry : entries) {
    tokens.push_back({{"name", entry.name},
                      {"sha256", entry.sha256},
                      {"created_at_ms", to_unix_ms(entry.created_at)}});
  }
  RETURN_IF_ERROR(make_directories(path.parent_path(), 0700));
  return write_file_atomic(path, nlohmann::json({{"tokens", tokens}}).dump(2) + "\n", 0600);
}

Result<void> check_name(std::string_view name) {
  const bool valid = !name.empty() && name.size() <= 64 &&
                     std::isalnum(static_cast<unsigned char>(name.front())) &&
                     std::all_of(name.begin(), name.end(), [](unsigned char c) {
                       return std::isalnum(c) || c == '.' || c == '_' || c == '-';
                     });
  if (!valid) {
    return make_error(ErrorCode::kInvalidArgument,
                      "'{}' is not a token name: use 1 to 64 letters, digits, '.', '_' or '-', "
                      "starting with a letter or digit (the name is the user's)",
                      name);
  }
  return {};
}

Result<std::string> create(const std::filesystem::path& path, std::string_view name,
                           const Clock& clock) {
  RETURN_IF_ERROR(check_name(name));
  std::vector<TokenEntry> entries;
  if (auto existing = read(path)) {
    entries = std::move(*existing);
  } else if (existing.error().code != ErrorCode::kNotFound) {
    return std::unexpected(existing.error());
  }
  for (const auto& entry : entries) {
    if (entry.name == name) {
      return make_error(ErrorCode::kAlreadyExists,
                        "there is a token named '{}' already; remove it first with quarry token rm "
                        "{} (its user keeps their conversations)",
                        name, name);
    }
  }
  std::string token = "qry_" + random_secret();
  entries.push_back({std::string(name), sha256_hex(token), clock.now()});
  RETURN_IF_ERROR(write(path, entries));
  return token;
}

Result<void> remove(const std::filesystem::path& path, std::string_view name) {
  ASSIGN_OR_RETURN(auto entries, read(path));
  auto removed =
      std::erase_if(entries, [&](const TokenEntry& entry) { return entry.name == name; });
  if (removed == 0) {
    return make_error(ErrorCode::kNotFound, "there is no token named '{}' (see quarry token ls)",
                      name);
  }
  return write(path, entries);
}

}  // namespace token_file

void TokenStore::reload_if_changed() {
  struct stat now {};
  if (::stat(path_.c_str(), &now) != 0) {
    user_by_hash_.clear();  // removed: no token is valid
    seen_ = {};
    return;
  }
  if (now.st_ino == seen_.st_ino && now.st_size == seen_.st_size &&
      now.st_mtim.tv_sec == seen_.st_mtim.tv_sec && now.st_mtim.tv_nsec == seen_.st_mtim.tv_nsec) {
    return;
  }
  seen_ = now;
  user_by_hash_.clear();
  auto entries = token_file::read(path_);
  if (!entries) {
    spdlog::error("{}; no token is accepted until it is fixed", entries.error().message);
    return;
  }
  for (const auto& entry : *entries)
    user_by_hash_[entry.sha256] = entry.name;
}

std::optional<std::string> TokenStore::user_for(std::string_view token) {
  std::lock_guard lock(mutex_);
  reload_if_changed();
  // Looked up by the token's hash: the time a lookup takes says nothing about valid tokens.
  auto found = user_by_hash_.find(sha256_hex(token));
  if (found == user_by_hash_.end()) return std::nullopt;
  return found->second;
}

bool TokenStore::holds(std::string_view token_sha256, std::string_view user) {
  std::lock_guard lock(mutex_);
  reload_if_changed();
  auto found = user_by_hash_.find(token_sha256);
  return found != user_by_hash_.end() && found->second == user;
}

std::pair<std::string, Session> Sessions::create(const std::string& user, std::string_view token) {
  std::string id = random_secret();
  Session session{user, sha256_hex(token), random_secret(), clock_.now() + lifetime_};
  std::lock_guard lock(mutex_);
  // Expired sessions go when another is made, so the map stays as small as its live sessions.
  std::erase_if(by_hash_,
                [&](const auto& entry) { return entry.second.expires_at <= clock_.now(); });
  by_hash_[sha256_hex(id)] = session;
  return {std::move(id), std::move(session)};
}

std::optional<Session> Sessions::find(std::string_view id) {
  std::lock_guard lock(mutex_);
  auto found = by_hash_.find(sha256_hex(id));
  if (found == by_hash_.end()) return std::nullopt;
  if (found->second.expires_at <= clock_.now()) {
    by_hash_.erase(found);
    return std::nullopt;
  }
  return found->second;
}

void Sessions::remove(std::string_view id) {
  std::lock_guard lock(mutex_);
  by_hash_.erase(sha256_hex(id));
}

std::optional<std::string_view> cookie_value(std::string_view header, std::string_view name) {
  while (!header.empty()) {
    auto end = header.find(';');
    auto pair = header.substr(0, end);
    while (!pair.empty() && pair.front() == ' ')
      pair.remove_prefix(1);
    auto equals = pair.find('=');
    if (equals != std::string_view::npos && pair.substr(0, equals) == name) {
      return pair.substr(equals + 1);
    }
    if (end == std::string_view::npos) break;
    header.remove_prefix(end + 1);
  }
  return std::nullopt;
}

bool is_loopback_host_header(std::string_view host) {
  // "name", "name:port", "[v6]" or "[v6]:port"
  if (host.starts_with("[")) {
    auto close = host.find(']');
    return close != std::string_view::npos && quarry::is_loopback_host(host.substr(1, close - 1));
  }
  return quarry::is_loopback_host(host.substr(0, host.find(':')));
}

ApiResult<Identity> Authenticator::authenticate(const Credentials& credentials) {
  if (!tokens_) return Identity{"local", AuthMethod::kNone, {}, {}};
  if (!credentials.authorization.empty()) {
    // "Bearer TOKEN"; the scheme's name is case-insensitive (RFC 9110, 11.1).
    const std::string_view header = credentials.authorization;
    const auto space = header.find(' ');
    const auto scheme = header.substr(0, space);
    if (space == std::string_view::npos ||
        !boost::beast::iequals(boost::beast::string_view(scheme.data(), scheme.size()), "bearer")) {
      return api_error(401, "unauthorized",
                       "only bearer tokens are accepted: send 'Authorization: Bearer TOKEN' with "
                       "a token from quarry token create");
    }
    auto user = tokens_->user_for(trim_blanks(header.substr(space + 1)));
    if (!user) {
      return api_error(401, "unauthorized",
                       "the token is not valid (it may have been removed with quarry token rm); "
                       "ask for a new one");
    }
    return Identity{std::move(*user), AuthMethod::kBearer, {}, {}};
  }
  if (auto id = cookie_value(credentials.cookie, kSessionCookie); id && !id->empty()) {
    auto session = sessions_.find(*id);
    // A session ends when it expires, and when the token it was signed in with is removed
    // (a new token for the same user, as after a leak, does not keep it going).
    if (session && tokens_->holds(session->token_sha256, session->user)) {
      return Identity{session->user, AuthMethod::kCookie, std::string(*id), session->csrf_token};
    }
    return api_error(401, "unauthorized",
                     "the session has ended (it expired, the server restarted or the token was "
                     "removed); sign in again");
  }
  return api_error(401, "unauthorized",
                   "sign in first: send 'Authorization: Bearer TOKEN', or POST /api/v1/session "
                   "with {{\"token\": \"...\"}} to get a session cookie");
}

ApiResult<std::string> Authenticator::sign_in(std::string_view token) {
  if (!tokens_) {
    return api_error(409, "no_tokens",
                     "this server has no tokens file, so there is nothing to sign in to: every "
                     "request on loopback is the user 'local'");
  }
  auto user = tokens_->user_for(token);
  if (!user) {
    return api_error(401, "unauthorized",
                     "the token is not valid (it may have been removed with quarry token rm)");
  }
  return *user;
}

ApiResult<void> Authenticator::check_origin(const RequestOrigin& origin) const {
  if (!tokens_ && !is_loopback_host_header(origin.host)) {
    // Without tokens anything that reaches the port acts as the user: a page on another site
    // whose name resolves to 127.0.0.1 (DNS rebinding) must not.
    return api_error(403, "host_not_allowed",
                     "this server has no tokens, so it answers only requests addressed to "
                     "localhost or 127.0.0.1, not '{}'; create tokens with quarry token create to "
                     "serve other names",
                     origin.host);
  }
  if (!origin.origin.empty()) {
    const auto scheme = origin.origin.find("://");
    const auto host =
        scheme == std::string_view::npos ? origin.origin : origin.origin.substr(scheme + 3);
    if (!boost::beast::iequals(boost::beast::string_view(host.data(), host.size()),
                               boost::beast::string_view(origin.host.data(), origin.host.size()))) {
      return api_error(403, "cross_origin",
                       "a request from another origin ('{}') is refused; use the API from pages "
                       "this server serves, or from a script without an Origin header",
                       origin.origin);
    }
  }
  return {};
}

ApiResult<void> Authenticator::check_change(const Identity& identity,
                                            const RequestOrigin& origin) const {
  if (auto checked = check_origin(origin); !checked) return checked;
  if (identity.method != AuthMethod::kCookie) return {};
  const auto& expected = identity.csrf_token;
  if (origin.csrf.size() != expected.size() ||
      CRYPTO_memcmp(origin.csrf.data(), expected.data(), expected.size()) != 0) {
    return api_error(403, "csrf_failed",
                     "a change made with a session cookie needs the {} header, with the "
                     "csrf_token of GET /api/v1/session",
                     kCsrfHeader);
  }
  return {};
}

}  // namespace quarry::server

// quarry's private PostgreSQL (`quarry db up` / `db down`): Debian's server binaries, a
// cluster initialised into <state>/postgres as the `postgres` system user, listening on a
// unix socket there (run/) and on a loopback port, logging to log/server.log, with the analytics
// database, a superuser for quarry's own setup and a read-only role for queries and exports.
// Passwords live in <state>/postgres/credentials.json (root, 0600) and nowhere else.
#pragma once

#include <filesystem>
#include <optional>
#include <string>

#include "common/error.h"
#include "common/progress.h"

namespace quarry::data {

inline constexpr std::string_view kDatabaseName = "analytics";
inline constexpr std::string_view kReaderRole = "quarry_reader";
inline constexpr std::string_view kAdminRole = "quarry_admin";
// The conversation history's database when conversations.store is postgres without a url.
inline constexpr std::string_view kHistoryDatabase = "quarry_history";

struct ServerInfo {
  uint16_t port = 0;
  std::filesystem::path socket_dir;
  // For people and other tools: postgresql://quarry_reader:...@127.0.0.1:PORT/analytics.
  std::string reader_url;
  // What quarry itself uses: key=value strings over the unix socket.
  std::string reader_conninfo;
  std::string admin_conninfo;
};

class PostgresServer {
 public:
  PostgresServer(const std::filesystem::path& state_dir, uint16_t port);

  // Initialises the cluster the first time, starts it unless it is running, and makes sure the
  // database and roles exist. Idempotent: a running server is left as it is.
  Result<ServerInfo> up(Progress* progress = nullptr);
  // Stops the server (fast shutdown). Returns false if it was not running.
  Result<bool> down();
  // The running server; kFailedPrecondition if it is not running.
  Result<ServerInfo> running() const;
  // The running server's history database (kHistoryDatabase, owned by the superuser role and
  // made on first use): a key=value string over the unix socket, for conversations.url.
  Result<std::string> history_conninfo() const;

  const std::filesystem::path& directory() const { return directory_; }
  std::filesystem::path log_file() const { return directory_ / "log/server.log"; }

 private:
  struct Credentials {
    std::string admin_password;
    std::string reader_password;
  };
  // The pid and port of a live postmaster, from its postmaster.pid.
  std::optional<uint16_t> live_port() const;
  Result<Credentials> load_or_create_credentials(bool create) const;
  Result<void> initialise(const Credentials& credentials);
  Result<void> start();
  Result<void> provision(const ServerInfo& info, const Credentials& credentials);
  ServerInfo info(uint16_t port, const Credentials& credentials) const;
  // A libpq key=value string for `user` on `database` over the unix socket.
  std::string conninfo(uint16_t port, std::string_view database, std::string_view user,
                       std::string_view password) const;

  std::filesystem::path directory_;  // <state>/postgres
  std::filesystem::path data_dir_;   // PGDATA
  std::filesystem::path socket_dir_;
  uint16_t port_;
};

}  // namespace quarry::data

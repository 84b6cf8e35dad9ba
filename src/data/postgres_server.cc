#include "data/postgres_server.h"

#include <pwd.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "common/command.h"
#include "common/file_util.h"
#include "data/connection.h"

namespace quarry::data {
namespace {

constexpr std::string_view kServerUser = "postgres";

// Settings for a private analytics server on a small machine: fast bulk loads (no WAL for
// tables created in the loading transaction, no synchronous commit), UTC.
constexpr std::string_view kSettings = R"(# Written by quarry (data/postgres_server.cc).
listen_addresses = '127.0.0.1'
unix_socket_directories = '{}'
max_connections = 50
shared_buffers = 256MB
work_mem = 32MB
maintenance_work_mem = 256MB
wal_level = minimal
max_wal_senders = 0
synchronous_commit = off
max_wal_size = 4GB
checkpoint_timeout = 30min
timezone = 'UTC'
log_timezone = 'UTC'
log_min_messages = warning
)";

// The newest Debian PostgreSQL server (/usr/lib/postgresql/<version>/bin).
Result<std::filesystem::path> server_bin_dir() {
  std::filesystem::path best;
  int best_version = 0;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator("/usr/lib/postgresql", error)) {
    const int version = std::atoi(entry.path().filename().c_str());
    if (version > best_version && ::access((entry.path() / "bin/initdb").c_str(), X_OK) == 0) {
      best_version = version;
      best = entry.path() / "bin";
    }
  }
  if (best.empty()) {
    return make_error(ErrorCode::kFailedPrecondition,
                      "the PostgreSQL server is not installed (no /usr/lib/postgresql/*/bin/"
                      "initdb); run scripts/setup, or set database.url to use another server");
  }
  return best;
}

// Runs a server program as the postgres user, with a minimal environment of its own.
Result<CommandOutput> run_as_server_user(const std::vector<std::string>& argv,
                                         const std::filesystem::path& working_directory) {
  std::vector<std::string> full = {"setpriv", fmt::format("--reuid={}", kServerUser),
                                   fmt::format("--regid={}", kServerUser), "--init-groups", "--"};
  full.insert(full.end(), argv.begin(), argv.end());
  CommandOptions options;
  options.environment = std::map<std::string, std::string>{
      {"PATH", "/usr/sbin:/usr/bin:/sbin:/bin"},
      {"LANG", "C.UTF-8"},
      {"HOME", working_directory.string()},
  };
  options.working_directory = working_directory;
  return run_command(full, options);
}

std::string random_password() {
  std::random_device device;
  std::string password;
  for (int word_idx = 0; word_idx < 4; ++word_idx) {
    password += fmt::format("{:08x}", device());
  }
  return password;
}

// A value for a libpq key=value string.
std::string conninfo_value(std::string_view value) {
  std::string quoted = "'";
  for (char c : value) {
    if (c == '\'' || c == '\\') quoted += '\\';
    quoted += c;
  }
  return quoted + "'";
}

Result<void> chown_to(const std::filesystem::path& path, const passwd& user) {
  if (::chown(path.c_str(), user.pw_uid, user.pw_gid) != 0) {
    return errno_error("chown '{}' to {}", path.string(), kServerUser);
  }
  return {};
}

Result<passwd> server_user() {
  const passwd* user = ::getpwnam(std::string(kServerUser).c_str());
  if (!user) {
    return make_error(ErrorCode::kFailedPrecondition,
                      "there is no '{}' system user to run PostgreSQL; run scripts/setup (the "
                      "postgresql package creates it)",
                      kServerUser);
  }
  return *user;
}

}  // namespace

PostgresServer::PostgresServer(const std::filesystem::path& state_dir, uint16_t port)
    : directory_(state_dir / "postgres"),
      data_dir_(directory_ / "data"),
      socket_dir_(directory_ / "run"),
      port_(port) {}

std::optional<uint16_t> PostgresServer::live_port() const {
  // postmaster.pid: pid, data directory, start time, port, socket directory, ...
  std::ifstream file(data_dir_ / "postmaster.pid");
  std::string pid_line, data_line, start_line, port_line;
  if (!std::getline(file, pid_line) || !std::getline(file, data_line) ||
      !std::getline(file, start_line) || !std::getline(file, port_line)) {
    return std::nullopt;
  }
  const pid_t pid = std::atoi(pid_line.c_str());
  if (pid <= 0 || (::kill(pid, 0) != 0 && errno == ESRCH)) return std::nullopt;
  const int port = std::atoi(port_line.c_str());
  if (port <= 0 || port > 65535) return std::nullopt;
  return static_cast<uint16_t>(port);
}

Result<PostgresServer::Credentials> PostgresServer::load_or_create_credentials(bool create) const {
  const auto path = directory_ / "credentials.json";
  if (std::filesystem::exists(path)) {
    ASSIGN_OR_RETURN(auto text, read_file(path));
    try {
      auto json = nlohmann::json::parse(text);
      return Credentials{json.at("admin_password"), json.at("reader_password")};
    } catch (const nlohmann::json::exception& error) {
      return make_error(ErrorCode::kInternal, "'{}' is damaged ({}); remove {} to start afresh",
                        path.string(), error.what(), directory_.string());
    }
  }
  if (!create) {
    return make_error(ErrorCode::kFailedPrecondition,
                      "'{}' is missing, so quarry cannot log in to its PostgreSQL; remove {} "
                      "(and with it the data) and run quarry db up again",
                      path.string(), directory_.string());
  }
  Credentials credentials{random_password(), random_password()};
  nlohmann::json json = {{"admin_password", credentials.admin_password},
                         {"reader_password", credentials.reader_password}};
  RETURN_IF_ERROR(write_file_atomic(path, json.dump(2) + "\n", 0600));
  return credentials;
}

Result<void> PostgresServer::initialise(const Credentials& credentials) {
  ASSIGN_OR_RETURN(auto bin, server_bin_dir());
  ASSIGN_OR_RETURN(auto user, server_user());
  // A half-made cluster (initdb interrupted) is made again from nothing.
  RETURN_IF_ERROR(remove_tree(data_dir_));
  RETURN_IF_ERROR(make_directories(data_dir_, 0700));
  RETURN_IF_ERROR(chown_to(data_dir_, user));
  // Every directory above the cluster must let the server user through (a umask of 077 or a
  // state directory under /root would not).
  if (!run_as_server_user({"test", "-w", data_dir_.string()}, "/")) {
    return make_error(ErrorCode::kPermissionDenied,
                      "the '{}' user cannot reach {}: every directory above it must be "
                      "searchable by others (chmod o+x), or use another --state-dir",
                      kServerUser, data_dir_.string());
  }
  // initdb reads the superuser's password from a file only the server user can read.
  const auto password_file = socket_dir_ / "initdb-password";
  RETURN_IF_ERROR(write_file_atomic(password_file, credentials.admin_password + "\n", 0600));
  RETURN_IF_ERROR(chown_to(password_file, user));
  auto initdb = run_as_server_user(
      {(bin / "initdb").string(), "--pgdata", data_dir_.string(), "--username",
       std::string(kAdminRole), "--pwfile", password_file.string(), "--auth", "scram-sha-256",
       "--encoding", "UTF8", "--locale", "C.UTF-8", "--no-instructions"},
      directory_);
  std::filesystem::remove(password_file);
  RETURN_IF_ERROR(with_context(std::move(initdb), "initdb"));
  const auto settings = data_dir_ / "quarry.conf";
  RETURN_IF_ERROR(write_file_atomic(
      settings, fmt::format(fmt::runtime(kSettings), socket_dir_.string()), 0600));
  RETURN_IF_ERROR(chown_to(settings, user));
  std::ofstream conf(data_dir_ / "postgresql.conf", std::ios::app);
  conf << "\ninclude 'quarry.conf'\n";
  if (!conf) return make_error(ErrorCode::kInternal, "appending to postgresql.conf failed");
  return {};
}

Result<void> PostgresServer::start() {
  ASSIGN_OR_RETURN(auto bin, server_bin_dir());
  auto started = run_as_server_user(
      {(bin / "pg_ctl").string(), "--pgdata", data_dir_.string(), "--log", log_file().string(),
       "--wait", "--timeout", "60", "-o", fmt::format("-p {}", port_), "start"},
      directory_);
  if (started) return {};
  // pg_ctl only says "could not start server"; the reason is at the end of the server's log.
  std::string reason;
  if (auto log = read_file(log_file())) reason = tail_lines(*log, 6);
  std::string hint;
  if (reason.find("Address already in use") != std::string::npos) {
    hint = fmt::format(" Port {} is taken by another program: choose another with database.port.",
                       port_);
  }
  return make_error(ErrorCode::kUnavailable,
                    "starting PostgreSQL on port {} failed; the end of {}:\n{}\n{}", port_,
                    log_file().string(), reason, hint);
}

std::string PostgresServer::conninfo(uint16_t port, std::string_view database,
                                     std::string_view user, std::string_view password) const {
  return fmt::format("host={} port={} dbname={} user={} password={}",
                     conninfo_value(socket_dir_.string()), port, database, user,
                     conninfo_value(password));
}

ServerInfo PostgresServer::info(uint16_t port, const Credentials& credentials) const {
  ServerInfo info;
  info.port = port;
  info.socket_dir = socket_dir_;
  info.reader_url = fmt::format("postgresql://{}:{}@127.0.0.1:{}/{}", kReaderRole,
                                credentials.reader_password, port, kDatabaseName);
  info.reader_conninfo = conninfo(port, kDatabaseName, kReaderRole, credentials.reader_password);
  info.admin_conninfo = conninfo(port, kDatabaseName, kAdminRole, credentials.admin_password);
  return info;
}

Result<void> PostgresServer::provision(const ServerInfo& info, const Credentials& credentials) {
  // The database first, from the maintenance database (CREATE DATABASE cannot run in a DO).
  const std::string maintenance =
      conninfo(info.port, "postgres", kAdminRole, credentials.admin_password);
  {
    ASSIGN_OR_RETURN(auto connection, Connection::open(maintenance));
    ASSIGN_OR_RETURN(auto exists, connection.exec("SELECT 1 FROM pg_database WHERE datname = $1",
                                                  {std::string(kDatabaseName)}));
    if (PQntuples(exists.get()) == 0) {
      RETURN_IF_ERROR(connection.exec(fmt::format("CREATE DATABASE {}", kDatabaseName)));
    }
    char* password = PQescapeLiteral(connection.get(), credentials.reader_password.c_str(),
                                     credentials.reader_password.size());
    if (!password) return make_error(ErrorCode::kInternal, "escaping the password failed");
    const std::string literal = password;
    PQfreemem(password);
    // The reader may log in and read, nothing else: no superuser, no roles to switch to (so
    // SET ROLE fails), no pg_execute_server_program (so COPY ... TO PROGRAM fails), and every
    // transaction read-only by default.
    RETURN_IF_ERROR(connection.exec_script(fmt::format(
        R"(DO $$ BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{0}') THEN CREATE ROLE {0}; END IF;
END $$;
ALTER ROLE {0} WITH LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS
  NOINHERIT CONNECTION LIMIT 20 PASSWORD {1};
ALTER ROLE {0} SET default_transaction_read_only = on;
REVOKE ALL ON DATABASE postgres FROM PUBLIC;
REVOKE ALL ON DATABASE template1 FROM PUBLIC;
REVOKE ALL ON DATABASE {2} FROM PUBLIC;
GRANT CONNECT ON DATABASE {2} TO {0};)",
        kReaderRole, literal, kDatabaseName)));
  }
  ASSIGN_OR_RETURN(auto connection, Connection::open(info.admin_conninfo));
  // Every user's queries run as the one reader role, and PostgreSQL lets a role see the SQL of
  // its other sessions and end them: the reader may do neither (quarry cancels its own queries
  // with libpq's cancel request, which needs no function). Functions' grants are per database;
  // the reader may connect to this one only. Run at every `db up`, so a server made by an older
  // quarry gets them too.
  return connection.exec_script(fmt::format(
      R"(REVOKE ALL ON SCHEMA public FROM PUBLIC;
GRANT USAGE ON SCHEMA public TO {0};
GRANT SELECT ON ALL TABLES IN SCHEMA public TO {0};
ALTER DEFAULT PRIVILEGES FOR ROLE {1} IN SCHEMA public GRANT SELECT ON TABLES TO {0};
REVOKE SELECT ON pg_catalog.pg_stat_activity FROM PUBLIC;
DO $$ DECLARE f regprocedure; BEGIN
  FOR f IN SELECT oid FROM pg_catalog.pg_proc
      WHERE pronamespace = 'pg_catalog'::regnamespace AND proname IN ('pg_terminate_backend',
        'pg_cancel_backend', 'pg_stat_get_activity', 'pg_stat_get_backend_activity') LOOP
    EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', f);
  END LOOP;
END $$;)",
      kReaderRole, kAdminRole));
}

Result<ServerInfo> PostgresServer::up(Progress* progress) {
  if (::geteuid() != 0) {
    return make_error(ErrorCode::kPermissionDenied,
                      "quarry db up needs root: it runs PostgreSQL as the '{}' user", kServerUser);
  }
  ASSIGN_OR_RETURN(auto user, server_user());
  RETURN_IF_ERROR(make_directories(directory_, 0755));
  if (::chmod(directory_.c_str(), 0755) != 0) return errno_error("chmod '{}'", directory_.string());
  for (const auto& dir : {socket_dir_, log_file().parent_path()}) {
    RETURN_IF_ERROR(make_directories(dir, 0755));
    RETURN_IF_ERROR(chown_to(dir, user));
  }

  const bool initialised = std::filesystem::exists(data_dir_ / "PG_VERSION");
  ASSIGN_OR_RETURN(auto credentials, load_or_create_credentials(!initialised));
  if (!initialised) {
    if (progress) progress->step("initdb");
    RETURN_IF_ERROR(initialise(credentials));
  }
  auto port = live_port();
  if (!port) {
    if (progress) progress->step(fmt::format("starting on port {}", port_));
    RETURN_IF_ERROR(start());
    port = live_port();
    if (!port) {
      return make_error(ErrorCode::kInternal,
                        "PostgreSQL started but left no postmaster.pid; see {}",
                        log_file().string());
    }
  }
  if (progress) progress->step("database and roles");
  ServerInfo server = info(*port, credentials);
  RETURN_IF_ERROR(with_context(provision(server, credentials), "setting up the database"));
  return server;
}

Result<bool> PostgresServer::down() {
  if (!live_port()) return false;
  ASSIGN_OR_RETURN(auto bin, server_bin_dir());
  RETURN_IF_ERROR(
      with_context(run_as_server_user({(bin / "pg_ctl").string(), "--pgdata", data_dir_.string(),
                                       "--mode", "fast", "--wait", "--timeout", "60", "stop"},
                                      directory_),
                   "stopping PostgreSQL"));
  return true;
}

Result<ServerInfo> PostgresServer::running() const {
  auto port = live_port();
  if (!port) {
    return make_error(ErrorCode::kFailedPrecondition,
                      "quarry's PostgreSQL is not running; start it with `quarry db up` (or set "
                      "database.url to use another server)");
  }
  ASSIGN_OR_RETURN(auto credentials, load_or_create_credentials(false));
  return info(*port, credentials);
}

Result<std::string> PostgresServer::history_conninfo() const {
  ASSIGN_OR_RETURN(auto info, running());
  ASSIGN_OR_RETURN(auto credentials, load_or_create_credentials(false));
  ASSIGN_OR_RETURN(auto connection, Connection::open(info.admin_conninfo));
  auto exists = [&]() -> Result<bool> {
    ASSIGN_OR_RETURN(auto found, connection.exec("SELECT 1 FROM pg_database WHERE datname = $1",
                                                 {std::string(kHistoryDatabase)}));
    return PQntuples(found.get()) > 0;
  };
  ASSIGN_OR_RETURN(bool made, exists());
  if (!made) {
    // Servers starting at once may both try: the one that loses finds it made.
    auto created = connection.exec(fmt::format("CREATE DATABASE {}", kHistoryDatabase));
    if (!created) {
      ASSIGN_OR_RETURN(made, exists());
      if (!made) return std::unexpected(created.error());
    }
  }
  // A new database lets every role connect; the reader must not, as the walls provision()
  // puts up (no other sessions seen or ended) stand in the analytics database only. Also for a
  // history database an older quarry made.
  RETURN_IF_ERROR(
      connection.exec(fmt::format("REVOKE ALL ON DATABASE {} FROM PUBLIC", kHistoryDatabase)));
  return conninfo(info.port, kHistoryDatabase, kAdminRole, credentials.admin_password);
}

}  // namespace quarry::data

// quarry's configuration: one typed, validated structure loaded from config.yml.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/units.h"

namespace quarry {

struct ResourceLimits {
  double cpus = 1.0;               // CPU quota in cores (0.5 = half a core)
  uint64_t memory_bytes = kGiB;    // hard memory limit, no swap
  uint64_t disk_bytes = 2 * kGiB;  // size of the sandbox's writable layer
  uint32_t pids = 256;             // processes and threads
};

enum class NetworkMode { kNone, kAllowlist };

struct NetworkPolicy {
  NetworkMode mode = NetworkMode::kNone;
  std::vector<std::string> allow;  // domains, for kAllowlist
};

// Settings of the local provider only.
struct LocalProviderConfig {
  // Size of the volume that holds every sandbox's writable layer (sparse; grows as used).
  uint64_t volume_bytes = 64 * kGiB;
  // Remount the host's cgroup2 with favordynmods, so that starting a sandbox or a command does
  // not wait for an RCU grace period (see sandbox/local/cgroup.h).
  bool favordynmods = true;
  // Each sandbox's reads and writes on the volume, per second (0: no limit), so that one
  // sandbox cannot take the disk that every sandbox shares.
  struct DiskIo {
    uint64_t read_bytes = 256 * kMiB;
    uint64_t write_bytes = 128 * kMiB;
    uint64_t iops = 4000;  // each of reads and writes
  } disk_io;
};

// What the files an analysis writes may cost the host's artifact store: the sandbox writes
// them for free (a sparse or hard-linked file costs it nothing), the host pays for every copy.
struct ArtifactLimits {
  uint64_t max_file_bytes = 50 * kMiB;         // one collected file
  uint64_t max_step_bytes = 200 * kMiB;        // everything collected after one command
  uint64_t max_conversation_bytes = 2 * kGiB;  // everything one conversation keeps
};

// The largest max_file with conversations.store: postgres, which keeps each artifact's bytes in
// one value: PostgreSQL takes at most 1 GB in one (a field, and a protocol message with it).
inline constexpr uint64_t kMaxPostgresArtifactBytes = 1000 * kMiB;

// How long snapshots that no sandbox uses are kept (sandbox.snapshots; unused since the last
// sandbox started from one or ended). Package snapshots are a cache that quarry makes and finds
// by itself; named ones someone made on purpose, so by default they stay until removed.
struct SnapshotConfig {
  std::optional<Duration> keep_unused = std::chrono::days(7);  // package snapshots; unset: kept
  std::optional<Duration> keep_unused_named;                   // unset: kept
};

// Settings of the Daytona provider (sandbox.provider: daytona): a remote engine that speaks
// Daytona's API (Daytona itself, or another quarry's /daytona).
struct DaytonaConfig {
  std::string api_url;  // the main API's base, e.g. https://daytona.example.com/api
  std::string api_key_env = "DAYTONA_API_KEY";  // the variable holding the API key
  std::string target;                           // the region; "" for the organisation's own
  // What sandboxes are made from: a Daytona snapshot by name, else an image (a Dockerfile
  // "FROM image"); neither: Daytona's default snapshot. A snapshot brings its own resources.
  std::string snapshot;
  std::string image;
  // Daytona stops a sandbox idle this long (0: never) and deletes a stopped one after
  // auto_delete (unset: never): a net under quarry's own idle_timeout, for a server that died.
  Duration auto_stop = std::chrono::minutes(30);
  std::optional<Duration> auto_delete = std::chrono::minutes(0);
  std::map<std::string, std::string> labels;            // added to every sandbox's
  Duration create_timeout = std::chrono::minutes(3);    // until the sandbox is started
  Duration delete_timeout = std::chrono::minutes(1);    // until it is gone
  Duration request_timeout = std::chrono::seconds(60);  // one call (an exec: its timeout more)
  Duration connect_timeout = std::chrono::seconds(10);
  uint32_t max_retries = 4;  // of a call that failed in a way worth trying again
  std::string ca_file;       // PEM CA certificates for https; empty: the system's
  // Several accounts (organisations, or keys with quotas of their own), each with its key's
  // variable and the most sandboxes quarry keeps in it (0: no more than capacity.max_sandboxes).
  // New sandboxes go to the account with most room; empty: one account, api_key_env's.
  struct Account {
    std::string name;
    std::string api_key_env;
    uint32_t max_sandboxes = 0;
  };
  std::vector<Account> accounts;
};

struct SandboxConfig {
  std::string provider = "local";
  // The image's Python packages. The built-in set is pinned to versions whose APIs the code
  // models usually write expects (DuckDB 1, Polars 1, pandas 2), and its lock, every package
  // with its hash, is built into quarry (src/sandbox/local/python.lock).
  std::vector<std::string> packages = {"polars==1.35.2", "duckdb==1.4.5", "pyarrow==22.0.0",
                                       "pandas==2.3.3",  "numpy==2.3.5",  "matplotlib==3.10.9",
                                       "plotly==6.5.2"};
  // The lock of those packages (quarry image lock writes it): sandbox.lock, relative to the
  // configuration file, else <config name>.lock beside it (config.yml -> config.lock); empty
  // without a configuration file. The built-in lock is used instead when the packages are the
  // built-in set and no lock was named or made.
  std::filesystem::path lock_file;
  bool lock_named = false;  // sandbox.lock was given
  std::string data_dir = "/home/sandbox/data";
  std::string output_dir = "/home/sandbox/outputs";
  uint64_t export_max_rows = 100000;
  ResourceLimits resources;
  Duration exec_timeout = std::chrono::seconds(120);
  Duration idle_timeout = std::chrono::minutes(15);
  NetworkPolicy network;
  uint64_t output_limit_bytes = kMiB;  // stdout and stderr kept per exec, each
  ArtifactLimits artifacts;
  SnapshotConfig snapshots;
  LocalProviderConfig local;
  DaytonaConfig daytona;
};

// Where the data comes from (data/): quarry's private PostgreSQL (`quarry db up`) unless `url`
// names another server.
struct DatabaseConfig {
  // libpq connection string or URL of an external server, used instead of the private one.
  // Give it a read-only role: quarry adds READ ONLY transactions, but the role is the wall.
  std::string url;
  uint16_t port = 55432;                                  // loopback port of the private server
  uint64_t query_max_rows = 200;                          // rows query_database returns at most
  Duration statement_timeout = std::chrono::seconds(30);  // per query and per export
  uint64_t export_row_group_rows = 131072;  // rows per Parquet row group (also bounded by bytes)
};

// What the model sees of a conversation's history (conversation/context_filter.h).
struct ContextConfig {
  uint64_t budget_chars = 96'000;      // about 24k tokens
  uint64_t tool_output_chars = 8'000;  // one tool result, before it is cut
  uint32_t recent_turns = 2;           // turns whose tool results are kept in full
};

struct ConversationsConfig {
  // Labels this installation's sandboxes; a server restarting cleans up only its own.
  std::string instance_id = "local";
  // Where the history lives: "sqlite" (<state>/history.db, one server) or "postgres" (`url`,
  // which several servers may share).
  std::string store = "sqlite";
  // libpq URL or key=value string of the PostgreSQL database for store: postgres. It may hold a
  // password: never put it in a message.
  std::string url;
  // With a postgres store: a server whose heartbeat is older than this is taken for dead, and a
  // live server removes its sandboxes and records its running turns interrupted. Servers
  // refresh their heartbeat every sixth of it (at most every 5 s).
  Duration server_timeout = std::chrono::seconds(30);
  ContextConfig context;
};

// The language model the agent talks to (agent/model_client.h): any server that speaks
// OpenAI's chat-completions protocol with tool calls and streaming.
struct ModelConfig {
  std::string base_url = "https://api.openai.com/v1";  // parsed with parse_url at load
  std::string name = "gpt-4o";                         // the request's "model"
  // The environment variable that holds the API key. A loopback base_url may run without it;
  // "" means the server needs no key wherever it is.
  std::string api_key_env = "OPENAI_API_KEY";
  Duration timeout = std::chrono::minutes(5);           // one request, until its last token
  Duration connect_timeout = std::chrono::seconds(10);  // resolve, connect and TLS handshake
  uint32_t max_retries = 3;           // after 429, 5xx and connection failures; 0 = one attempt
  uint32_t max_steps = 12;            // model calls per user turn (the agent loop's limit)
  std::optional<double> temperature;  // unset: the server's default
  // A PEM file of CA certificates to trust instead of the system's (a private gateway, tests).
  std::string ca_file;
};

// quarry serve: the HTTP API.
struct ServerConfig {
  std::string listen = "127.0.0.1:8080";  // host:port
  // API tokens (quarry token create); "" means <state>/tokens.json. Without the file the server
  // has one user, "local", and listens on loopback only.
  std::string tokens_file;
  uint64_t max_body = kMiB;  // largest request body
  // Largest file upload or download through the Daytona-compatible API (files/bulk-upload's
  // body, which max_body would refuse; all files of one bulk-download), held in memory.
  uint64_t max_file_transfer = 256 * kMiB;
  Duration shutdown_grace = std::chrono::seconds(30);  // running turns may finish in this
  uint32_t workers = 8;                                // turns and cells running at once
  Duration session_lifetime = std::chrono::hours(12);  // a browser sign-in lasts this long
  // The web UI's files; "" means the ones built beside the quarry executable (build/web, or
  // <prefix>/share/quarry/web when installed).
  std::string web_dir;
};

// How a limited number of sandboxes is shared among conversations (capacity/scheduler.h).
struct CapacityConfig {
  uint32_t max_sandboxes = 16;  // at once, in total: warm, starting, busy and idle
  uint32_t max_per_user = 4;    // held by one user's conversations
  // Turns waiting for a sandbox (or a worker); a new turn past it is refused (HTTP 429).
  uint32_t max_queue = 100;
  Duration queue_timeout = std::chrono::minutes(2);  // a turn waits this long, then fails
  struct WarmPool {
    uint32_t min_idle = 0;  // sandboxes kept started and ready for a conversation's first use
  } warm_pool;
  // The provider's accounts, each with a quota of its own: name -> max sandboxes. Empty: one
  // account, "local", with max_sandboxes. The local provider has a single account.
  std::vector<std::pair<std::string, uint32_t>> accounts;
  // How far the limits of all sandboxes together may exceed what the host has: the local
  // provider refuses a sandbox past it. 1.0: the sum of memory limits stays under the host's
  // memory less a reserve, the sum of disk limits under what the volume can back; CPU quotas
  // are time shared, so they may add up to several times the cores.
  struct Overcommit {
    double memory = 1.0;
    double cpu = 4.0;
    double disk = 1.0;
  } overcommit;
};

struct Config {
  SandboxConfig sandbox;
  CapacityConfig capacity;
  DatabaseConfig database;
  ConversationsConfig conversations;
  ModelConfig model;
  ServerConfig server;
  // Where the configuration came from, for messages ("built-in defaults" if no file).
  std::string source = "built-in defaults";
};

// Parses YAML text. `source` names it in error messages ("config.yml").
// Unknown keys and bad values are errors that carry the key's path and line.
Result<Config> parse_config(std::string_view yaml_text, std::string_view source);

// Picks the file: `explicit_path` (--config), else $QUARRY_CONFIG, else ./config.yml if it
// exists, else the built-in defaults.
Result<Config> load_config(const std::optional<std::filesystem::path>& explicit_path);

// Checks a resource request (from the CLI or an API) with the same rules as the config file.
Result<void> validate_resources(const ResourceLimits& resources);

// Whether `spec` is a plain Python requirement, as sandbox.packages takes them ("polars",
// "polars==1.9.0", "polars[pyarrow]>=1"): no URL, path or option.
bool valid_package_requirement(std::string_view spec);

}  // namespace quarry

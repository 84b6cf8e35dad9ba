#include "config/config.h"

#include <yaml-cpp/yaml.h>

#include <cstdlib>
#include <limits>

#include "common/file_util.h"
#include "common/url.h"
#include "config/allowlist.h"
#include "config/yaml_reader.h"

namespace quarry {
namespace {

// config.yml's own kinds of value on top of the shared YAML reader.
class Walker : public YamlReader {
 public:
  using YamlReader::YamlReader;

  Result<uint64_t> size(const YAML::Node& node, std::string_view path) const {
    ASSIGN_OR_RETURN(auto text, scalar(node, path));
    auto value = parse_size(text);
    if (!value) return fail(node, path, "{}", value.error().message);
    return *value;
  }

  Result<Duration> positive_duration(const YAML::Node& node, std::string_view path) const {
    ASSIGN_OR_RETURN(auto value, duration(node, path));
    if (value.count() <= 0) return fail(node, path, "must be longer than zero");
    return value;
  }

  Result<uint64_t> count(const YAML::Node& node, std::string_view path, uint64_t min,
                         uint64_t max) const {
    return whole_number(node, path, min, max);
  }

  // A host file or directory the configuration names: found from the file's directory when
  // relative (resolve_files). quarry expands no '~', so one is refused with what to write.
  Result<std::string> host_path(const YAML::Node& node, std::string_view path) const {
    ASSIGN_OR_RETURN(auto text, scalar(node, path));
    if (text.starts_with('~')) {
      return fail(node, path,
                  "'{}': quarry does not expand '~'; write the whole path, or one relative to "
                  "this file's directory",
                  text);
    }
    return text;
  }

  // An absolute, normalised directory path inside the sandbox, of the user's own (quarry makes
  // it at every start, owned by the sandbox's user); `example` names one.
  Result<std::string> sandbox_dir(const YAML::Node& node, std::string_view path,
                                  std::string_view example) const {
    ASSIGN_OR_RETURN(auto text, scalar(node, path));
    std::filesystem::path dir(text);
    if (!dir.is_absolute()) return fail(node, path, "'{}' must be an absolute path", text);
    if (dir.lexically_normal() != dir || text.find("..") != std::string::npos ||
        text.back() == '/') {
      return fail(node, path, "'{}' must be a plain absolute path without '..' or a trailing '/'",
                  text);
    }
    // /sbin and the /lib* beside /lib are links in Debian's root.
    for (std::string_view reserved : {"/proc", "/dev", "/sys", "/usr", "/bin", "/sbin", "/lib",
                                      "/lib32", "/lib64", "/libx32", "/etc", "/boot"}) {
      if (text == reserved || text.starts_with(fmt::format("{}/", reserved))) {
        return fail(node, path, "'{}' is inside the system directory {}", text, reserved);
      }
    }
    if (text == "/") return fail(node, path, "must not be '/'");
    for (std::string_view shared :
         {"/home", "/root", "/tmp", "/var", "/run", "/opt", "/srv", "/mnt", "/media"}) {
      if (text == shared) {
        return fail(node, path,
                    "'{}' is a directory of the system's own; name one inside it or elsewhere, "
                    "e.g. {}",
                    text, example);
      }
    }
    return text;
  }
};

Result<void> parse_resources(const Walker& walk, const YAML::Node& node, std::string_view path,
                             ResourceLimits& out) {
  RETURN_IF_ERROR(walk.check_map(node, path, {"cpus", "memory", "disk", "pids"}));
  if (node.IsNull()) return {};
  if (auto value = node["cpus"]) {
    ASSIGN_OR_RETURN(out.cpus, walk.number(value, fmt::format("{}.cpus", path)));
  }
  if (auto value = node["memory"]) {
    ASSIGN_OR_RETURN(out.memory_bytes, walk.size(value, fmt::format("{}.memory", path)));
  }
  if (auto value = node["disk"]) {
    ASSIGN_OR_RETURN(out.disk_bytes, walk.size(value, fmt::format("{}.disk", path)));
  }
  if (auto value = node["pids"]) {
    ASSIGN_OR_RETURN(auto pids, walk.count(value, fmt::format("{}.pids", path), 1, 4194304));
    out.pids = static_cast<uint32_t>(pids);
  }
  if (auto valid = validate_resources(out); !valid) {
    return walk.fail(node, path, "{}", valid.error().message);
  }
  return {};
}

Result<void> parse_network(const Walker& walk, const YAML::Node& node, std::string_view path,
                           NetworkPolicy& out) {
  RETURN_IF_ERROR(walk.check_map(node, path, {"mode", "allow"}));
  if (node.IsNull()) return {};
  if (auto value = node["mode"]) {
    ASSIGN_OR_RETURN(auto mode, walk.scalar(value, fmt::format("{}.mode", path)));
    if (mode == "none") {
      out.mode = NetworkMode::kNone;
    } else if (mode == "allowlist") {
      out.mode = NetworkMode::kAllowlist;
    } else {
      return walk.fail(value, fmt::format("{}.mode", path),
                       "'{}' is not a network mode (use none or allowlist)", mode);
    }
  }
  if (auto value = node["allow"]) {
    ASSIGN_OR_RETURN(auto entries, walk.scalar_list(value, fmt::format("{}.allow", path)));
    out.allow.clear();
    for (size_t i = 0; i < entries.size(); ++i) {
      auto entry = parse_allow_entry(entries[i]);
      if (!entry) {
        return walk.fail(value[i], fmt::format("{}.allow[{}]", path, i), "{}",
                         entry.error().message);
      }
      if (std::find(out.allow.begin(), out.allow.end(), *entry) == out.allow.end()) {
        out.allow.push_back(std::move(*entry));
      }
    }
  }
  if (out.mode == NetworkMode::kNone && !out.allow.empty()) {
    return walk.fail(node, fmt::format("{}.allow", path),
                     "is only meaningful with mode: allowlist");
  }
  if (out.mode == NetworkMode::kAllowlist && out.allow.empty()) {
    return walk.fail(node, fmt::format("{}.allow", path),
                     "mode allowlist needs at least one domain in allow");
  }
  return {};
}

Result<void> parse_artifact_limits(const Walker& walk, const YAML::Node& node,
                                   ArtifactLimits& out) {
  RETURN_IF_ERROR(
      walk.check_map(node, "sandbox.artifacts", {"max_file", "max_step", "max_conversation"}));
  if (node.IsNull()) return {};
  const std::pair<const char*, uint64_t*> sizes[] = {
      {"max_file", &out.max_file_bytes},
      {"max_step", &out.max_step_bytes},
      {"max_conversation", &out.max_conversation_bytes}};
  for (const auto& [key, size] : sizes) {
    if (auto value = node[key]) {
      ASSIGN_OR_RETURN(*size, walk.size(value, fmt::format("sandbox.artifacts.{}", key)));
    }
  }
  if (out.max_file_bytes > out.max_step_bytes || out.max_step_bytes > out.max_conversation_bytes) {
    return walk.fail(node, "sandbox.artifacts",
                     "needs max_file <= max_step <= max_conversation (now {}, {}, {})",
                     format_size(out.max_file_bytes), format_size(out.max_step_bytes),
                     format_size(out.max_conversation_bytes));
  }
  return {};
}

// A duration, or "never" (nullopt).
Result<std::optional<Duration>> duration_or_never(const Walker& walk, const YAML::Node& node,
                                                  std::string_view path) {
  ASSIGN_OR_RETURN(auto text, walk.scalar(node, path));
  if (text == "never") return std::nullopt;
  auto value = parse_duration(text);
  if (!value) return walk.fail(node, path, "{}; or never, to keep them", value.error().message);
  return *value;
}

Result<void> parse_snapshots(const Walker& walk, const YAML::Node& node, SnapshotConfig& out) {
  RETURN_IF_ERROR(walk.check_map(node, "sandbox.snapshots", {"keep_unused", "keep_unused_named"}));
  if (node.IsNull()) return {};
  if (auto value = node["keep_unused"]) {
    ASSIGN_OR_RETURN(out.keep_unused,
                     duration_or_never(walk, value, "sandbox.snapshots.keep_unused"));
  }
  if (auto value = node["keep_unused_named"]) {
    ASSIGN_OR_RETURN(out.keep_unused_named,
                     duration_or_never(walk, value, "sandbox.snapshots.keep_unused_named"));
  }
  return {};
}

// An environment variable's name (letters, digits, '_', not starting with a digit), or "".
bool valid_variable_name(std::string_view name) {
  const bool valid = std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
  });
  return valid && (name.empty() || !std::isdigit(static_cast<unsigned char>(name.front())));
}

Result<void> parse_daytona_accounts(const Walker& walk, const YAML::Node& node,
                                    DaytonaConfig& out) {
  constexpr std::string_view kExample =
      "e.g. 'accounts: [{name: team-a, api_key_env: DAYTONA_KEY_A, max_sandboxes: 8}]'";
  if (!node.IsSequence()) {
    return walk.fail(node, "sandbox.daytona.accounts", "must list the accounts, {}", kExample);
  }
  for (size_t i = 0; i < node.size(); ++i) {
    const auto& entry = node[i];
    const std::string path = fmt::format("sandbox.daytona.accounts[{}]", i);
    if (!entry.IsMap()) {
      return walk.fail(entry, path, "must be a map with name, api_key_env and max_sandboxes, {}",
                       kExample);
    }
    RETURN_IF_ERROR(walk.check_map(entry, path, {"name", "api_key_env", "max_sandboxes"}));
    DaytonaConfig::Account account;
    for (auto [key, field] :
         {std::pair{"name", &account.name}, {"api_key_env", &account.api_key_env}}) {
      if (!entry[key]) return walk.fail(entry, path, "needs {}, {}", key, kExample);
      ASSIGN_OR_RETURN(*field, walk.scalar(entry[key], fmt::format("{}.{}", path, key)));
    }
    const bool valid_name =
        !account.name.empty() && std::all_of(account.name.begin(), account.name.end(), [](char c) {
          return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.';
        });
    if (!valid_name) {
      return walk.fail(entry["name"], path + ".name",
                       "'{}' is not an account name (letters, digits, '-', '_', '.')",
                       account.name);
    }
    for (const auto& earlier : out.accounts) {
      if (earlier.name == account.name) {
        return walk.fail(entry["name"], path + ".name", "account '{}' is listed twice",
                         account.name);
      }
    }
    if (!valid_variable_name(account.api_key_env) || account.api_key_env.empty()) {
      return walk.fail(entry["api_key_env"], path + ".api_key_env",
                       "'{}' is not an environment variable name (letters, digits, '_')",
                       account.api_key_env);
    }
    if (auto value = entry["max_sandboxes"]) {
      ASSIGN_OR_RETURN(auto max, walk.count(value, path + ".max_sandboxes", 1, 10000));
      account.max_sandboxes = static_cast<uint32_t>(max);
    }
    out.accounts.push_back(std::move(account));
  }
  return {};
}

Result<void> parse_daytona(const Walker& walk, const YAML::Node& node, DaytonaConfig& out) {
  RETURN_IF_ERROR(
      walk.check_map(node, "sandbox.daytona",
                     {"api_url", "api_key_env", "target", "snapshot", "image", "auto_stop",
                      "auto_delete", "labels", "create_timeout", "delete_timeout",
                      "request_timeout", "connect_timeout", "max_retries", "ca_file", "accounts"}));
  if (node.IsNull()) return {};
  if (auto value = node["api_url"]) {
    ASSIGN_OR_RETURN(out.api_url, walk.scalar(value, "sandbox.daytona.api_url"));
    if (auto url = parse_url(out.api_url); !out.api_url.empty() && !url) {
      return walk.fail(value, "sandbox.daytona.api_url", "{}", url.error().message);
    }
  }
  if (auto value = node["api_key_env"]) {
    ASSIGN_OR_RETURN(out.api_key_env, walk.scalar(value, "sandbox.daytona.api_key_env"));
    if (out.api_key_env.empty() || !valid_variable_name(out.api_key_env)) {
      return walk.fail(value, "sandbox.daytona.api_key_env",
                       "'{}' is not an environment variable name (letters, digits, '_')",
                       out.api_key_env);
    }
  }
  for (auto [key, field] :
       {std::pair{"target", &out.target}, {"snapshot", &out.snapshot}, {"image", &out.image}}) {
    if (auto value = node[key]) {
      ASSIGN_OR_RETURN(*field, walk.scalar(value, fmt::format("sandbox.daytona.{}", key)));
    }
  }
  if (auto value = node["ca_file"]) {
    ASSIGN_OR_RETURN(out.ca_file, walk.host_path(value, "sandbox.daytona.ca_file"));
  }
  if (!out.snapshot.empty() && !out.image.empty()) {
    return walk.fail(node["image"], "sandbox.daytona.image",
                     "give a snapshot or an image, not both (Daytona refuses both)");
  }
  if (auto value = node["auto_stop"]) {
    ASSIGN_OR_RETURN(out.auto_stop, walk.duration(value, "sandbox.daytona.auto_stop"));
  }
  if (auto value = node["auto_delete"]) {
    ASSIGN_OR_RETURN(out.auto_delete,
                     duration_or_never(walk, value, "sandbox.daytona.auto_delete"));
  }
  for (auto [key, field] : {std::pair{"create_timeout", &out.create_timeout},
                            {"delete_timeout", &out.delete_timeout},
                            {"request_timeout", &out.request_timeout},
                            {"connect_timeout", &out.connect_timeout}}) {
    if (auto value = node[key]) {
      ASSIGN_OR_RETURN(*field,
                       walk.positive_duration(value, fmt::format("sandbox.daytona.{}", key)));
    }
  }
  if (auto value = node["max_retries"]) {
    ASSIGN_OR_RETURN(auto retries, walk.count(value, "sandbox.daytona.max_retries", 0, 10));
    out.max_retries = static_cast<uint32_t>(retries);
  }
  if (auto labels = node["labels"]) {
    if (!labels.IsMap()) {
      return walk.fail(labels, "sandbox.daytona.labels", "must map label names to values");
    }
    RETURN_IF_ERROR(walk.check_names(labels, "sandbox.daytona.labels"));
    for (const auto& entry : labels) {
      ASSIGN_OR_RETURN(auto name, walk.scalar(entry.first, "sandbox.daytona.labels"));
      ASSIGN_OR_RETURN(auto value,
                       walk.scalar(entry.second, fmt::format("sandbox.daytona.labels.{}", name)));
      if (name.starts_with("quarry.")) {
        return walk.fail(entry.first, "sandbox.daytona.labels",
                         "'{}': labels starting with 'quarry.' are quarry's own", name);
      }
      out.labels[name] = value;
    }
  }
  if (auto accounts = node["accounts"]) {
    RETURN_IF_ERROR(parse_daytona_accounts(walk, accounts, out));
    if (node["api_key_env"] && !out.accounts.empty()) {
      return walk.fail(node["api_key_env"], "sandbox.daytona.api_key_env",
                       "each of sandbox.daytona.accounts names its own key's variable; remove "
                       "api_key_env, or the accounts for one key");
    }
  }
  return {};
}

Result<void> parse_sandbox(const Walker& walk, const YAML::Node& node, SandboxConfig& out) {
  constexpr std::string_view kPath = "sandbox";
  RETURN_IF_ERROR(
      walk.check_map(node, kPath,
                     {"provider", "packages", "lock", "data_dir", "output_dir", "export_max_rows",
                      "resources", "exec_timeout", "idle_timeout", "network", "output_limit",
                      "artifacts", "snapshots", "local", "daytona"}));
  if (node.IsNull()) return {};
  if (auto value = node["provider"]) {
    ASSIGN_OR_RETURN(out.provider, walk.scalar(value, "sandbox.provider"));
    if (out.provider != "local" && out.provider != "daytona") {
      return walk.fail(value, "sandbox.provider",
                       "'{}' is not an available provider (available: local, daytona)",
                       out.provider);
    }
  }
  if (auto value = node["packages"]) {
    ASSIGN_OR_RETURN(out.packages, walk.scalar_list(value, "sandbox.packages"));
    for (size_t i = 0; i < out.packages.size(); ++i) {
      if (!valid_package_requirement(out.packages[i])) {
        return walk.fail(value[i], fmt::format("sandbox.packages[{}]", i),
                         "'{}' is not a package requirement (e.g. polars or polars==1.9.0)",
                         out.packages[i]);
      }
    }
  }
  if (auto value = node["lock"]) {
    ASSIGN_OR_RETURN(auto lock, walk.host_path(value, "sandbox.lock"));
    if (lock.empty() || lock.find('\0') != std::string::npos ||
        lock.find('\n') != std::string::npos) {
      return walk.fail(value, "sandbox.lock", "must name a file (e.g. config.lock)");
    }
    out.lock_file = lock;
    out.lock_named = true;
  }
  const SandboxConfig defaults;
  if (auto value = node["data_dir"]) {
    ASSIGN_OR_RETURN(out.data_dir, walk.sandbox_dir(value, "sandbox.data_dir", defaults.data_dir));
  }
  if (auto value = node["output_dir"]) {
    ASSIGN_OR_RETURN(out.output_dir,
                     walk.sandbox_dir(value, "sandbox.output_dir", defaults.output_dir));
  }
  if (out.data_dir == out.output_dir) {
    return walk.fail(node, "sandbox.output_dir", "must differ from sandbox.data_dir");
  }
  // Every file under the output directory is collected as an artifact, exports included.
  if (out.output_dir.starts_with(out.data_dir + "/")) {
    return walk.fail(node["output_dir"] ? node["output_dir"] : node, "sandbox.output_dir",
                     "'{}' is inside sandbox.data_dir '{}'; keep the two apart", out.output_dir,
                     out.data_dir);
  }
  if (out.data_dir.starts_with(out.output_dir + "/")) {
    return walk.fail(node["data_dir"] ? node["data_dir"] : node, "sandbox.data_dir",
                     "'{}' is inside sandbox.output_dir '{}'; keep the two apart", out.data_dir,
                     out.output_dir);
  }
  if (auto value = node["export_max_rows"]) {
    ASSIGN_OR_RETURN(out.export_max_rows,
                     walk.count(value, "sandbox.export_max_rows", 1, 10'000'000'000ULL));
  }
  if (auto value = node["resources"]) {
    RETURN_IF_ERROR(parse_resources(walk, value, "sandbox.resources", out.resources));
  }
  if (auto value = node["exec_timeout"]) {
    ASSIGN_OR_RETURN(out.exec_timeout, walk.positive_duration(value, "sandbox.exec_timeout"));
  }
  if (auto value = node["idle_timeout"]) {
    ASSIGN_OR_RETURN(out.idle_timeout, walk.positive_duration(value, "sandbox.idle_timeout"));
  }
  if (auto value = node["network"]) {
    RETURN_IF_ERROR(parse_network(walk, value, "sandbox.network", out.network));
  }
  if (auto value = node["output_limit"]) {
    ASSIGN_OR_RETURN(out.output_limit_bytes, walk.size(value, "sandbox.output_limit"));
    if (out.output_limit_bytes < kKiB || out.output_limit_bytes > 256 * kMiB) {
      return walk.fail(value, "sandbox.output_limit", "must be between 1 KiB and 256 MiB");
    }
  }
  if (auto value = node["artifacts"]) {
    RETURN_IF_ERROR(parse_artifact_limits(walk, value, out.artifacts));
  }
  if (auto value = node["snapshots"]) {
    RETURN_IF_ERROR(parse_snapshots(walk, value, out.snapshots));
  }
  if (auto value = node["daytona"]) {
    RETURN_IF_ERROR(parse_daytona(walk, value, out.daytona));
  }
  if (out.provider == "daytona" && out.daytona.api_url.empty()) {
    return walk.fail(
        node["provider"], "sandbox.provider",
        "the daytona provider needs sandbox.daytona.api_url (the API's base, e.g. "
        "https://daytona.example.com/api, or another quarry's http://HOST:8080/daytona/api)");
  }
  if (auto value = node["local"]) {
    RETURN_IF_ERROR(
        walk.check_map(value, "sandbox.local", {"volume_size", "favordynmods", "disk_io"}));
    if (auto io = value["disk_io"]) {
      RETURN_IF_ERROR(walk.check_map(io, "sandbox.local.disk_io", {"read", "write", "iops"}));
      auto& limits = out.local.disk_io;
      if (auto read = io["read"]) {
        ASSIGN_OR_RETURN(limits.read_bytes, walk.size(read, "sandbox.local.disk_io.read"));
      }
      if (auto write = io["write"]) {
        ASSIGN_OR_RETURN(limits.write_bytes, walk.size(write, "sandbox.local.disk_io.write"));
      }
      if (auto iops = io["iops"]) {
        ASSIGN_OR_RETURN(limits.iops,
                         walk.count(iops, "sandbox.local.disk_io.iops", 0, 10'000'000));
      }
      // Below a few pages a second, starting Python alone would take minutes.
      for (auto [rate, key] :
           {std::pair{limits.read_bytes, "read"}, {limits.write_bytes, "write"}}) {
        if (rate != 0 && rate < kMiB) {
          return walk.fail(io[key], fmt::format("sandbox.local.disk_io.{}", key),
                           "must be 0 (no limit) or at least 1MiB (per second)");
        }
      }
      if (limits.iops != 0 && limits.iops < 100) {
        return walk.fail(io["iops"], "sandbox.local.disk_io.iops",
                         "must be 0 (no limit) or at least 100");
      }
    }
    if (auto flag = value["favordynmods"]) {
      ASSIGN_OR_RETURN(out.local.favordynmods, walk.boolean(flag, "sandbox.local.favordynmods"));
    }
    if (auto size = value["volume_size"]) {
      ASSIGN_OR_RETURN(out.local.volume_bytes, walk.size(size, "sandbox.local.volume_size"));
      if (out.local.volume_bytes < kGiB) {
        return walk.fail(size, "sandbox.local.volume_size", "must be at least 1 GiB");
      }
    }
  }
  return {};
}

Result<void> parse_database(const Walker& walk, const YAML::Node& node, DatabaseConfig& out) {
  RETURN_IF_ERROR(walk.check_map(
      node, "database",
      {"url", "port", "query_max_rows", "statement_timeout", "export_row_group_rows"}));
  if (node.IsNull()) return {};
  if (auto value = node["url"]) {
    ASSIGN_OR_RETURN(out.url, walk.scalar(value, "database.url"));
    if (out.url.find('\n') != std::string::npos || out.url.find('\0') != std::string::npos) {
      return walk.fail(value, "database.url", "must be one line");
    }
  }
  if (auto value = node["port"]) {
    ASSIGN_OR_RETURN(auto port, walk.count(value, "database.port", 1024, 65535));
    out.port = static_cast<uint16_t>(port);
  }
  if (auto value = node["query_max_rows"]) {
    ASSIGN_OR_RETURN(out.query_max_rows, walk.count(value, "database.query_max_rows", 1, 100000));
  }
  if (auto value = node["statement_timeout"]) {
    ASSIGN_OR_RETURN(out.statement_timeout,
                     walk.positive_duration(value, "database.statement_timeout"));
    // PostgreSQL keeps statement_timeout in an int of milliseconds: set_config refuses more
    // ("exceeds integer range"), and every query would fail.
    if (out.statement_timeout.count() > std::numeric_limits<int32_t>::max()) {
      return walk.fail(value, "database.statement_timeout",
                       "'{}' is longer than PostgreSQL allows (2147483647ms, about 24 days); "
                       "give 24d or less",
                       value.Scalar());
    }
  }
  if (auto value = node["export_row_group_rows"]) {
    ASSIGN_OR_RETURN(out.export_row_group_rows,
                     walk.count(value, "database.export_row_group_rows", 1024, 16'777'216));
  }
  return {};
}

Result<void> parse_conversations(const Walker& walk, const YAML::Node& node,
                                 ConversationsConfig& out) {
  RETURN_IF_ERROR(walk.check_map(node, "conversations",
                                 {"instance_id", "store", "url", "server_timeout", "context"}));
  if (node.IsNull()) return {};
  if (auto value = node["store"]) {
    ASSIGN_OR_RETURN(out.store, walk.scalar(value, "conversations.store"));
    if (out.store != "sqlite" && out.store != "postgres") {
      return walk.fail(value, "conversations.store",
                       "'{}' is not a history store (available: sqlite, postgres)", out.store);
    }
  }
  if (auto value = node["url"]) {
    ASSIGN_OR_RETURN(out.url, walk.scalar(value, "conversations.url"));
    // Never the value in a message: it may hold a password.
    if (out.url.find('\n') != std::string::npos || out.url.find('\0') != std::string::npos) {
      return walk.fail(value, "conversations.url", "must be one line");
    }
  }
  // postgres without a url: quarry's private PostgreSQL (cli/data/history.cc).
  if (out.store == "sqlite" && !out.url.empty()) {
    return walk.fail(node["url"], "conversations.url",
                     "only the postgres store reads it: set conversations.store: postgres, or "
                     "remove conversations.url to keep the history in <state>/history.db");
  }
  if (auto value = node["server_timeout"]) {
    ASSIGN_OR_RETURN(out.server_timeout,
                     walk.positive_duration(value, "conversations.server_timeout"));
    if (out.server_timeout < std::chrono::milliseconds(500)) {
      return walk.fail(value, "conversations.server_timeout",
                       "must be at least 500ms: shorter, a busy server would be taken for dead");
    }
  }
  if (auto value = node["instance_id"]) {
    ASSIGN_OR_RETURN(out.instance_id, walk.scalar(value, "conversations.instance_id"));
    const bool valid =
        !out.instance_id.empty() && out.instance_id.size() <= 63 &&
        std::all_of(out.instance_id.begin(), out.instance_id.end(), [](char c) {
          return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.';
        });
    if (!valid) {
      return walk.fail(value, "conversations.instance_id",
                       "'{}' must be 1 to 63 letters, digits, '-', '_' or '.'", out.instance_id);
    }
  }
  if (auto context = node["context"]) {
    RETURN_IF_ERROR(walk.check_map(context, "conversations.context",
                                   {"budget", "tool_output", "recent_turns"}));
    if (auto value = context["budget"]) {
      ASSIGN_OR_RETURN(out.context.budget_chars,
                       walk.count(value, "conversations.context.budget", 1000, 100'000'000));
    }
    if (auto value = context["tool_output"]) {
      ASSIGN_OR_RETURN(out.context.tool_output_chars,
                       walk.count(value, "conversations.context.tool_output", 100, 100'000'000));
    }
    if (auto value = context["recent_turns"]) {
      ASSIGN_OR_RETURN(auto turns,
                       walk.count(value, "conversations.context.recent_turns", 1, 1000));
      out.context.recent_turns = static_cast<uint32_t>(turns);
    }
  }
  return {};
}

Result<void> parse_model(const Walker& walk, const YAML::Node& node, ModelConfig& out) {
  RETURN_IF_ERROR(walk.check_map(node, "model",
                                 {"base_url", "name", "api_key_env", "timeout", "connect_timeout",
                                  "max_retries", "max_steps", "temperature", "ca_file"}));
  if (node.IsNull()) return {};
  if (auto value = node["base_url"]) {
    ASSIGN_OR_RETURN(out.base_url, walk.scalar(value, "model.base_url"));
    if (auto url = parse_url(out.base_url); !url) {
      return walk.fail(value, "model.base_url", "{}", url.error().message);
    }
  }
  if (auto value = node["name"]) {
    ASSIGN_OR_RETURN(out.name, walk.scalar(value, "model.name"));
    if (out.name.empty()) return walk.fail(value, "model.name", "must not be empty");
  }
  if (auto value = node["api_key_env"]) {
    ASSIGN_OR_RETURN(out.api_key_env, walk.scalar(value, "model.api_key_env"));
    if (!valid_variable_name(out.api_key_env)) {
      return walk.fail(value, "model.api_key_env",
                       "'{}' is not an environment variable name (letters, digits, '_'; \"\" "
                       "for a server that needs no key)",
                       out.api_key_env);
    }
  }
  if (auto value = node["timeout"]) {
    ASSIGN_OR_RETURN(out.timeout, walk.positive_duration(value, "model.timeout"));
  }
  if (auto value = node["connect_timeout"]) {
    ASSIGN_OR_RETURN(out.connect_timeout, walk.positive_duration(value, "model.connect_timeout"));
  }
  if (auto value = node["max_retries"]) {
    ASSIGN_OR_RETURN(auto retries, walk.count(value, "model.max_retries", 0, 10));
    out.max_retries = static_cast<uint32_t>(retries);
  }
  if (auto value = node["max_steps"]) {
    ASSIGN_OR_RETURN(auto steps, walk.count(value, "model.max_steps", 1, 1000));
    out.max_steps = static_cast<uint32_t>(steps);
  }
  if (auto value = node["temperature"]) {
    ASSIGN_OR_RETURN(auto temperature, walk.number(value, "model.temperature"));
    if (!(temperature >= 0 && temperature <= 2)) {
      return walk.fail(value, "model.temperature", "{} is out of range (allowed: 0 to 2)",
                       temperature);
    }
    out.temperature = temperature;
  }
  if (auto value = node["ca_file"]) {
    ASSIGN_OR_RETURN(out.ca_file, walk.host_path(value, "model.ca_file"));
  }
  return {};
}

Result<void> parse_server(const Walker& walk, const YAML::Node& node, ServerConfig& out) {
  RETURN_IF_ERROR(walk.check_map(node, "server",
                                 {"listen", "tokens_file", "max_body", "max_file_transfer",
                                  "shutdown_grace", "workers", "session_lifetime", "web_dir"}));
  if (node.IsNull()) return {};
  if (auto value = node["listen"]) {
    ASSIGN_OR_RETURN(out.listen, walk.scalar(value, "server.listen"));
    auto colon = out.listen.rfind(':');
    if (colon == std::string::npos || colon == 0 || colon + 1 == out.listen.size()) {
      return walk.fail(value, "server.listen",
                       "'{}' must be host:port, e.g. 127.0.0.1:8080 or [::1]:8080", out.listen);
    }
  }
  if (auto value = node["tokens_file"]) {
    ASSIGN_OR_RETURN(out.tokens_file, walk.host_path(value, "server.tokens_file"));
  }
  if (auto value = node["max_body"]) {
    ASSIGN_OR_RETURN(out.max_body, walk.size(value, "server.max_body"));
    if (out.max_body < kKiB || out.max_body > kGiB) {
      return walk.fail(value, "server.max_body", "must be between 1 KiB and 1 GiB");
    }
  }
  if (auto value = node["max_file_transfer"]) {
    ASSIGN_OR_RETURN(out.max_file_transfer, walk.size(value, "server.max_file_transfer"));
    if (out.max_file_transfer < kKiB || out.max_file_transfer > 16 * kGiB) {
      return walk.fail(value, "server.max_file_transfer", "must be between 1 KiB and 16 GiB");
    }
  }
  if (auto value = node["shutdown_grace"]) {
    ASSIGN_OR_RETURN(out.shutdown_grace, walk.duration(value, "server.shutdown_grace"));
  }
  if (auto value = node["workers"]) {
    ASSIGN_OR_RETURN(auto workers, walk.count(value, "server.workers", 1, 1024));
    out.workers = static_cast<uint32_t>(workers);
  }
  if (auto value = node["web_dir"]) {
    ASSIGN_OR_RETURN(out.web_dir, walk.host_path(value, "server.web_dir"));
  }
  if (auto value = node["session_lifetime"]) {
    ASSIGN_OR_RETURN(out.session_lifetime,
                     walk.positive_duration(value, "server.session_lifetime"));
  }
  return {};
}

Result<void> parse_capacity(const Walker& walk, const YAML::Node& node, CapacityConfig& out) {
  RETURN_IF_ERROR(walk.check_map(node, "capacity",
                                 {"max_sandboxes", "max_per_user", "max_queue", "queue_timeout",
                                  "warm_pool", "accounts", "overcommit"}));
  if (node.IsNull()) return {};
  for (auto [key, out_count, max] : {std::tuple{"max_sandboxes", &out.max_sandboxes, 10000u},
                                     std::tuple{"max_per_user", &out.max_per_user, 10000u},
                                     std::tuple{"max_queue", &out.max_queue, 100000u}}) {
    if (auto value = node[key]) {
      ASSIGN_OR_RETURN(auto count, walk.count(value, fmt::format("capacity.{}", key), 1, max));
      *out_count = static_cast<uint32_t>(count);
    }
  }
  if (auto value = node["queue_timeout"]) {
    ASSIGN_OR_RETURN(out.queue_timeout, walk.positive_duration(value, "capacity.queue_timeout"));
  }
  if (auto pool = node["warm_pool"]) {
    RETURN_IF_ERROR(walk.check_map(pool, "capacity.warm_pool", {"min_idle"}));
    if (auto value = pool["min_idle"]) {
      ASSIGN_OR_RETURN(auto count, walk.count(value, "capacity.warm_pool.min_idle", 0, 10000));
      out.warm_pool.min_idle = static_cast<uint32_t>(count);
    }
  }
  if (auto accounts = node["accounts"]) {
    if (!accounts.IsMap() || accounts.size() == 0) {
      return walk.fail(accounts, "capacity.accounts",
                       "must map each account's name to its limits, e.g. "
                       "'accounts: {{local: {{max_sandboxes: 8}}}}'");
    }
    RETURN_IF_ERROR(walk.check_names(accounts, "capacity.accounts"));
    for (const auto& entry : accounts) {
      ASSIGN_OR_RETURN(auto name, walk.scalar(entry.first, "capacity.accounts"));
      const std::string path = fmt::format("capacity.accounts.{}", name);
      RETURN_IF_ERROR(walk.check_map(entry.second, path, {"max_sandboxes"}));
      uint64_t max = out.max_sandboxes;
      if (auto value = entry.second["max_sandboxes"]) {
        ASSIGN_OR_RETURN(max, walk.count(value, path + ".max_sandboxes", 1, 10000));
      }
      out.accounts.emplace_back(name, static_cast<uint32_t>(max));
    }
  }
  if (auto overcommit = node["overcommit"]) {
    RETURN_IF_ERROR(walk.check_map(overcommit, "capacity.overcommit", {"memory", "cpu", "disk"}));
    for (auto [key, factor] : {std::pair{"memory", &out.overcommit.memory},
                               {"cpu", &out.overcommit.cpu},
                               {"disk", &out.overcommit.disk}}) {
      auto value = overcommit[key];
      if (!value) continue;
      const std::string path = fmt::format("capacity.overcommit.{}", key);
      ASSIGN_OR_RETURN(*factor, walk.number(value, path));
      if (!(*factor >= 0.1 && *factor <= 100)) {
        return walk.fail(value, path, "must be between 0.1 and 100 (1.0: no overcommit)");
      }
    }
  }
  return {};
}

// What one section cannot check alone.
Result<void> check_capacity(const Walker& walk, const YAML::Node& root, const Config& config) {
  const auto& capacity = config.capacity;
  if (capacity.warm_pool.min_idle >= capacity.max_sandboxes) {
    return walk.fail(root["capacity"]["warm_pool"]["min_idle"], "capacity.warm_pool.min_idle",
                     "must be less than capacity.max_sandboxes ({}), or no conversation could "
                     "ever have a sandbox of its own",
                     capacity.max_sandboxes);
  }
  if (config.sandbox.provider == "local" && capacity.accounts.size() > 1) {
    return walk.fail(root["capacity"]["accounts"], "capacity.accounts",
                     "the local provider has a single account; several accounts are for a "
                     "remote provider");
  }
  const auto& daytona_accounts = config.sandbox.daytona.accounts;
  if (config.sandbox.provider == "daytona" && !daytona_accounts.empty() &&
      !capacity.accounts.empty()) {
    return walk.fail(root["capacity"]["accounts"], "capacity.accounts",
                     "the Daytona accounts and their limits are sandbox.daytona.accounts (each "
                     "with max_sandboxes); remove capacity.accounts");
  }
  if (config.sandbox.provider == "daytona" && capacity.accounts.size() > 1) {
    return walk.fail(root["capacity"]["accounts"], "capacity.accounts",
                     "several Daytona accounts need keys of their own: list them under "
                     "sandbox.daytona.accounts with name, api_key_env and max_sandboxes");
  }
  return {};
}

Result<void> check_artifact_limits(const Walker& walk, const YAML::Node& root,
                                   const Config& config) {
  const uint64_t max_file = config.sandbox.artifacts.max_file_bytes;
  if (config.conversations.store == "postgres" && max_file > kMaxPostgresArtifactBytes) {
    return walk.fail(root["sandbox"]["artifacts"]["max_file"], "sandbox.artifacts.max_file",
                     "{} is more than a PostgreSQL history keeps of one artifact ({}, as "
                     "PostgreSQL takes at most 1 GB in one value); lower it, or use "
                     "conversations.store: sqlite",
                     format_size(max_file), format_size(kMaxPostgresArtifactBytes));
  }
  return {};
}

}  // namespace

bool valid_package_requirement(std::string_view spec) {
  if (spec.empty()) return false;
  for (char c : spec) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) ||
          std::string_view("-_.[]=<>!~,").find(c) != std::string_view::npos)) {
      return false;
    }
  }
  return std::isalnum(static_cast<unsigned char>(spec.front()));
}

Result<void> validate_resources(const ResourceLimits& resources) {
  if (!(resources.cpus >= 0.01 && resources.cpus <= 1024)) {
    return make_error(ErrorCode::kInvalidArgument, "cpus must be between 0.01 and 1024, not {}",
                      resources.cpus);
  }
  if (resources.memory_bytes < 16 * kMiB) {
    return make_error(ErrorCode::kInvalidArgument, "memory must be at least 16 MiB, not {}",
                      format_size(resources.memory_bytes));
  }
  if (resources.disk_bytes < 16 * kMiB) {
    return make_error(ErrorCode::kInvalidArgument, "disk must be at least 16 MiB, not {}",
                      format_size(resources.disk_bytes));
  }
  if (resources.pids < 8) {
    return make_error(ErrorCode::kInvalidArgument,
                      "pids must be at least 8 (the sandbox's own init needs some), not {}",
                      resources.pids);
  }
  return {};
}

namespace {

// The files a configuration names belong with it: a relative path is found from the file's
// directory. The lock is named after the file unless sandbox.lock names it.
void resolve_files(Config& config, std::string_view source) {
  const std::filesystem::path file(source);
  auto& lock = config.sandbox.lock_file;
  if (lock.empty()) {
    lock = file.parent_path() / file.stem().concat(".lock");
  } else if (lock.is_relative()) {
    lock = file.parent_path() / lock;
  }
  for (std::string* path : {&config.server.tokens_file, &config.server.web_dir,
                            &config.model.ca_file, &config.sandbox.daytona.ca_file}) {
    if (!path->empty() && std::filesystem::path(*path).is_relative()) {
      *path = (file.parent_path() / *path).string();
    }
  }
}

}  // namespace

Result<Config> parse_config(std::string_view yaml_text, std::string_view source) {
  Walker walk(source);
  ASSIGN_OR_RETURN(auto root, walk.load(yaml_text));
  Config config;
  config.source = std::string(source);
  if (root.IsNull()) {  // an empty file means all defaults
    resolve_files(config, source);
    return config;
  }
  try {
    RETURN_IF_ERROR(walk.check_map(
        root, "", {"sandbox", "capacity", "database", "conversations", "model", "server"}));
    if (auto sandbox = root["sandbox"])
      RETURN_IF_ERROR(parse_sandbox(walk, sandbox, config.sandbox));
    if (auto capacity = root["capacity"])
      RETURN_IF_ERROR(parse_capacity(walk, capacity, config.capacity));
    if (auto database = root["database"])
      RETURN_IF_ERROR(parse_database(walk, database, config.database));
    if (auto conversations = root["conversations"])
      RETURN_IF_ERROR(parse_conversations(walk, conversations, config.conversations));
    if (auto model = root["model"]) RETURN_IF_ERROR(parse_model(walk, model, config.model));
    if (auto server = root["server"]) RETURN_IF_ERROR(parse_server(walk, server, config.server));
    RETURN_IF_ERROR(check_capacity(walk, root, config));
    RETURN_IF_ERROR(check_artifact_limits(walk, root, config));
  } catch (const YAML::Exception& error) {
    return make_error(ErrorCode::kInvalidArgument, "{}:{}: {}", source, error.mark.line + 1,
                      error.msg);
  }
  resolve_files(config, source);
  return config;
}

Result<Config> load_config(const std::optional<std::filesystem::path>& explicit_path) {
  std::optional<std::filesystem::path> path = explicit_path;
  if (!path) {
    if (const char* env = std::getenv("QUARRY_CONFIG"); env && *env) path = env;
  }
  if (!path) {
    // Not exists(), which follows a link: a ./config.yml whose target is gone is a
    // configuration the user meant, not none.
    std::error_code ignored;
    if (std::filesystem::symlink_status("config.yml", ignored).type() !=
        std::filesystem::file_type::not_found) {
      path = "config.yml";
    }
  }
  if (!path) return Config{};
  std::error_code error;
  if (std::filesystem::is_symlink(std::filesystem::symlink_status(*path, error)) &&
      !std::filesystem::exists(*path, error)) {
    auto target = std::filesystem::read_symlink(*path, error);
    return make_error(ErrorCode::kNotFound,
                      "reading the configuration: {}: a link to '{}', which does not exist",
                      path->string(), target.string());
  }
  auto text = read_file(*path);
  if (!text) return std::unexpected(text.error().with_context("reading the configuration"));
  return parse_config(*text, path->string());
}

}  // namespace quarry

#include "config/config.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <fstream>
#include <functional>

#include "conversation/conversation_manager.h"

namespace quarry {
namespace {

TEST(Config, EmptyTextGivesDefaults) {
  auto config = parse_config("", "config.yml");
  ASSERT_TRUE(config) << config.error().message;
  EXPECT_EQ(config->sandbox.provider, "local");
  EXPECT_EQ(config->sandbox.data_dir, "/home/sandbox/data");
  EXPECT_EQ(config->sandbox.output_dir, "/home/sandbox/outputs");
  EXPECT_EQ(config->sandbox.export_max_rows, 100000u);
  EXPECT_EQ(config->sandbox.resources.memory_bytes, kGiB);
  EXPECT_EQ(config->sandbox.resources.disk_bytes, 2 * kGiB);
  EXPECT_EQ(config->sandbox.resources.pids, 256u);
  EXPECT_DOUBLE_EQ(config->sandbox.resources.cpus, 1.0);
  EXPECT_EQ(config->sandbox.exec_timeout, std::chrono::seconds(120));
  EXPECT_EQ(config->sandbox.idle_timeout, std::chrono::minutes(15));
  EXPECT_EQ(config->sandbox.network.mode, NetworkMode::kNone);
  EXPECT_EQ(config->sandbox.packages.size(), 7u);
  EXPECT_EQ(config->sandbox.snapshots.keep_unused, std::chrono::days(7));
  EXPECT_FALSE(config->sandbox.snapshots.keep_unused_named) << "named snapshots are kept";
  EXPECT_EQ(config->database.url, "");
  EXPECT_EQ(config->database.port, 55432);
  EXPECT_EQ(config->database.query_max_rows, 200u);
  EXPECT_EQ(config->database.statement_timeout, std::chrono::seconds(30));
  EXPECT_EQ(config->database.export_row_group_rows, 131072u);
}

// The README's configuration block lists every key with its default: it must be a config
// quarry accepts, and mean what no config means.
TEST(Config, TheReadmesExampleIsAcceptedAndHoldsTheDefaults) {
  std::ifstream in(std::string(QUARRY_SOURCE_DIR) + "/README.md");
  std::string readme((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto section = readme.find("## Configuration");
  ASSERT_NE(section, std::string::npos);
  const auto start = readme.find("```yaml\n", section);
  ASSERT_NE(start, std::string::npos);
  const auto end = readme.find("```", start + 8);
  auto example = parse_config(readme.substr(start + 8, end - start - 8), "README.md");
  ASSERT_TRUE(example) << example.error().message;
  auto defaults = parse_config("", "config.yml");
  ASSERT_TRUE(defaults);
  EXPECT_EQ(example->sandbox.resources.memory_bytes, defaults->sandbox.resources.memory_bytes);
  EXPECT_EQ(example->sandbox.exec_timeout, defaults->sandbox.exec_timeout);
  EXPECT_EQ(example->sandbox.snapshots.keep_unused, defaults->sandbox.snapshots.keep_unused);
  EXPECT_EQ(example->sandbox.snapshots.keep_unused_named,
            defaults->sandbox.snapshots.keep_unused_named);
  EXPECT_EQ(example->sandbox.local.disk_io.read_bytes, defaults->sandbox.local.disk_io.read_bytes);
  EXPECT_EQ(example->sandbox.local.disk_io.write_bytes,
            defaults->sandbox.local.disk_io.write_bytes);
  EXPECT_EQ(example->sandbox.local.disk_io.iops, defaults->sandbox.local.disk_io.iops);
  const auto& daytona = example->sandbox.daytona;
  EXPECT_EQ(daytona.api_key_env, defaults->sandbox.daytona.api_key_env);
  EXPECT_EQ(daytona.auto_stop, defaults->sandbox.daytona.auto_stop);
  EXPECT_EQ(daytona.auto_delete, defaults->sandbox.daytona.auto_delete);
  EXPECT_EQ(daytona.create_timeout, defaults->sandbox.daytona.create_timeout);
  EXPECT_EQ(daytona.delete_timeout, defaults->sandbox.daytona.delete_timeout);
  EXPECT_EQ(daytona.request_timeout, defaults->sandbox.daytona.request_timeout);
  EXPECT_EQ(daytona.max_retries, defaults->sandbox.daytona.max_retries);
  EXPECT_EQ(example->capacity.overcommit.memory, defaults->capacity.overcommit.memory);
  EXPECT_EQ(example->capacity.overcommit.cpu, defaults->capacity.overcommit.cpu);
  EXPECT_EQ(example->capacity.overcommit.disk, defaults->capacity.overcommit.disk);
  EXPECT_EQ(example->capacity.max_sandboxes, defaults->capacity.max_sandboxes);
  EXPECT_EQ(example->capacity.max_per_user, defaults->capacity.max_per_user);
  EXPECT_EQ(example->capacity.max_queue, defaults->capacity.max_queue);
  EXPECT_EQ(example->capacity.queue_timeout, defaults->capacity.queue_timeout);
  EXPECT_EQ(example->capacity.warm_pool.min_idle, defaults->capacity.warm_pool.min_idle);
  EXPECT_EQ(example->database.port, defaults->database.port);
  EXPECT_EQ(example->model.base_url, defaults->model.base_url);
  EXPECT_EQ(example->server.listen, defaults->server.listen);
  EXPECT_EQ(example->server.workers, defaults->server.workers);
  EXPECT_EQ(example->server.max_file_transfer, defaults->server.max_file_transfer);
  EXPECT_EQ(example->server.session_lifetime, defaults->server.session_lifetime);
  EXPECT_EQ(example->server.web_dir, defaults->server.web_dir);
}

TEST(Config, ReadsTheDatabaseSection) {
  auto config = parse_config(R"(
database:
  url: postgresql://reader@db.internal:5432/analytics
  port: 6543
  query_max_rows: 50
  statement_timeout: 1m30s
  export_row_group_rows: 65536
)",
                             "config.yml");
  ASSERT_TRUE(config) << config.error().message;
  EXPECT_EQ(config->database.url, "postgresql://reader@db.internal:5432/analytics");
  EXPECT_EQ(config->database.port, 6543);
  EXPECT_EQ(config->database.query_max_rows, 50u);
  EXPECT_EQ(config->database.statement_timeout, std::chrono::seconds(90));
  EXPECT_EQ(config->database.export_row_group_rows, 65536u);
  EXPECT_EQ(parse_config("database:\n", "config.yml")->database.query_max_rows, 200u);
  // The longest PostgreSQL takes.
  auto longest = parse_config("database:\n  statement_timeout: 2147483647ms\n", "config.yml");
  ASSERT_TRUE(longest) << longest.error().message;
  EXPECT_EQ(longest->database.statement_timeout, std::chrono::milliseconds(2147483647));
}

TEST(Config, ReadsTheDesignExample) {
  auto config = parse_config(R"(
sandbox:
  provider: local
  packages: [pyarrow, polars, duckdb, pandas, matplotlib, plotly]
  data_dir: /home/sandbox/data
  output_dir: /home/sandbox/outputs
  export_max_rows: 5000
  resources: {cpus: 0.5, memory: 512MiB, disk: 4GiB, pids: 64}
  exec_timeout: 30s
  idle_timeout: 5m
  network: {mode: none}
)",
                             "config.yml");
  ASSERT_TRUE(config) << config.error().message;
  EXPECT_EQ(config->sandbox.packages.front(), "pyarrow");
  EXPECT_EQ(config->sandbox.export_max_rows, 5000u);
  EXPECT_DOUBLE_EQ(config->sandbox.resources.cpus, 0.5);
  EXPECT_EQ(config->sandbox.resources.memory_bytes, 512 * kMiB);
  EXPECT_EQ(config->sandbox.resources.disk_bytes, 4 * kGiB);
  EXPECT_EQ(config->sandbox.resources.pids, 64u);
  EXPECT_EQ(config->sandbox.exec_timeout, std::chrono::seconds(30));
  EXPECT_EQ(config->sandbox.idle_timeout, std::chrono::minutes(5));
}

// Every bad value is rejected with the file, the line and the key's path in the message.
TEST(Config, RejectsBadInputNamingTheKey) {
  struct Case {
    const char* name;
    const char* yaml;
    const char* expected;  // must appear in the message
  } cases[] = {
      {"unknown top-level key", "sandbx: {}\n", "config.yml:1: sandbx: unknown key"},
      {"unknown nested key", "sandbox:\n  resources:\n    memroy: 1GiB\n",
       "config.yml:3: sandbox.resources.memroy: unknown key (known keys here: cpus, memory, disk, "
       "pids)"},
      {"bad size", "sandbox:\n  resources: {memory: lots}\n",
       "sandbox.resources.memory: 'lots' is not a size"},
      {"bad unit", "sandbox:\n  resources: {disk: 2 parsecs}\n", "unknown size unit 'parsecs'"},
      {"too little memory", "sandbox:\n  resources: {memory: 1MiB}\n",
       "memory must be at least 16 MiB"},
      {"negative cpus", "sandbox:\n  resources: {cpus: -1}\n", "cpus must be between"},
      {"pids not a number", "sandbox:\n  resources: {pids: many}\n",
       "sandbox.resources.pids: 'many' is not a whole number"},
      {"bad provider", "sandbox:\n  provider: docker\n",
       "sandbox.provider: 'docker' is not an available provider"},
      {"daytona without its url", "sandbox:\n  provider: daytona\n",
       "sandbox.provider: the daytona provider needs sandbox.daytona.api_url"},
      {"daytona snapshot and image", "sandbox:\n  daytona: {snapshot: s, image: 'python:3.11'}\n",
       "sandbox.daytona.image: give a snapshot or an image, not both"},
      {"daytona url without scheme", "sandbox:\n  daytona: {api_url: 'daytona.example.com/api'}\n",
       "sandbox.daytona.api_url: 'daytona.example.com/api' is not a usable URL"},
      {"daytona label of quarry's", "sandbox:\n  daytona: {labels: {quarry.boot: x}}\n",
       "sandbox.daytona.labels: 'quarry.boot': labels starting with 'quarry.' are quarry's own"},
      {"daytona key variable", "sandbox:\n  daytona: {api_key_env: 'my key'}\n",
       "sandbox.daytona.api_key_env: 'my key' is not an environment variable name"},
      {"daytona accounts as a map", "sandbox:\n  daytona:\n    accounts: {a: {max_sandboxes: 2}}\n",
       "config.yml:3: sandbox.daytona.accounts: must list the accounts, e.g. 'accounts: [{name: "
       "team-a, api_key_env: DAYTONA_KEY_A, max_sandboxes: 8}]'"},
      {"daytona account without a key",
       "sandbox:\n  daytona:\n    accounts:\n      - {name: a, max_sandboxes: 2}\n",
       "config.yml:4: sandbox.daytona.accounts[0]: needs api_key_env"},
      {"daytona account named twice",
       "sandbox:\n  daytona:\n    accounts:\n      - {name: a, api_key_env: KEY_A}\n"
       "      - {name: a, api_key_env: KEY_B}\n",
       "config.yml:5: sandbox.daytona.accounts[1].name: account 'a' is listed twice"},
      {"daytona account's unknown key",
       "sandbox:\n  daytona:\n    accounts:\n      - {name: a, api_key_env: K, quota: 2}\n",
       "sandbox.daytona.accounts[0].quota: unknown key (known keys here: name, api_key_env, "
       "max_sandboxes)"},
      {"daytona account of no sandboxes",
       "sandbox:\n  daytona:\n    accounts:\n      - {name: a, api_key_env: K, max_sandboxes: 0}\n",
       "sandbox.daytona.accounts[0].max_sandboxes: 0 is out of range (allowed: 1 to 10000)"},
      {"daytona accounts and one key",
       "sandbox:\n  daytona:\n    api_key_env: K\n    accounts:\n      - {name: a, api_key_env: "
       "K}\n",
       "sandbox.daytona.api_key_env: each of sandbox.daytona.accounts names its own key's "
       "variable"},
      {"daytona accounts and capacity accounts",
       "sandbox:\n  provider: daytona\n  daytona:\n    api_url: http://127.0.0.1:1/api\n"
       "    accounts:\n      - {name: a, api_key_env: K}\ncapacity:\n  accounts: {a: "
       "{max_sandboxes: 2}}\n",
       "capacity.accounts: the Daytona accounts and their limits are sandbox.daytona.accounts"},
      {"several daytona accounts with one key",
       "sandbox:\n  provider: daytona\n  daytona: {api_url: 'http://127.0.0.1:1/api'}\n"
       "capacity:\n  accounts: {a: {max_sandboxes: 2}, b: {max_sandboxes: 2}}\n",
       "capacity.accounts: several Daytona accounts need keys of their own: list them under "
       "sandbox.daytona.accounts"},
      {"relative data dir", "sandbox:\n  data_dir: data\n",
       "sandbox.data_dir: 'data' must be an absolute path"},
      {"dotdot output dir", "sandbox:\n  output_dir: /home/../etc\n", "without '..'"},
      {"system dir", "sandbox:\n  data_dir: /proc/data\n", "inside the system directory /proc"},
      {"same dirs", "sandbox:\n  data_dir: /x\n  output_dir: /x\n",
       "must differ from sandbox.data_dir"},
      // /sbin and /lib64 are links in Debian's root: every start failed, blaming a snapshot.
      {"linked system dir", "sandbox:\n  data_dir: /sbin/data\n",
       "sandbox.data_dir: '/sbin/data' is inside the system directory /sbin"},
      {"lib64", "sandbox:\n  output_dir: /lib64/out\n", "inside the system directory /lib64"},
      // Handed to the sandbox's user and searched for artifacts whole.
      {"top-level dir", "sandbox:\n  output_dir: /var\n",
       "sandbox.output_dir: '/var' is a directory of the system's own; name one inside it or "
       "elsewhere, e.g. /home/sandbox/outputs"},
      {"outputs in data", "sandbox:\n  output_dir: /home/sandbox/data/out\n",
       "sandbox.output_dir: '/home/sandbox/data/out' is inside sandbox.data_dir "
       "'/home/sandbox/data'; keep the two apart"},
      {"data in outputs", "sandbox:\n  data_dir: /home/sandbox/outputs/data\n",
       "sandbox.data_dir: '/home/sandbox/outputs/data' is inside sandbox.output_dir "
       "'/home/sandbox/outputs'; keep the two apart"},
      {"outputs are home", "sandbox:\n  output_dir: /home/sandbox\n",
       "sandbox.data_dir: '/home/sandbox/data' is inside sandbox.output_dir '/home/sandbox'; "
       "keep the two apart"},
      {"disk io too slow", "sandbox:\n  local:\n    disk_io: {read: 4KiB}\n",
       "config.yml:3: sandbox.local.disk_io.read: must be 0 (no limit) or at least 1MiB"},
      {"disk io iops", "sandbox:\n  local:\n    disk_io: {iops: 10}\n",
       "sandbox.local.disk_io.iops: must be 0 (no limit) or at least 100"},
      {"disk io key", "sandbox:\n  local:\n    disk_io: {reads: 1GiB}\n",
       "sandbox.local.disk_io.reads: unknown key (known keys here: read, write, iops)"},
      {"overcommit zero", "capacity:\n  overcommit: {memory: 0}\n",
       "config.yml:2: capacity.overcommit.memory: must be between 0.1 and 100"},
      {"overcommit key", "capacity:\n  overcommit: {ram: 2}\n",
       "capacity.overcommit.ram: unknown key (known keys here: memory, cpu, disk)"},
      {"capacity key", "capacity:\n  sandboxes: 8\n",
       "capacity.sandboxes: unknown key (known keys here: max_sandboxes, max_per_user"},
      {"no sandboxes", "capacity:\n  max_sandboxes: 0\n",
       "capacity.max_sandboxes: 0 is out of range (allowed: 1 to 10000)"},
      {"pool as large as the limit", "capacity:\n  max_sandboxes: 2\n  warm_pool: {min_idle: 2}\n",
       "config.yml:3: capacity.warm_pool.min_idle: must be less than capacity.max_sandboxes (2)"},
      {"queue timeout zero", "capacity:\n  queue_timeout: 0s\n",
       "capacity.queue_timeout: must be longer than zero"},
      {"accounts as a list", "capacity:\n  accounts: [local]\n",
       "capacity.accounts: must map each account's name to its limits"},
      {"two local accounts",
       "capacity:\n  accounts: {a: {max_sandboxes: 2}, b: {max_sandboxes: 2}}\n",
       "capacity.accounts: the local provider has a single account"},
      {"zero timeout", "sandbox:\n  exec_timeout: 0s\n",
       "sandbox.exec_timeout: must be longer than zero"},
      {"bad duration", "sandbox:\n  idle_timeout: a while\n", "sandbox.idle_timeout:"},
      {"snapshots key", "sandbox:\n  snapshots: {keep: 1d}\n",
       "config.yml:2: sandbox.snapshots.keep: unknown key (known keys here: keep_unused, "
       "keep_unused_named)"},
      {"snapshots duration", "sandbox:\n  snapshots:\n    keep_unused: forever\n",
       "config.yml:3: sandbox.snapshots.keep_unused: 'forever' is not a duration"},
      {"snapshots negative", "sandbox:\n  snapshots: {keep_unused_named: -1d}\n",
       "sandbox.snapshots.keep_unused_named: '-1d' is not a duration: it must not be negative; "
       "or never, to keep them"},
      {"bad network mode", "sandbox:\n  network: {mode: open}\n",
       "'open' is not a network mode (use none or allowlist)"},
      {"allowlist without domains", "sandbox:\n  network: {mode: allowlist}\n",
       "needs at least one domain"},
      {"packages not a list", "sandbox:\n  packages: polars\n", "sandbox.packages: must be a list"},
      {"bad package", "sandbox:\n  packages: [polars, 'rm -rf /']\n",
       "sandbox.packages[1]: 'rm -rf /' is not a package requirement"},
      {"section not a map", "sandbox: 3\n", "sandbox: must be a mapping"},
      {"artifact too large for postgres",
       "sandbox:\n  artifacts: {max_file: 2GiB, max_step: 2GiB, max_conversation: 4GiB}\n"
       "conversations: {store: postgres, url: 'postgresql://db/history'}\n",
       "config.yml:2: sandbox.artifacts.max_file: 2 GiB is more than a PostgreSQL history keeps "
       "of one artifact (1000 MiB, as PostgreSQL takes at most 1 GB in one value); lower it, "
       "or use conversations.store: sqlite"},
      {"broken yaml", "sandbox:\n  resources: {cpus: 1\n", "config.yml:"},
      {"bad instance id", "conversations:\n  instance_id: 'a b'\n",
       "conversations.instance_id: 'a b' must be 1 to 63 letters"},
      {"unknown context key", "conversations:\n  context: {budjet: 5}\n",
       "conversations.context.budjet: unknown key (known keys here: budget, tool_output, "
       "recent_turns)"},
      {"tiny budget", "conversations:\n  context: {budget: 10}\n",
       "conversations.context.budget: 10 is out of range"},
      {"row cap zero", "sandbox:\n  export_max_rows: 0\n",
       "sandbox.export_max_rows: 0 is out of range"},
      {"unknown database key", "database:\n  host: x\n",
       "config.yml:2: database.host: unknown key (known keys here: url, port, query_max_rows, "
       "statement_timeout, export_row_group_rows)"},
      {"database not a map", "database: postgres\n", "database: must be a mapping"},
      {"privileged port", "database:\n  port: 80\n",
       "database.port: 80 is out of range (allowed: 1024 to 65535)"},
      {"port not a number", "database:\n  port: high\n",
       "database.port: 'high' is not a whole number"},
      {"query cap zero", "database:\n  query_max_rows: 0\n",
       "database.query_max_rows: 0 is out of range"},
      {"zero statement timeout", "database:\n  statement_timeout: 0s\n",
       "database.statement_timeout: must be longer than zero"},
      // PostgreSQL's statement_timeout is an int of milliseconds: set_config refused a longer
      // one in every query.
      {"statement timeout past PostgreSQL's", "database:\n  statement_timeout: 25d\n",
       "config.yml:2: database.statement_timeout: '25d' is longer than PostgreSQL allows "
       "(2147483647ms, about 24 days); give 24d or less"},
      {"url a list", "database:\n  url: [a, b]\n", "database.url: must be a single value"},
      {"empty value", "sandbox:\n  exec_timeout:\n",
       "sandbox.exec_timeout: is empty: give it a value, or remove it"},
      // Named on its key's line, where yaml-cpp marks an empty value on the next token's.
      {"empty value before another key", "sandbox:\n  exec_timeout:\n  idle_timeout: 5m\n",
       "config.yml:2: sandbox.exec_timeout: is empty: give it a value, or remove it"},
      {"empty value before another section", "sandbox:\n  exec_timeout:\n\n\nmodel: {}\n",
       "config.yml:2: sandbox.exec_timeout: is empty: give it a value, or remove it"},
      {"null value", "sandbox:\n  exec_timeout: ~\n",
       "config.yml:2: sandbox.exec_timeout: is empty: give it a value, or remove it"},
      {"empty list entry", "sandbox:\n  packages: [polars, ~]\n",
       "config.yml:2: sandbox.packages[1]: is empty: give it a value, or remove it"},
      {"unknown history store", "conversations:\n  store: mysql\n",
       "config.yml:2: conversations.store: 'mysql' is not a history store (available: sqlite, "
       "postgres)"},
      {"url of the sqlite store", "conversations:\n  url: postgresql://db/history\n",
       "conversations.url: only the postgres store reads it: set conversations.store: postgres"},
      {"history url on two lines", "conversations:\n  store: postgres\n  url: \"a\\nb\"\n",
       "conversations.url: must be one line"},
      {"tiny row groups", "database:\n  export_row_group_rows: 10\n",
       "database.export_row_group_rows: 10 is out of range"},
      {"unknown model key", "model:\n  modle: x\n",
       "config.yml:2: model.modle: unknown key (known keys here: base_url, name, api_key_env, "
       "timeout, connect_timeout, max_retries, max_steps, temperature, ca_file)"},
      {"model not a map", "model: gpt-4o\n", "model: must be a mapping"},
      {"base url without scheme", "model:\n  base_url: localhost:8080/v1\n",
       "config.yml:2: model.base_url: 'localhost:8080/v1' is not a usable URL: it must start with "
       "http:// or https://"},
      {"base url with credentials", "model:\n  base_url: https://me:secret@api.example/v1\n",
       "model.base_url: 'https://***@api.example/v1' is not a usable URL: it carries "
       "credentials"},
      {"daytona url with credentials",
       "sandbox:\n  daytona: {api_url: 'https://me:secret@daytona.example/api'}\n",
       "sandbox.daytona.api_url: 'https://***@daytona.example/api' is not a usable URL: it "
       "carries credentials"},
      {"base url bad port", "model:\n  base_url: http://localhost:99999\n",
       "'99999' is not a port"},
      {"empty model name", "model:\n  name: ''\n", "model.name: must not be empty"},
      {"bad key variable", "model:\n  api_key_env: $OPENAI_API_KEY\n",
       "model.api_key_env: '$OPENAI_API_KEY' is not an environment variable name"},
      {"zero model timeout", "model:\n  timeout: 0s\n", "model.timeout: must be longer than zero"},
      {"too many retries", "model:\n  max_retries: 50\n",
       "model.max_retries: 50 is out of range (allowed: 0 to 10)"},
      {"zero steps", "model:\n  max_steps: 0\n", "model.max_steps: 0 is out of range"},
      {"hot temperature", "model:\n  temperature: 3\n",
       "model.temperature: 3 is out of range (allowed: 0 to 2)"},
      // Found by fuzz/config_fuzzer: a key that is not a name threw YAML::BadConversion out of
      // parse_config (quarry ended with "terminate called ...").
      {"list as a top-level key", "? [sandbox]\n: {}\n",
       "config.yml:1: top level: has a key that is not a name (known keys here: sandbox, "
       "capacity, database"},
      {"map as a nested key", "conversations:\n  instance_id: local\n? {context: 1}\n: x\n",
       "config.yml:3: top level: has a key that is not a name"},
      {"list as a section key", "sandbox:\n  [resources]: {cpus: 1}\n",
       "config.yml:2: sandbox: has a key that is not a name (known keys here: provider"},
      {"file a list", "- sandbox\n- server\n",
       "config.yml:1: the file must be a mapping of sections (sandbox:, capacity:, database:, "
       "conversations:, model:, server:)"},
      {"file a single value", "sandbox\n",
       "config.yml:1: the file must be a mapping of sections (sandbox:, capacity:"},
      // yaml-cpp keeps the first of two equal keys: the second was never read, not even checked.
      {"section set twice",
       "sandbox:\n  exec_timeout: 10s\nserver:\n  listen: 127.0.0.1:8081\nsandbox:\n  "
       "exec_timeout: not-a-duration\n",
       "config.yml:5: sandbox: set twice (first on line 1); keep one"},
      {"key set twice", "sandbox:\n  exec_timeout: 10s\n  idle_timeout: 5m\n  exec_timeout: 20s\n",
       "config.yml:4: sandbox.exec_timeout: set twice (first on line 2); keep one"},
      {"key set twice in braces", "sandbox:\n  resources: {cpus: 1, cpus: 2}\n",
       "config.yml:2: sandbox.resources.cpus: set twice (first on line 2); keep one"},
      // So for names of the user's: one of the two was taken silently.
      {"label set twice", "sandbox:\n  daytona:\n    labels:\n      team: a\n      team: b\n",
       "config.yml:5: sandbox.daytona.labels.team: set twice (first on line 4); keep one"},
      {"account set twice",
       "capacity:\n  accounts: {a: {max_sandboxes: 3}, a: {max_sandboxes: 4}}\n",
       "config.yml:2: capacity.accounts.a: set twice (first on line 2); keep one"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    auto config = parse_config(c.yaml, "config.yml");
    ASSERT_FALSE(config);
    EXPECT_EQ(config.error().code, ErrorCode::kInvalidArgument);
    EXPECT_NE(config.error().message.find(c.expected), std::string::npos)
        << "message was: " << config.error().message;
  }
}

// An unquoted *.example.org is a YAML alias, and yaml-cpp's words for it ("the referenced
// anchor is not defined") do not tell a user to quote it.
TEST(Config, HintsToQuoteAValueStartingWithAStar) {
  const std::string hint = "(a value starting with * must be quoted, e.g. \"*.example.com\")";
  for (const char* yaml :
       {"sandbox:\n  network:\n    mode: allowlist\n    allow: [pypi.org, *.example.org]\n",
        "sandbox:\n  network:\n    mode: allowlist\n    allow:\n      - *.example.org\n",
        "sandbox:\n  image: *python\n"}) {
    SCOPED_TRACE(yaml);
    auto config = parse_config(yaml, "config.yml");
    ASSERT_FALSE(config);
    EXPECT_NE(
        config.error().message.find("not valid YAML: the referenced anchor is not defined " + hint),
        std::string::npos)
        << "message was: " << config.error().message;
  }
  auto other = parse_config("sandbox:\n  resources: {cpus: 1\n", "config.yml");
  ASSERT_FALSE(other);
  EXPECT_EQ(other.error().message.find("must be quoted"), std::string::npos)
      << "message was: " << other.error().message;
  auto quoted = parse_config(
      "sandbox:\n  network:\n    mode: allowlist\n    allow: ['*.example.org']\n", "config.yml");
  ASSERT_TRUE(quoted) << quoted.error().message;
}

TEST(Config, ReadsWhereTheHistoryLives) {
  auto defaults = parse_config("", "config.yml");
  ASSERT_TRUE(defaults) << defaults.error().message;
  EXPECT_EQ(defaults->conversations.store, "sqlite");
  EXPECT_EQ(defaults->conversations.url, "");
  auto config = parse_config(
      "conversations:\n  store: postgres\n  url: postgresql://quarry@db.internal/history\n",
      "config.yml");
  ASSERT_TRUE(config) << config.error().message;
  EXPECT_EQ(config->conversations.store, "postgres");
  EXPECT_EQ(config->conversations.url, "postgresql://quarry@db.internal/history");
  // Without a url: quarry's private PostgreSQL, found when the history is opened.
  auto local = parse_config("conversations:\n  store: postgres\n", "config.yml");
  ASSERT_TRUE(local) << local.error().message;
  EXPECT_EQ(local->conversations.url, "");
}

TEST(Config, ReadsHowLongSnapshotsAreKept) {
  auto config = parse_config(
      "sandbox:\n  snapshots:\n    keep_unused: never\n    keep_unused_named: 30d\n", "config.yml");
  ASSERT_TRUE(config) << config.error().message;
  EXPECT_FALSE(config->sandbox.snapshots.keep_unused);
  EXPECT_EQ(config->sandbox.snapshots.keep_unused_named, std::chrono::days(30));
  config = parse_config("sandbox:\n  snapshots: {keep_unused: 0s}\n", "config.yml");
  ASSERT_TRUE(config) << config.error().message;
  EXPECT_EQ(config->sandbox.snapshots.keep_unused, std::chrono::seconds(0));
}

TEST(Config, ReadsTheDaytonaSection) {
  auto config = parse_config(R"(sandbox:
  provider: daytona
  daytona:
    api_url: http://127.0.0.1:8080/daytona/api
    api_key_env: QUARRY_DAYTONA_KEY
    target: eu
    image: python:3.11-slim
    auto_stop: 1h
    auto_delete: never
    labels: {team: data}
    create_timeout: 90s
    max_retries: 2
)",
                             "config.yml");
  ASSERT_TRUE(config) << config.error().message;
  const auto& daytona = config->sandbox.daytona;
  EXPECT_EQ(config->sandbox.provider, "daytona");
  EXPECT_EQ(daytona.api_url, "http://127.0.0.1:8080/daytona/api");
  EXPECT_EQ(daytona.api_key_env, "QUARRY_DAYTONA_KEY");
  EXPECT_EQ(daytona.target, "eu");
  EXPECT_EQ(daytona.image, "python:3.11-slim");
  EXPECT_EQ(daytona.auto_stop, std::chrono::hours(1));
  EXPECT_FALSE(daytona.auto_delete);
  EXPECT_EQ(daytona.labels.at("team"), "data");
  EXPECT_EQ(daytona.create_timeout, std::chrono::seconds(90));
  EXPECT_EQ(daytona.max_retries, 2u);
  EXPECT_TRUE(daytona.accounts.empty());
  // Several accounts, each with its key's variable and its quota (none: the total's).
  auto accounts = parse_config(R"(sandbox:
  provider: daytona
  daytona:
    api_url: http://127.0.0.1:8080/daytona/api
    accounts:
      - {name: team-a, api_key_env: KEY_A, max_sandboxes: 8}
      - {name: team-b, api_key_env: KEY_B}
capacity:
  max_sandboxes: 12
)",
                               "config.yml");
  ASSERT_TRUE(accounts) << accounts.error().message;
  ASSERT_EQ(accounts->sandbox.daytona.accounts.size(), 2u);
  EXPECT_EQ(accounts->sandbox.daytona.accounts[0].name, "team-a");
  EXPECT_EQ(accounts->sandbox.daytona.accounts[0].api_key_env, "KEY_A");
  EXPECT_EQ(accounts->sandbox.daytona.accounts[0].max_sandboxes, 8u);
  EXPECT_EQ(accounts->sandbox.daytona.accounts[1].max_sandboxes, 0u);
  // The scheduler's accounts: those, the one without a quota limited by the total only.
  const auto options = conversation::manager_options(*accounts);
  EXPECT_EQ(options.accounts,
            (std::vector<std::pair<std::string, int>>{{"team-a", 8}, {"team-b", 12}}));
  // Defaults: a stopped sandbox is deleted at once, the key is in $DAYTONA_API_KEY.
  auto defaults = parse_config("", "config.yml");
  EXPECT_EQ(defaults->sandbox.daytona.api_key_env, "DAYTONA_API_KEY");
  EXPECT_EQ(defaults->sandbox.daytona.auto_delete, std::chrono::minutes(0));
}

TEST(Config, ReadsConversationSettings) {
  auto config = parse_config(
      "conversations:\n  instance_id: prod-1\n  context: {budget: 50000, tool_output: 4000, "
      "recent_turns: 3}\n",
      "config.yml");
  ASSERT_TRUE(config) << config.error().message;
  EXPECT_EQ(config->conversations.instance_id, "prod-1");
  EXPECT_EQ(config->conversations.context.budget_chars, 50000u);
  EXPECT_EQ(config->conversations.context.tool_output_chars, 4000u);
  EXPECT_EQ(config->conversations.context.recent_turns, 3u);
  auto defaults = parse_config("", "config.yml");
  EXPECT_EQ(defaults->conversations.instance_id, "local");
}

// A tokens file is found as the lock is, from the configuration's directory, whatever the
// directory quarry starts in; '~' is refused, as a shell would not expand it there.
TEST(Config, FindsTheTokensFileFromTheConfigurationsDirectory) {
  auto relative = parse_config("server:\n  tokens_file: tokens.json\n", "/etc/quarry/config.yml");
  ASSERT_TRUE(relative) << relative.error().message;
  EXPECT_EQ(relative->server.tokens_file, "/etc/quarry/tokens.json");
  auto absolute = parse_config("server:\n  tokens_file: /srv/t.json\n", "/etc/quarry/config.yml");
  ASSERT_TRUE(absolute) << absolute.error().message;
  EXPECT_EQ(absolute->server.tokens_file, "/srv/t.json");
  auto unset = parse_config("", "/etc/quarry/config.yml");
  ASSERT_TRUE(unset) << unset.error().message;
  EXPECT_EQ(unset->server.tokens_file, "");
  auto home = parse_config("server:\n  tokens_file: ~/tokens.json\n", "/etc/quarry/config.yml");
  ASSERT_FALSE(home);
  EXPECT_EQ(home.error().message,
            "/etc/quarry/config.yml:2: server.tokens_file: '~/tokens.json': quarry does not "
            "expand '~'; write the whole path, or one relative to this file's directory");
}

// Every other host path is found the same way: a CA file beside the configuration worked only
// when quarry was started in its directory.
TEST(Config, FindsEveryFileItNamesFromTheConfigurationsDirectory) {
  struct Case {
    std::string section, key;
    std::function<std::string(const Config&)> value;
  };
  const std::vector<Case> cases = {
      {"model", "ca_file", [](const Config& c) { return c.model.ca_file; }},
      {"sandbox:\n  daytona", "ca_file", [](const Config& c) { return c.sandbox.daytona.ca_file; }},
      {"server", "web_dir", [](const Config& c) { return c.server.web_dir; }},
      {"sandbox", "lock", [](const Config& c) { return c.sandbox.lock_file.string(); }}};
  for (const auto& [section, key, value] : cases) {
    SCOPED_TRACE(key);
    const std::string indent = section.find('\n') == std::string::npos ? "  " : "    ";
    auto relative =
        parse_config(fmt::format("{}:\n{}{}: here/it\n", section, indent, key), "/etc/q/c.yml");
    ASSERT_TRUE(relative) << relative.error().message;
    EXPECT_EQ(value(*relative), "/etc/q/here/it");
    auto absolute =
        parse_config(fmt::format("{}:\n{}{}: /srv/it\n", section, indent, key), "/etc/q/c.yml");
    ASSERT_TRUE(absolute) << absolute.error().message;
    EXPECT_EQ(value(*absolute), "/srv/it");
    auto home =
        parse_config(fmt::format("{}:\n{}{}: ~/it\n", section, indent, key), "/etc/q/c.yml");
    ASSERT_FALSE(home);
    EXPECT_NE(home.error().message.find("'~/it': quarry does not expand '~'"), std::string::npos)
        << home.error().message;
  }
}

TEST(Config, ReadsTheModelSection) {
  auto defaults = parse_config("", "config.yml");
  ASSERT_TRUE(defaults) << defaults.error().message;
  EXPECT_EQ(defaults->model.base_url, "https://api.openai.com/v1");
  EXPECT_EQ(defaults->model.name, "gpt-4o");
  EXPECT_EQ(defaults->model.api_key_env, "OPENAI_API_KEY");
  EXPECT_EQ(defaults->model.timeout, std::chrono::minutes(5));
  EXPECT_EQ(defaults->model.connect_timeout, std::chrono::seconds(10));
  EXPECT_EQ(defaults->model.max_retries, 3u);
  EXPECT_EQ(defaults->model.max_steps, 12u);
  EXPECT_FALSE(defaults->model.temperature);
  EXPECT_EQ(defaults->model.ca_file, "");

  auto config = parse_config(R"(
model:
  base_url: http://127.0.0.1:8080/v1/
  name: qwen2.5-coder
  api_key_env: ""
  timeout: 90s
  connect_timeout: 2s
  max_retries: 0
  max_steps: 30
  temperature: 0.2
  ca_file: /etc/quarry/gateway-ca.pem
)",
                             "config.yml");
  ASSERT_TRUE(config) << config.error().message;
  EXPECT_EQ(config->model.base_url, "http://127.0.0.1:8080/v1/");
  EXPECT_EQ(config->model.name, "qwen2.5-coder");
  EXPECT_EQ(config->model.api_key_env, "");
  EXPECT_EQ(config->model.timeout, std::chrono::seconds(90));
  EXPECT_EQ(config->model.connect_timeout, std::chrono::seconds(2));
  EXPECT_EQ(config->model.max_retries, 0u);
  EXPECT_EQ(config->model.max_steps, 30u);
  ASSERT_TRUE(config->model.temperature);
  EXPECT_DOUBLE_EQ(*config->model.temperature, 0.2);
  EXPECT_EQ(config->model.ca_file, "/etc/quarry/gateway-ca.pem");
}

TEST(Config, LoadPrefersTheExplicitFileThenTheEnvironment) {
  auto dir = std::filesystem::temp_directory_path() / "quarry-config-test";
  std::filesystem::create_directories(dir);
  auto explicit_file = dir / "explicit.yml";
  auto env_file = dir / "env.yml";
  std::ofstream(explicit_file) << "sandbox:\n  export_max_rows: 11\n";
  std::ofstream(env_file) << "sandbox:\n  export_max_rows: 22\n";
  ::setenv("QUARRY_CONFIG", env_file.c_str(), 1);
  EXPECT_EQ(load_config(explicit_file)->sandbox.export_max_rows, 11u);
  EXPECT_EQ(load_config(std::nullopt)->sandbox.export_max_rows, 22u);
  EXPECT_EQ(load_config(std::nullopt)->source, env_file.string());
  ::unsetenv("QUARRY_CONFIG");
  auto missing = load_config(dir / "missing.yml");
  ASSERT_FALSE(missing);
  EXPECT_NE(missing.error().message.find("missing.yml"), std::string::npos);
  std::filesystem::remove_all(dir);
}

// exists() follows a link: a ./config.yml pointing at a file that is gone meant the built-in
// defaults, without a word.
TEST(Config, LoadRefusesALinkToAMissingFile) {
  auto dir = std::filesystem::temp_directory_path() / "quarry-config-link-test";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::filesystem::create_symlink("gone.yml", dir / "config.yml");
  const auto cwd = std::filesystem::current_path();
  std::filesystem::current_path(dir);
  ::unsetenv("QUARRY_CONFIG");
  auto by_default = load_config(std::nullopt);
  std::filesystem::current_path(cwd);
  ASSERT_FALSE(by_default) << "a dangling ./config.yml gave the built-in defaults";
  EXPECT_NE(by_default.error().message.find("config.yml: a link to 'gone.yml', which does not "
                                            "exist"),
            std::string::npos)
      << by_default.error().message;
  auto named = load_config(dir / "config.yml");
  ASSERT_FALSE(named);
  EXPECT_NE(named.error().message.find("gone.yml"), std::string::npos) << named.error().message;
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace quarry

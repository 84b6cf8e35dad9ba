// The quarry command line, run as a separate process the way users and scripts run it.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "child_process.h"
#include "common/file_util.h"
#include "common/unique_fd.h"
#include "conversation/conversation_manager.h"
#include "conversation/sqlite_history_store.h"
#include "sandbox_environment.h"
#include "silent_server.h"

extern char** environ;

namespace quarry::testing {
namespace {

struct CliResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

// Runs quarry with `args` as they are.
CliResult run_quarry(std::vector<std::string> args) {
  args.insert(args.begin(), SandboxEnvironment::get().quarry_binary().string());
  int out_pipe[2], err_pipe[2];
  EXPECT_EQ(::pipe2(out_pipe, O_CLOEXEC), 0);
  EXPECT_EQ(::pipe2(err_pipe, O_CLOEXEC), 0);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out_pipe[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, err_pipe[1], STDERR_FILENO);
  std::vector<char*> argv;
  for (auto& arg : args)
    argv.push_back(arg.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  EXPECT_EQ(::posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ), 0);
  posix_spawn_file_actions_destroy(&actions);
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);
  UniqueFd out_fd(out_pipe[0]), err_fd(err_pipe[0]);
  CliResult result;
  pollfd polls[2] = {{out_fd.get(), POLLIN, 0}, {err_fd.get(), POLLIN, 0}};
  std::string* sinks[2] = {&result.out, &result.err};
  int open = 2;
  char buffer[4096];
  while (open > 0) {
    ::poll(polls, 2, -1);
    for (int i = 0; i < 2; ++i) {
      if (polls[i].fd < 0 || polls[i].revents == 0) continue;
      ssize_t n = ::read(polls[i].fd, buffer, sizeof buffer);
      if (n <= 0) {
        polls[i].fd = -1;
        --open;
      } else {
        sinks[i]->append(buffer, static_cast<size_t>(n));
      }
    }
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return result;
}

// Runs quarry with the tests' state directory and `args`.
CliResult quarry(std::vector<std::string> args) {
  args.insert(args.begin(), {"--state-dir", SandboxEnvironment::get().state_dir().string()});
  return run_quarry(std::move(args));
}

std::string trimmed(std::string text) {
  while (!text.empty() && text.back() == '\n')
    text.pop_back();
  return text;
}

// Creates a sandbox through the CLI and removes it at the end of the test.
class CliSandbox {
 public:
  explicit CliSandbox(std::vector<std::string> options = {}) {
    options.insert(options.begin(), {"sandbox", "create"});
    auto created = quarry(options);
    EXPECT_EQ(created.exit_code, 0) << created.err;
    id_ = trimmed(created.out);
  }
  ~CliSandbox() { quarry({"sandbox", "rm", id_}); }
  const std::string& id() const { return id_; }

 private:
  std::string id_;
};

TEST(Cli, CreatePrintsOnlyTheIdAndLsShowsIt) {
  CliSandbox sandbox({"--label", "purpose=cli-test", "--memory", "512MiB", "--cpus", "0.5",
                      "--pids", "100", "--disk", "1GiB"});
  EXPECT_EQ(sandbox.id().size(), 12u);
  auto listed = quarry({"sandbox", "ls", "--label", "purpose=cli-test", "--json"});
  ASSERT_EQ(listed.exit_code, 0) << listed.err;
  auto json = nlohmann::json::parse(listed.out);
  ASSERT_EQ(json.size(), 1u);
  EXPECT_EQ(json[0]["id"], sandbox.id());
  EXPECT_EQ(json[0]["state"], "running");
  EXPECT_EQ(json[0]["memory_bytes"], 512u << 20);
  EXPECT_EQ(json[0]["cpus"], 0.5);
  EXPECT_EQ(json[0]["pids"], 100);
  EXPECT_EQ(json[0]["disk_bytes"], 1u << 30);
  EXPECT_EQ(json[0]["labels"]["purpose"], "cli-test");
  auto table = quarry({"sandbox", "ls"});
  EXPECT_NE(table.out.find(sandbox.id()), std::string::npos);
  EXPECT_NE(table.out.find("purpose=cli-test"), std::string::npos);
}

TEST(Cli, ExecPassesOutputAndExitCodeThrough) {
  CliSandbox sandbox;
  auto result = quarry({"sandbox", "exec", sandbox.id(), "--", "sh", "-c",
                        "echo to-stdout; echo to-stderr >&2; exit 7"});
  EXPECT_EQ(result.exit_code, 7);
  EXPECT_EQ(result.out, "to-stdout\n");
  EXPECT_EQ(result.err, "to-stderr\n");
}

TEST(Cli, ExecJsonHasTheDocumentedShape) {
  CliSandbox sandbox;
  auto result = quarry({"sandbox", "exec", "--json", sandbox.id(), "--", "python3", "-c",
                        "import sys; print('hi'); sys.exit(3)"});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  auto json = nlohmann::json::parse(result.out);
  EXPECT_EQ(json["exit_code"], 3);
  EXPECT_TRUE(json["signal"].is_null());
  EXPECT_EQ(json["stdout"], "hi\n");
  EXPECT_EQ(json["stderr"], "");
  EXPECT_EQ(json["truncated"], false);
  EXPECT_GT(json["run_ms"].get<double>(), 0);
  EXPECT_GT(json["cpu_ms"].get<double>(), 0);
  EXPECT_GT(json["peak_memory_bytes"].get<uint64_t>(), 0u);
  EXPECT_EQ(json["memory_limit_bytes"], 1u << 30);
  EXPECT_GE(json["overhead_ms"].get<double>(), 0);
  EXPECT_EQ(json["oom"], false);
  EXPECT_EQ(json["timed_out"], false);
  EXPECT_TRUE(json["message"].is_null());
}

TEST(Cli, ExecTimeoutExitsWith124AndSaysSo) {
  CliSandbox sandbox;
  auto result = quarry({"sandbox", "exec", "--timeout", "1s", sandbox.id(), "--", "sleep", "30"});
  EXPECT_EQ(result.exit_code, 124);
  EXPECT_NE(result.err.find("Timed out: command ran longer than 1s"), std::string::npos)
      << result.err;
}

// A script can tell the command's exit status from quarry's own failure, as with docker run
// and timeout(1): the command's statuses pass through (127: not found, 126: not executable),
// and quarry exits 125 when it could not run the command at all, a command line it could not
// parse included. Other commands exit 1 when they fail and 2 for a command line they cannot
// parse.
TEST(Cli, ExecAndRunTellQuarrysFailureFromTheCommands) {
  CliSandbox sandbox;
  for (int status : {1, 2}) {
    auto exited =
        quarry({"sandbox", "exec", sandbox.id(), "--", "sh", "-c", fmt::format("exit {}", status)});
    EXPECT_EQ(exited.exit_code, status) << exited.err;
    EXPECT_EQ(exited.err, "");
  }
  auto not_found = quarry({"sandbox", "exec", sandbox.id(), "--", "no-such-command"});
  EXPECT_EQ(not_found.exit_code, 127) << not_found.err;
  auto not_executable = quarry({"sandbox", "exec", sandbox.id(), "--", "/etc/hostname"});
  EXPECT_EQ(not_executable.exit_code, 126) << not_executable.err;

  auto no_sandbox = quarry({"sandbox", "exec", "ffffffffffff", "--", "true"});
  EXPECT_EQ(no_sandbox.exit_code, 125);
  EXPECT_NE(no_sandbox.err.find("quarry: no sandbox 'ffffffffffff'"), std::string::npos)
      << no_sandbox.err;
  // An option misspelt before "--" is named (CLI11 named what followed "--").
  auto misspelt = quarry({"sandbox", "exec", "--timout", "1s", sandbox.id(), "--", "true"});
  EXPECT_EQ(misspelt.exit_code, 125);
  EXPECT_EQ(misspelt.err, "unknown option '--timout'\nRun with --help for more information.\n");
  auto not_a_number = quarry({"sandbox", "run", "--cpus", "abc", "--", "true"});
  EXPECT_EQ(not_a_number.exit_code, 125);
  EXPECT_NE(not_a_number.err.find("Could not convert: --cpus = abc"), std::string::npos)
      << not_a_number.err;
  auto too_much = quarry({"sandbox", "run", "--memory", "lots", "--", "true"});
  EXPECT_EQ(too_much.exit_code, 125);
  EXPECT_TRUE(too_much.err.starts_with("quarry: --memory: 'lots' is not a size")) << too_much.err;

  auto ls = quarry({"sandbox", "ls", "--jsn"});
  EXPECT_EQ(ls.exit_code, 2) << ls.err;
  EXPECT_EQ(ls.err, "unknown option '--jsn'\nRun with --help for more information.\n");
  auto create = quarry({"sandbox", "create", "--cpus", "abc"});
  EXPECT_EQ(create.exit_code, 2) << create.err;
}

TEST(Cli, RunCreatesExecutesAndDestroys) {
  auto result = quarry({"sandbox", "run", "--memory", "256MiB", "--label", "cli=run", "--",
                        "python3", "-c", "b = b'x' * (512 << 20)"});
  EXPECT_EQ(result.exit_code, 137);
  EXPECT_NE(result.err.find("Killed: command ran out of memory.\nPeak memory: "), std::string::npos)
      << result.err;
  EXPECT_NE(result.err.find("Sandbox limit: 256 MiB"), std::string::npos);
  auto left = quarry({"sandbox", "ls", "--label", "cli=run", "--json"});
  EXPECT_EQ(nlohmann::json::parse(left.out).size(), 0u);
}

TEST(Cli, CpCopiesBothWays) {
  CliSandbox sandbox;
  auto dir = SandboxEnvironment::get().state_dir();
  std::ofstream(dir / "in.csv") << "a,b\n1,2\n";
  auto in = quarry(
      {"sandbox", "cp", (dir / "in.csv").string(), sandbox.id() + ":/home/sandbox/data/in.csv"});
  ASSERT_EQ(in.exit_code, 0) << in.err;
  auto converted = quarry({"sandbox", "exec", sandbox.id(), "--", "sh", "-c",
                           "tr , ';' < data/in.csv > outputs/out.csv"});
  ASSERT_EQ(converted.exit_code, 0) << converted.err;
  auto out = quarry({"sandbox", "cp", sandbox.id() + ":/home/sandbox/outputs/out.csv",
                     (dir / "out.csv").string()});
  ASSERT_EQ(out.exit_code, 0) << out.err;
  std::ifstream copied(dir / "out.csv");
  std::string text((std::istreambuf_iterator<char>(copied)), {});
  EXPECT_EQ(text, "a;b\n1;2\n");

  auto neither = quarry({"sandbox", "cp", "a", "b"});
  EXPECT_EQ(neither.exit_code, 1);
  EXPECT_NE(neither.err.find("ID:/path"), std::string::npos);
  auto missing = quarry({"sandbox", "cp", sandbox.id() + ":/nope", (dir / "x").string()});
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_NE(missing.err.find("'/nope' does not exist"), std::string::npos) << missing.err;
  EXPECT_FALSE(std::filesystem::exists(dir / "x"));

  // A directory as the destination takes the file under its own name, as cp does.
  auto into_dir = quarry(
      {"sandbox", "cp", (dir / "in.csv").string(), sandbox.id() + ":/home/sandbox/outputs/"});
  ASSERT_EQ(into_dir.exit_code, 0) << into_dir.err;
  // So does a directory named without the trailing '/'.
  auto into_named_dir =
      quarry({"sandbox", "cp", (dir / "in.csv").string(), sandbox.id() + ":/home/sandbox/data"});
  ASSERT_EQ(into_named_dir.exit_code, 0) << into_named_dir.err;
  auto listed = quarry(
      {"sandbox", "exec", sandbox.id(), "--", "sh", "-c", "test -d data && cat data/in.csv"});
  EXPECT_EQ(listed.exit_code, 0) << listed.err;
  EXPECT_EQ(listed.out, "a,b\n1,2\n");
  std::filesystem::create_directory(dir / "copies");
  auto out_to_dir = quarry(
      {"sandbox", "cp", sandbox.id() + ":/home/sandbox/outputs/in.csv", (dir / "copies").string()});
  ASSERT_EQ(out_to_dir.exit_code, 0) << out_to_dir.err;
  std::ifstream round_trip(dir / "copies" / "in.csv");
  EXPECT_EQ(std::string((std::istreambuf_iterator<char>(round_trip)), {}), "a,b\n1,2\n");
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir / "copies"), {}), 1)
      << "nothing but the file is left in the directory";
  // A host directory as the source, or one that is not there, is said as such.
  auto source_dir = quarry({"sandbox", "cp", dir.string(), sandbox.id() + ":/home/sandbox/x"});
  EXPECT_EQ(source_dir.exit_code, 1);
  EXPECT_EQ(source_dir.err,
            fmt::format("quarry: '{}' is a directory; cp copies one file\n", dir.string()));
  auto no_dir = quarry({"sandbox", "cp", sandbox.id() + ":/home/sandbox/outputs/in.csv",
                        (dir / "none" / "in.csv").string()});
  EXPECT_EQ(no_dir.exit_code, 1);
  EXPECT_EQ(no_dir.err, fmt::format("quarry: cannot write '{}': No such file or directory\n",
                                    (dir / "none" / "in.csv").string()));
  std::filesystem::remove_all(dir / "copies");

  // Out to a link: written through it, as cp does, the link left as it was; to a device, into
  // it (run as root, a rename over /dev/null once left a plain file there).
  std::filesystem::remove(dir / "link.csv");
  std::filesystem::create_symlink(dir / "out.csv", dir / "link.csv");
  auto through = quarry({"sandbox", "cp", sandbox.id() + ":/home/sandbox/outputs/in.csv",
                         (dir / "link.csv").string()});
  ASSERT_EQ(through.exit_code, 0) << through.err;
  EXPECT_TRUE(std::filesystem::is_symlink(dir / "link.csv"));
  std::ifstream linked(dir / "out.csv");
  EXPECT_EQ(std::string((std::istreambuf_iterator<char>(linked)), {}), "a,b\n1,2\n");
  std::filesystem::remove(dir / "null");
  std::filesystem::create_symlink("/dev/null", dir / "null");
  auto discarded = quarry(
      {"sandbox", "cp", sandbox.id() + ":/home/sandbox/outputs/in.csv", (dir / "null").string()});
  EXPECT_EQ(discarded.exit_code, 0) << discarded.err;
  EXPECT_TRUE(std::filesystem::is_character_file("/dev/null"));
  std::filesystem::remove(dir / "link.csv");
  std::filesystem::remove(dir / "null");
}

TEST(Cli, RmRemovesAndNamesUnknownIds) {
  auto created = quarry({"sandbox", "create", "--label", "cli=rm"});
  const std::string id = trimmed(created.out);
  auto removed = quarry({"sandbox", "rm", id});
  EXPECT_EQ(removed.exit_code, 0) << removed.err;
  EXPECT_EQ(removed.out, id + "\n");
  auto again = quarry({"sandbox", "rm", id});
  EXPECT_EQ(again.exit_code, 1);
  EXPECT_NE(again.err.find(fmt::format("no sandbox '{}'", id)), std::string::npos) << again.err;
  auto none = quarry({"sandbox", "rm"});
  EXPECT_EQ(none.exit_code, 1);
  EXPECT_EQ(
      none.err,
      "quarry: name the sandboxes to destroy (quarry sandbox ls lists them), or give --all\n");
  auto both = quarry({"sandbox", "rm", "--all", id});
  EXPECT_EQ(both.exit_code, 1);
  EXPECT_EQ(both.err, "quarry: give sandbox ids or --all, not both\n");
  auto garbage = quarry({"sandbox", "rm", "../../etc"});
  EXPECT_EQ(garbage.exit_code, 1);
  EXPECT_NE(garbage.err.find("no sandbox"), std::string::npos);
}

// A create whose process was killed half way leaves a subvolume and cgroups but no record: once
// it has sat for a minute, ls shows it as stopped and rm removes it; younger, it may be a
// create under way elsewhere and is left alone.
TEST(Cli, LsShowsWhatACreateCutShortLeftAndRmRemovesIt) {
  auto created = quarry({"sandbox", "create"});
  ASSERT_EQ(created.exit_code, 0) << created.err;
  const std::string id = trimmed(created.out);
  const auto dir = SandboxEnvironment::get().state_dir() / "sandboxes" / id;
  std::filesystem::remove(dir / "sandbox.json");
  auto listed = [&] {
    auto ls = quarry({"sandbox", "ls", "--json"});
    EXPECT_EQ(ls.exit_code, 0) << ls.err;
    for (const auto& info : nlohmann::json::parse(ls.out)) {
      if (info["id"] == id) return info;
    }
    return nlohmann::json();
  };
  EXPECT_TRUE(listed().is_null()) << "a directory without a record for seconds is listed";
  std::filesystem::last_write_time(
      dir, std::filesystem::file_time_type::clock::now() - std::chrono::minutes(2));
  auto debris = listed();
  ASSERT_FALSE(debris.is_null()) << "what a cut-short create left is not listed";
  EXPECT_EQ(debris["state"], "stopped");
  EXPECT_EQ(debris["memory_bytes"], 0);
  auto removed = quarry({"sandbox", "rm", id});
  EXPECT_EQ(removed.exit_code, 0) << removed.err;
  EXPECT_FALSE(std::filesystem::exists(dir));
  EXPECT_TRUE(listed().is_null());
}

// Ctrl-C while a create installs --package (which may take minutes) waited for the install to
// end. It stops it now, and removes what it had made: here pip is stuck on a package index (on
// loopback) that takes connections and never answers.
TEST(Cli, CtrlCStopsACreateThatIsInstallingPackagesAndLeavesNothing) {
  SilentServer index;
  const std::string index_url = index.url("/simple/");
  const std::vector<std::string> pip_settings = {"PIP_CONFIG_FILE", "PIP_INDEX_URL", "PIP_NO_INDEX",
                                                 "PIP_FIND_LINKS"};
  std::map<std::string, std::optional<std::string>> saved;
  for (const auto& name : pip_settings) {
    const char* value = std::getenv(name.c_str());
    saved[name] = value ? std::optional<std::string>(value) : std::nullopt;
    ::unsetenv(name.c_str());
  }
  ::setenv("PIP_CONFIG_FILE", "/dev/null", 1);
  ::setenv("PIP_INDEX_URL", index_url.c_str(), 1);

  auto ids = [] {
    std::set<std::string> found;
    auto ls = quarry({"sandbox", "ls", "--json"});
    EXPECT_EQ(ls.exit_code, 0) << ls.err;
    for (const auto& info : nlohmann::json::parse(ls.out))
      found.insert(info["id"].get<std::string>());
    return found;
  };
  const auto before = ids();
  const auto stderr_file =
      std::filesystem::temp_directory_path() / fmt::format("qt-ctrl-c-{}", ::getpid());
  for (const auto& command : std::vector<std::vector<std::string>>{
           {"sandbox", "run", "--package", "quarry-never-served", "--", "true"},
           {"sandbox", "create", "--package", "quarry-never-served"}}) {
    SCOPED_TRACE(command[1]);
    std::filesystem::remove(stderr_file);
    std::vector<std::string> argv = {SandboxEnvironment::get().quarry_binary().string(),
                                     "--state-dir", SandboxEnvironment::get().state_dir().string()};
    argv.insert(argv.end(), command.begin(), command.end());
    ChildProcess creating(argv, stderr_file);
    const UniqueFd asking = index.accept(std::chrono::seconds(60));
    ASSERT_TRUE(asking) << "pip did not ask the index: " << read_file(stderr_file).value_or("");
    const int status = creating.stop(SIGINT);
    const std::string said = read_file(stderr_file).value_or("");
    EXPECT_TRUE((WIFSIGNALED(status) && WTERMSIG(status) == SIGINT) ||
                (WIFEXITED(status) && WEXITSTATUS(status) == 130))
        << "status " << status << ": " << said;
    EXPECT_NE(said.find("quarry: cancelled"), std::string::npos) << said;
    EXPECT_EQ(ids(), before) << "the sandbox of a cancelled create is left";
    EXPECT_TRUE(SilentServer::closed_within(asking, std::chrono::seconds(10))) << "pip goes on";
  }
  std::filesystem::remove(stderr_file);
  for (const auto& [name, value] : saved) {
    if (value)
      ::setenv(name.c_str(), value->c_str(), 1);
    else
      ::unsetenv(name.c_str());
  }
}

TEST(Cli, BadInputGetsAClearError) {
  auto memory = quarry({"sandbox", "create", "--memory", "lots"});
  EXPECT_EQ(memory.exit_code, 1);
  EXPECT_NE(memory.err.find("--memory: 'lots' is not a size"), std::string::npos) << memory.err;
  auto label = quarry({"sandbox", "create", "--label", "novalue"});
  EXPECT_EQ(label.exit_code, 1);
  EXPECT_NE(label.err.find("label 'novalue' must look like KEY=VALUE"), std::string::npos);
  auto dir = SandboxEnvironment::get().state_dir();
  std::ofstream(dir / "bad.yml") << "sandbox:\n  resources:\n    memroy: 1GiB\n";
  auto config = quarry({"--config", (dir / "bad.yml").string(), "sandbox", "ls"});
  EXPECT_EQ(config.exit_code, 1);
  EXPECT_NE(config.err.find("bad.yml:3: sandbox.resources.memroy: unknown key"), std::string::npos)
      << config.err;
  // What an option should look like, and no sandbox made for a command that cannot run.
  auto timeout = quarry({"sandbox", "run", "--timeout", "soon", "--", "true"});
  EXPECT_EQ(timeout.exit_code, 125);
  EXPECT_EQ(
      timeout.err,
      "quarry: --timeout: 'soon' is not a duration (use ms, s, m, h or d, e.g. 30s or 1h30m)\n");
  auto zero = quarry({"sandbox", "run", "--timeout", "0", "--", "true"});
  EXPECT_EQ(zero.exit_code, 125);
  EXPECT_EQ(zero.err, "quarry: --timeout: must be longer than zero, e.g. 30s\n");
  // An empty directory crashed quarry; a '~' the shell left alone made a directory named '~'.
  auto question = quarry({"ask", "  "});
  EXPECT_NE(question.exit_code, 0);
  EXPECT_NE(question.err.find("question: is empty: write a question"), std::string::npos)
      << question.err;
  auto empty = run_quarry({"--state-dir", "", "token", "ls"});
  EXPECT_NE(empty.exit_code, 0);
  EXPECT_NE(empty.err.find("--state-dir: is empty: name a directory"), std::string::npos)
      << empty.err;
  auto home = run_quarry({"--cache-dir=~/cache", "image", "ls"});
  EXPECT_NE(home.exit_code, 0);
  EXPECT_NE(home.err.find("'~/cache': quarry does not expand '~'; write the whole path"),
            std::string::npos)
      << home.err;
  // So for the environment, as a service or a quoted export sets it; a flag overrides it.
  ::setenv("QUARRY_STATE_DIR", "~/state", 1);
  auto from_environment = run_quarry({"token", "ls"});
  auto overridden = quarry({"sandbox", "ls"});
  ::unsetenv("QUARRY_STATE_DIR");
  EXPECT_NE(from_environment.exit_code, 0);
  EXPECT_NE(
      from_environment.err.find(
          "QUARRY_STATE_DIR: '~/state': quarry does not expand '~'; set it to the whole path"),
      std::string::npos)
      << from_environment.err;
  EXPECT_EQ(overridden.exit_code, 0) << overridden.err;
}

// Only the command argv names is built in full; the help still lists every command, and each
// command's own help (after global options with values) shows its options.
TEST(Cli, HelpListsEveryCommandAndEachCommandItsOptions) {
  auto top = quarry({"--help"});
  EXPECT_EQ(top.exit_code, 0) << top.err;
  for (const char* line : {"sandbox                     create, use and remove sandboxes",
                           "snapshot", "image", "db", "conversations", "ask", "serve",
                           "token                       API tokens for quarry serve"}) {
    EXPECT_NE(top.out.find(std::string("\n  ") + line), std::string::npos) << line << top.out;
  }
  auto run = quarry({"--log-level", "warn", "sandbox", "run", "--help"});
  EXPECT_EQ(run.exit_code, 0) << run.err;
  EXPECT_NE(run.out.find("create a sandbox, run one command, destroy it"), std::string::npos);
  EXPECT_NE(run.out.find("--timeout TEXT"), std::string::npos) << run.out;
  auto serve = quarry({"--log-level=warn", "serve", "--help"});
  EXPECT_EQ(serve.exit_code, 0) << serve.err;
  EXPECT_NE(serve.out.find("--listen TEXT"), std::string::npos) << serve.out;
  auto tokens = quarry({"token", "--help"});
  EXPECT_NE(tokens.out.find("\n  create"), std::string::npos) << tokens.out;
  auto misspelt = quarry({"sandbx", "ls"});
  EXPECT_EQ(misspelt.exit_code, 2);
  EXPECT_EQ(misspelt.err, "unknown command 'sandbx'\nRun with --help for more information.\n");
  // Not "unknown command 'info'": the value of an option quarry does not know.
  auto option = quarry({"--log-levl", "info", "sandbox", "ls"});
  EXPECT_EQ(option.exit_code, 2);
  EXPECT_EQ(option.err, "unknown option '--log-levl'\nRun with --help for more information.\n");
}

// The snapshot commands as a user runs them: freeze a prepared sandbox, start another from it,
// list, and remove once nothing uses it.
TEST(Cli, SnapshotCreateLsRmAndStartingFromOne) {
  CliSandbox source;
  auto prepared =
      quarry({"sandbox", "exec", source.id(), "--", "sh", "-c", "echo 1,2 > data/input.csv"});
  ASSERT_EQ(prepared.exit_code, 0) << prepared.err;
  auto made = quarry({"snapshot", "create", source.id(), "cli-prepared"});
  ASSERT_EQ(made.exit_code, 0) << made.err;
  EXPECT_EQ(made.out, "cli-prepared\n");
  EXPECT_TRUE(made.err.starts_with("snapshot cli-prepared: ")) << made.err;
  EXPECT_NE(made.err.find(fmt::format(" from sandbox {}", source.id())), std::string::npos)
      << made.err;

  {
    CliSandbox started({"--snapshot", "cli-prepared"});
    auto read = quarry({"sandbox", "exec", started.id(), "--", "cat", "data/input.csv"});
    EXPECT_EQ(read.exit_code, 0) << read.err;
    EXPECT_EQ(read.out, "1,2\n");

    auto listed = quarry({"snapshot", "ls", "--json"});
    ASSERT_EQ(listed.exit_code, 0) << listed.err;
    auto json = nlohmann::json::parse(listed.out);
    auto it = std::find_if(json.begin(), json.end(),
                           [](const auto& entry) { return entry["name"] == "cli-prepared"; });
    ASSERT_NE(it, json.end()) << listed.out;
    EXPECT_EQ((*it)["kind"], "named");
    EXPECT_EQ((*it)["sandbox"], source.id());
    EXPECT_EQ((*it)["used_by"]["sandboxes"], nlohmann::json::array({started.id()}));
    EXPECT_GT((*it)["size_bytes"].get<uint64_t>(), 0u);
    auto sandboxes = quarry({"sandbox", "ls", "--json"});
    ASSERT_EQ(sandboxes.exit_code, 0) << sandboxes.err;
    for (const auto& entry : nlohmann::json::parse(sandboxes.out)) {
      if (entry["id"] == started.id()) {
        EXPECT_EQ(entry["snapshot"], "cli-prepared");
      } else if (entry["id"] == source.id()) {
        EXPECT_TRUE(entry["snapshot"].is_null());
      }
    }
    auto table = quarry({"snapshot", "ls"});
    EXPECT_NE(table.out.find("cli-prepared"), std::string::npos) << table.out;
    EXPECT_NE(table.out.find(fmt::format("sandbox {}", source.id())), std::string::npos);

    auto refused = quarry({"snapshot", "rm", "cli-prepared"});
    EXPECT_EQ(refused.exit_code, 1);
    EXPECT_NE(refused.err.find(fmt::format("in use by sandbox {0}; remove it first: quarry "
                                           "sandbox rm {0}",
                                           started.id())),
              std::string::npos)
        << refused.err;
  }
  auto removed = quarry({"snapshot", "rm", "cli-prepared"});
  EXPECT_EQ(removed.exit_code, 0) << removed.err;
  EXPECT_EQ(removed.out, "cli-prepared\n");

  auto unknown = quarry({"sandbox", "create", "--snapshot", "cli-prepared"});
  EXPECT_EQ(unknown.exit_code, 1);
  EXPECT_NE(unknown.err.find("no snapshot 'cli-prepared' (see quarry snapshot ls)"),
            std::string::npos)
      << unknown.err;
  auto bad_name = quarry({"snapshot", "create", source.id(), "Not/A Name"});
  EXPECT_EQ(bad_name.exit_code, 1);
  EXPECT_NE(bad_name.err.find("'Not/A Name' is not a snapshot name"), std::string::npos);
  auto bad_package = quarry({"sandbox", "create", "--package", "git+https://example.invalid/x"});
  EXPECT_EQ(bad_package.exit_code, 1);
  EXPECT_NE(bad_package.err.find("is not a package requirement"), std::string::npos)
      << bad_package.err;
  auto gc = quarry({"snapshot", "gc"});
  EXPECT_EQ(gc.exit_code, 0) << gc.err;
}

}  // namespace
}  // namespace quarry::testing

namespace quarry::testing {
namespace {

// A conversation made through the library, read through the CLI.
TEST(Cli, ConversationsLsAndShow) {
  auto& environment = SandboxEnvironment::get();
  SystemClock clock;
  auto history =
      conversation::SqliteHistoryStore::open(environment.state_dir() / "history.db", clock);
  ASSERT_TRUE(history) << history.error().message;
  auto id = (*history)->create_conversation("median views per category")->id;
  conversation::ManagerOptions options;
  options.instance_id = fmt::format("cli-{}", ::getpid());
  options.spec.resources = environment.config().sandbox.resources;
  conversation::ConversationManager manager(environment.provider(), **history, clock, options);
  {
    auto turn = manager.begin_turn(id);
    ASSERT_TRUE(turn);
    conversation::Message question;
    question.turn = 1;
    question.content = "What is the median?";
    (*history)->append_message(id, question);
    sandbox::ExecRequest request;
    request.argv = {"python3", "-c", "print(42)"};
    ASSERT_TRUE((*turn)->sandbox().execute(request));
    (*turn)->finish(conversation::TurnStatus::kCompleted);
  }

  auto ls = quarry({"conversations", "ls"});
  ASSERT_EQ(ls.exit_code, 0) << ls.err;
  EXPECT_NE(ls.out.find(id), std::string::npos);
  EXPECT_NE(ls.out.find("median views per category"), std::string::npos);
  EXPECT_NE(ls.out.find("idle"), std::string::npos);

  auto show = quarry({"conversations", "show", id});
  ASSERT_EQ(show.exit_code, 0) << show.err;
  EXPECT_NE(show.out.find("turn 1"), std::string::npos);
  EXPECT_NE(show.out.find("What is the median?"), std::string::npos);
  EXPECT_NE(show.out.find("exec      python3 -c 'print(42)'"), std::string::npos) << show.out;
  EXPECT_NE(show.out.find("exit 0, run "), std::string::npos);
  EXPECT_EQ(show.out.find("sandbox_ready"), std::string::npos);  // events only on request

  auto events = quarry({"conversations", "show", id, "--events"});
  EXPECT_NE(events.out.find("sandbox_ready"), std::string::npos) << events.out;
  EXPECT_NE(events.out.find("new -> starting"), std::string::npos);

  auto json = quarry({"conversations", "show", id, "--json"});
  ASSERT_EQ(json.exit_code, 0) << json.err;
  auto parsed = nlohmann::json::parse(json.out);
  ASSERT_EQ(parsed["turns"].size(), 1u);
  EXPECT_EQ(parsed["turns"][0]["status"], "completed");
  EXPECT_EQ(parsed["sandbox"]["state"], "idle");
  EXPECT_EQ(parsed["execs"][0]["stdout"], "42\n");
  EXPECT_EQ(parsed["execs"][0]["command"], "python3 -c 'print(42)'");
  EXPECT_FALSE(parsed["events"].empty());
  EXPECT_EQ(parsed["messages"][0]["content"], "What is the median?");

  auto missing = quarry({"conversations", "show", "nope"});
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_NE(missing.err.find("no conversation 'nope'"), std::string::npos);
  (void)manager.shutdown();
}

}  // namespace
}  // namespace quarry::testing

// quarry sandbox create | exec | run | cp | ls | rm
#include <signal.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "cli/cancel_signals.h"
#include "cli/commands.h"
#include "common/file_util.h"
#include "common/units.h"
#include "sandbox/local/local_provider.h"
#include "sandbox/metering.h"

namespace quarry::cli {
namespace {

using sandbox::ExecRequest;
using sandbox::ExecResult;
using sandbox::Labels;

// Exit statuses of `sandbox exec` and `run` beside the command's own, as timeout(1) and
// docker run give them: the command hit its timeout; quarry itself failed (a bad flag, no such
// sandbox, a sandbox that could not be made), so that a script can tell that from a command
// that exited 1 or 2. The command's 126 (not executable) and 127 (not found) pass through.
constexpr int kTimeoutExit = 124;
constexpr int kOwnFailureExit = 125;

struct ResourceFlags {
  std::string memory, disk;
  std::optional<double> cpus;
  std::optional<uint32_t> pids;
  std::vector<std::string> labels;
  std::string snapshot;
  std::vector<std::string> packages;
};

struct ExecFlags {
  std::string timeout;
  bool json = false;
  std::vector<std::string> env;
  std::string workdir;
  std::vector<std::string> command;
};

void add_resource_flags(CLI::App* command, ResourceFlags& flags) {
  command->add_option("--label", flags.labels, "label KEY=VALUE (repeatable)")
      ->allow_extra_args(false);
  command->add_option("--memory", flags.memory, "memory limit, e.g. 1GiB (default: config)");
  command->add_option("--cpus", flags.cpus, "CPU quota in cores, e.g. 1 or 0.5 (default: config)");
  command->add_option("--pids", flags.pids, "process and thread limit (default: config)");
  command->add_option("--disk", flags.disk, "writable disk size, e.g. 2GiB (default: config)");
  command->add_option("--snapshot", flags.snapshot,
                      "start from this snapshot (quarry snapshot ls) instead of the bare image");
  command
      ->add_option("--package", flags.packages,
                   "an extra Python package, e.g. tabulate==0.9.0 (repeatable); installed once "
                   "per set, then kept as a snapshot that later sandboxes start from")
      ->allow_extra_args(false);
}

void add_exec_flags(CLI::App* command, ExecFlags& flags) {
  command->add_option("--timeout", flags.timeout,
                      "kill the command and everything it started after this long, e.g. 30s "
                      "(default: sandbox.exec_timeout)");
  command->add_flag("--json", flags.json, "print one JSON object with the output and metering");
  command->add_option("--env", flags.env, "environment variable KEY=VALUE (repeatable)")
      ->allow_extra_args(false);
  command->add_option("--workdir", flags.workdir, "working directory inside the sandbox");
  command->add_option("command", flags.command, "the command and its arguments (after --)")
      ->required();
}

Result<std::pair<std::string, std::string>> split_pair(std::string_view text,
                                                       std::string_view what) {
  auto equals = text.find('=');
  if (equals == std::string_view::npos || equals == 0) {
    return make_error(ErrorCode::kInvalidArgument, "{} '{}' must look like KEY=VALUE", what, text);
  }
  return std::pair{std::string(text.substr(0, equals)), std::string(text.substr(equals + 1))};
}

Result<Labels> parse_labels(const std::vector<std::string>& items) {
  Labels labels;
  for (const auto& item : items) {
    ASSIGN_OR_RETURN(auto pair, split_pair(item, "label"));
    labels[pair.first] = pair.second;
  }
  return labels;
}

Result<sandbox::SandboxSpec> make_spec(const ResourceFlags& flags, const Config& config) {
  sandbox::SandboxSpec spec;
  spec.resources = config.sandbox.resources;
  spec.network = config.sandbox.network;
  ASSIGN_OR_RETURN(spec.labels, parse_labels(flags.labels));
  spec.snapshot = flags.snapshot;
  spec.packages = flags.packages;
  if (!flags.memory.empty()) {
    ASSIGN_OR_RETURN(spec.resources.memory_bytes,
                     with_context(parse_size(flags.memory), "--memory"));
  }
  if (!flags.disk.empty()) {
    ASSIGN_OR_RETURN(spec.resources.disk_bytes, with_context(parse_size(flags.disk), "--disk"));
  }
  if (flags.cpus) spec.resources.cpus = *flags.cpus;
  if (flags.pids) spec.resources.pids = *flags.pids;
  RETURN_IF_ERROR(validate_resources(spec.resources));
  return spec;
}

void write_all(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n <= 0) return;
    data.remove_prefix(static_cast<size_t>(n));
  }
}

// The command and its options as a request, checked before any sandbox is made for it.
Result<ExecRequest> make_request(const ExecFlags& flags, const Config& config,
                                 const CancelSignals& cancel) {
  ExecRequest request;
  request.argv = flags.command;
  request.timeout = config.sandbox.exec_timeout;
  request.output_limit = config.sandbox.output_limit_bytes;
  request.cancel_fd = cancel.fd();
  if (!flags.timeout.empty()) {
    ASSIGN_OR_RETURN(request.timeout, with_context(parse_duration(flags.timeout), "--timeout"));
    if (request.timeout.count() <= 0) {
      return make_error(ErrorCode::kInvalidArgument,
                        "--timeout: must be longer than zero, e.g. 30s");
    }
  }
  for (const auto& item : flags.env) {
    ASSIGN_OR_RETURN(auto pair, split_pair(item, "--env"));
    request.env[pair.first] = pair.second;
  }
  request.working_directory = flags.workdir;
  if (!flags.json) {
    request.on_output = [](sandbox::OutputStream stream, std::string_view data) {
      write_all(stream == sandbox::OutputStream::kStdout ? STDOUT_FILENO : STDERR_FILENO, data);
    };
  }
  return request;
}

// A failure's exit status, said on stderr; Ctrl-C's is "cancelled", as a shell reports SIGINT.
int report_failure(const Error& error) {
  if (error.code == ErrorCode::kCancelled) {
    std::fprintf(stderr, "quarry: cancelled\n");
    return kCancelledExit;
  }
  return report(error);
}

// The same for exec and run, whose statuses are the command's unless quarry failed.
int exec_failure(const Error& error) {
  const int status = report_failure(error);
  return status == kCancelledExit ? status : kOwnFailureExit;
}

// Runs the command and prints what the user asked for; returns quarry's exit status.
int run_exec(sandbox::SandboxProvider& provider, const std::string& id, const ExecRequest& request,
             bool json) {
  auto result = provider.exec(id, request);
  if (!result) return exec_failure(result.error());
  if (json) {
    std::cout << sandbox::to_json(*result).dump(2, ' ', false,
                                                nlohmann::json::error_handler_t::replace)
              << std::endl;
    return 0;
  }
  if (result->truncated) {
    std::fprintf(stderr, "quarry: output was longer than %s per stream; --json keeps only that\n",
                 format_size(request.output_limit).c_str());
  }
  if (result->message) std::fprintf(stderr, "quarry: %s\n", result->message->c_str());
  if (auto network = sandbox::network_message(*result)) {
    std::fprintf(stderr, "quarry: %s\n", network->c_str());
  }
  if (result->timed_out) return kTimeoutExit;
  return result->exit_code;
}

std::string label_text(const Labels& labels) {
  std::vector<std::string> parts;
  for (const auto& [key, value] : labels)
    parts.push_back(key + "=" + value);
  return parts.empty() ? "-" : fmt::format("{}", fmt::join(parts, ","));
}

// "ID:/path" names a file in a sandbox; anything else is a host path. An id is letters, digits
// and '-' (a local sandbox's 12 hex digits, a Daytona sandbox's UUID), so "./a:b" is a host path.
std::optional<std::pair<std::string, std::string>> sandbox_path(const std::string& text) {
  auto colon = text.find(':');
  if (colon == std::string::npos || colon == 0) return std::nullopt;
  std::string id = text.substr(0, colon);
  const bool an_id = std::all_of(id.begin(), id.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '-';
  });
  if (!an_id) return std::nullopt;
  return std::pair{id, text.substr(colon + 1)};
}

int copy(sandbox::SandboxProvider& provider, const std::string& from, const std::string& to) {
  auto source = sandbox_path(from);
  auto target = sandbox_path(to);
  if (source && target) {
    return report(Error{ErrorCode::kInvalidArgument,
                        "copying between two sandboxes is not supported; copy to the host first"});
  }
  if (!source && !target) {
    return report(Error{ErrorCode::kInvalidArgument,
                        "one side of cp must be a sandbox path, written ID:/path/in/sandbox"});
  }
  if (target) {
    std::error_code error;
    if (std::filesystem::is_directory(from, error)) {
      return report(Error{ErrorCode::kInvalidArgument,
                          fmt::format("'{}' is a directory; cp copies one file", from)});
    }
    std::ifstream in(from, std::ios::binary);
    if (!in) {
      return report(Error{ErrorCode::kNotFound,
                          fmt::format("cannot read '{}': {}", from, std::strerror(errno))});
    }
    // Into a directory (named with a trailing '/', or one that is there) under the file's own
    // name, as cp does.
    if (!target->second.ends_with('/')) {
      auto directory = provider.is_directory(target->first, target->second);
      if (!directory) return report(directory.error());
      if (*directory) target->second += '/';
    }
    if (target->second.ends_with('/')) {
      target->second += std::filesystem::path(from).filename().string();
    }
    // Ctrl-C stops it (kCancelled: "quarry: cancelled", exit 130).
    CancelSignals cancel;
    if (auto written = provider.write_file(target->first, target->second, in, cancel.fd());
        !written) {
      return report_failure(written.error());
    }
    return 0;
  }
  // Into a directory as the sandbox file's name, as cp does; written beside the file and renamed
  // over it once complete, so a failed copy leaves what was there.
  std::filesystem::path file = to;
  std::error_code error;
  if (to.ends_with('/') || std::filesystem::is_directory(file, error)) {
    file /= std::filesystem::path(source->second).filename();
  }
  constexpr uint64_t kMaxCopy = 64ULL << 30;
  CancelSignals cancel;  // Ctrl-C stops it, leaving what was at `file`
  auto copied = write_then_rename(file, [&](const std::filesystem::path& partial) -> Result<void> {
    std::ofstream out(partial, std::ios::binary | std::ios::trunc);
    if (!out) {
      return make_error(ErrorCode::kInvalidArgument, "cannot write '{}': {}", file.string(),
                        std::strerror(errno));
    }
    RETURN_IF_ERROR(provider.read_file(source->first, source->second, out, kMaxCopy, cancel.fd()));
    out.close();
    if (!out) return make_error(ErrorCode::kInternal, "writing '{}' failed", file.string());
    return {};
  });
  return copied ? 0 : report_failure(copied.error());
}

}  // namespace

// What the sandbox subcommands parse into.
struct SandboxOptions final : CommandGroup {
  ResourceFlags create_flags;
  ExecFlags exec_flags;
  std::string exec_id;
  ResourceFlags run_resources;
  ExecFlags run_flags;
  std::string cp_from, cp_to;
  std::vector<std::string> ls_labels;
  bool ls_json = false;
  std::vector<std::string> rm_ids;
  bool rm_all = false;
  const CLI::App* exec_command = nullptr;
  const CLI::App* run_command = nullptr;

  int usage_exit() const override {
    return exec_command->parsed() || run_command->parsed() ? kOwnFailureExit : kUsageExit;
  }
};

std::unique_ptr<CommandGroup> add_sandbox_commands(CLI::App& group, Context& context,
                                                   int& exit_code, DataCommands&) {
  auto options = std::make_unique<SandboxOptions>();
  auto& [create_flags, exec_flags, exec_id, run_resources, run_flags, cp_from, cp_to, ls_labels,
         ls_json, rm_ids, rm_all, exec_command, run_command] = *options;
  group.require_subcommand(1);

  // create
  auto* create = group.add_subcommand("create", "create a sandbox and print its id");
  add_resource_flags(create, create_flags);
  create->callback([&] {
    auto provider = context.provider();
    if (!provider) return void(exit_code = report(provider.error()));
    auto spec = make_spec(create_flags, **context.config());
    if (!spec) return void(exit_code = report(spec.error()));
    // Installing --package may take minutes: Ctrl-C stops it and removes what was made.
    CancelSignals cancel;
    spec->cancel_fd = cancel.fd();
    auto info = (*provider)->create(*spec);
    if (!info) return void(exit_code = report_failure(info.error()));
    std::cout << info->id << std::endl;
  });

  // exec
  auto* exec = group.add_subcommand("exec", "run a command in a sandbox");
  exec->add_option("id", exec_id, "sandbox id")->required();
  add_exec_flags(exec, exec_flags);
  exec_command = exec;
  exec->callback([&] {
    auto provider = context.provider();
    if (!provider) return void(exit_code = exec_failure(provider.error()));
    CancelSignals cancel;
    auto request = make_request(exec_flags, **context.config(), cancel);
    if (!request) return void(exit_code = exec_failure(request.error()));
    exit_code = run_exec(**provider, exec_id, *request, exec_flags.json);
  });

  // run
  auto* run = group.add_subcommand("run", "create a sandbox, run one command, destroy it");
  add_resource_flags(run, run_resources);
  add_exec_flags(run, run_flags);
  run_command = run;
  run->callback([&] {
    auto provider = context.provider();
    if (!provider) return void(exit_code = exec_failure(provider.error()));
    auto spec = make_spec(run_resources, **context.config());
    if (!spec) return void(exit_code = exec_failure(spec.error()));
    CancelSignals cancel;
    auto request = make_request(run_flags, **context.config(), cancel);
    if (!request) return void(exit_code = exec_failure(request.error()));
    spec->cancel_fd = cancel.fd();
    auto info = (*provider)->create(*spec);
    if (!info) return void(exit_code = exec_failure(info.error()));
    exit_code = run_exec(**provider, info->id, *request, run_flags.json);
    if (auto destroyed = (*provider)->destroy(info->id); !destroyed) {
      exit_code = exec_failure(destroyed.error());
    }
  });

  // cp
  auto* cp = group.add_subcommand(
      "cp", "copy a file into or out of a sandbox: cp FILE ID:/path or cp ID:/path FILE");
  cp->add_option("from", cp_from, "source")->required();
  cp->add_option("to", cp_to, "destination")->required();
  cp->callback([&] {
    auto provider = context.provider();
    if (!provider) return void(exit_code = report(provider.error()));
    exit_code = copy(**provider, cp_from, cp_to);
  });

  // ls
  auto* ls = group.add_subcommand("ls", "list sandboxes");
  ls->add_option("--label", ls_labels, "only sandboxes with label KEY=VALUE (repeatable)")
      ->allow_extra_args(false);
  ls->add_flag("--json", ls_json, "print a JSON array");
  ls->callback([&] {
    auto provider = context.provider();
    if (!provider) return void(exit_code = report(provider.error()));
    auto labels = parse_labels(ls_labels);
    if (!labels) return void(exit_code = report(labels.error()));
    auto found = (*provider)->find(*labels);
    if (!found) return void(exit_code = report(found.error()));
    // The local provider's proxy counts what it let through and refused; a remote engine does
    // not say.
    auto* local = dynamic_cast<sandbox::local::LocalProvider*>(*provider);
    // none, or the allowlist with what its proxy let through and refused so far.
    auto network_of = [&](const sandbox::SandboxInfo& info) {
      nlohmann::json network = {{"mode", "none"}};
      if (info.network.mode != NetworkMode::kAllowlist) return network;
      network = {{"mode", "allowlist"}, {"allow", info.network.allow}};
      if (local == nullptr) return network;
      if (auto counted = local->network_activity(info.id)) {
        network["allowed"] = counted->allowed;
        network["denied"] = counted->denied;
      }
      return network;
    };
    auto network_text = [&](const nlohmann::json& network) -> std::string {
      if (network["mode"] == "none") return "none";
      if (local == nullptr) return "allowlist";
      if (!network.contains("denied")) return "allowlist (proxy down)";
      return fmt::format("allowlist ({} refused)", network["denied"].get<uint64_t>());
    };
    if (ls_json) {
      nlohmann::json list = nlohmann::json::array();
      for (const auto& info : *found) {
        list.push_back(
            {{"id", info.id},
             {"state", info.state == sandbox::SandboxState::kRunning ? "running" : "stopped"},
             {"labels", info.labels},
             {"cpus", info.resources.cpus},
             {"memory_bytes", info.resources.memory_bytes},
             {"disk_bytes", info.resources.disk_bytes},
             {"pids", info.resources.pids},
             {"network", network_of(info)},
             {"snapshot", info.snapshot.empty() ? nlohmann::json() : nlohmann::json(info.snapshot)},
             {"packages", info.packages},
             {"created_at_ms", std::chrono::duration_cast<std::chrono::milliseconds>(
                                   info.created_at.time_since_epoch())
                                   .count()}});
      }
      std::cout << list.dump(2) << std::endl;
      return;
    }
    size_t id_width = 14;  // a local id and two spaces; a Daytona UUID is longer
    for (const auto& info : *found)
      id_width = std::max(id_width, info.id.size() + 2);
    std::cout << fmt::format("{:<{}}{:<9}{:<6}{:<6}{:<10}{:<10}{:<6}{:<24}{}\n", "ID", id_width,
                             "STATE", "AGE", "CPUS", "MEMORY", "DISK", "PIDS", "NETWORK", "LABELS");
    for (const auto& info : *found) {
      std::cout << fmt::format(
          "{:<{}}{:<9}{:<6}{:<6}{:<10}{:<10}{:<6}{:<24}{}\n", info.id, id_width,
          info.state == sandbox::SandboxState::kRunning ? "running" : "stopped",
          age(info.created_at), info.resources.cpus, format_size(info.resources.memory_bytes),
          format_size(info.resources.disk_bytes), info.resources.pids,
          network_text(network_of(info)), label_text(info.labels));
    }
  });

  // rm
  auto* rm = group.add_subcommand("rm", "destroy sandboxes: rm ID... or rm --all");
  rm->add_option("ids", rm_ids, "sandbox ids");
  rm->add_flag("--all", rm_all, "destroy every sandbox");
  rm->callback([&] {
    if (rm_all == !rm_ids.empty()) {
      return void(exit_code = report(Error{
                      ErrorCode::kInvalidArgument,
                      rm_all ? "give sandbox ids or --all, not both"
                             : "name the sandboxes to destroy (quarry sandbox ls lists them), "
                               "or give --all"}));
    }
    auto provider = context.provider();
    if (!provider) return void(exit_code = report(provider.error()));
    std::vector<std::string> ids = rm_ids;
    if (rm_all) {
      auto found = (*provider)->find({});
      if (!found) return void(exit_code = report(found.error()));
      for (const auto& info : *found)
        ids.push_back(info.id);
    }
    for (const auto& id : ids) {
      if (auto destroyed = (*provider)->destroy(id); !destroyed) {
        exit_code = report(destroyed.error());
      } else {
        std::cout << id << std::endl;
      }
    }
  });
  return options;
}

}  // namespace quarry::cli

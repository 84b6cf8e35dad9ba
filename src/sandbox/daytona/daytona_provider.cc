#include "sandbox/daytona/daytona_provider.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <cmath>
#include <cstdlib>
#include <ctime>
#include <deque>
#include <istream>
#include <iterator>
#include <ostream>

#include "common/file_util.h"
#include "common/json.h"
#include "common/random_id.h"
#include "common/text.h"
#include "sandbox/metering.h"

namespace quarry::sandbox::daytona {

std::string_view probe_source();  // probe_text.cc, generated from probe.py

namespace {

using Clock = std::chrono::steady_clock;

constexpr std::string_view kMarker = "\x1equarry-probe ";
// list_files walks directories one call each, within these bounds.
constexpr size_t kMaxListed = 10000;
constexpr size_t kMaxDepth = 32;
constexpr auto kListTime = std::chrono::seconds(30);
// What a file written into a sandbox may be: it travels in one request body.
constexpr uint64_t kMaxUpload = 2ULL << 30;

int whole_minutes(Duration duration) {
  return static_cast<int>(std::chrono::ceil<std::chrono::minutes>(duration).count());
}

// Whole units of `unit`, rounded up: Daytona takes cores and GB as integers.
int whole(double value, double unit) {
  return std::max(1, static_cast<int>(std::ceil(value / unit - 1e-9)));
}

std::chrono::system_clock::time_point parse_time(const std::string& text) {
  std::tm tm{};
  int year = 0, month = 0;
  if (std::sscanf(text.c_str(), "%d-%d-%dT%d:%d:%d", &year, &month, &tm.tm_mday, &tm.tm_hour,
                  &tm.tm_min, &tm.tm_sec) != 6) {
    return {};
  }
  tm.tm_year = year - 1900;
  tm.tm_mon = month - 1;
  return std::chrono::system_clock::from_time_t(timegm(&tm));
}

// Waits between two looks at a sandbox changing state: quick at first (a quarry server starts
// one in milliseconds), then at most a second apart.
class Poll {
 public:
  explicit Poll(Duration timeout) : deadline_(Clock::now() + timeout) {}
  bool expired() const { return Clock::now() >= deadline_; }
  // Waits until the next look; false, at once, when `cancel_fd` (-1: none) is readable.
  bool wait(int cancel_fd = -1) {
    const bool cancelled =
        signalled_within(cancel_fd, std::chrono::duration_cast<std::chrono::milliseconds>(delay_));
    delay_ = std::min<Duration>(delay_ * 2, std::chrono::seconds(1));
    return !cancelled;
  }

 private:
  Clock::time_point deadline_;
  Duration delay_ = std::chrono::milliseconds(20);
};

}  // namespace

SandboxInfo info_from(const nlohmann::json& sandbox) {
  SandboxInfo info;
  info.id = sandbox.value("id", "");
  if (auto labels = sandbox.find("labels"); labels != sandbox.end() && labels->is_object()) {
    for (const auto& [key, value] : labels->items()) {
      if (value.is_string()) info.labels[key] = value.get<std::string>();
    }
  }
  info.resources.cpus = sandbox.value("cpu", 1.0);
  info.resources.memory_bytes = static_cast<uint64_t>(sandbox.value("memory", 1.0) * kGiB);
  info.resources.disk_bytes = static_cast<uint64_t>(sandbox.value("disk", 3.0) * kGiB);
  info.state =
      sandbox.value("state", "") == "started" ? SandboxState::kRunning : SandboxState::kStopped;
  info.created_at = parse_time(sandbox.value("createdAt", ""));
  info.snapshot = sandbox.value("snapshot", nlohmann::json()).is_string()
                      ? sandbox["snapshot"].get<std::string>()
                      : "";
  if (!sandbox.value("networkBlockAll", true)) {
    info.network.mode = NetworkMode::kAllowlist;
    std::string_view domains;
    if (auto list = sandbox.find("domainAllowList"); list != sandbox.end() && list->is_string()) {
      domains = list->get_ref<const std::string&>();
    }
    while (!domains.empty()) {
      const size_t comma = domains.find(',');
      auto domain = domains.substr(0, comma);
      if (!domain.empty()) info.network.allow.emplace_back(domain);
      if (comma == std::string_view::npos) break;
      domains.remove_prefix(comma + 1);
    }
  }
  return info;
}

Result<ExecResult> parse_probe_report(std::string_view output) {
  const size_t at = output.rfind(kMarker);
  if (at == std::string_view::npos) {
    std::string shown(output.substr(0, 500));
    return make_error(ErrorCode::kInternal,
                      "quarry's probe did not report (does the sandbox have python3?): {}",
                      shown.empty() ? "no output" : shown);
  }
  auto json = parse_json_or_discarded(output.substr(at + kMarker.size()));
  if (!json.is_object()) {
    return make_error(ErrorCode::kInternal, "quarry's probe reported something that is not JSON");
  }
  ExecResult result;
  result.exit_code = json.value("exit_code", -1);
  if (auto signal = json.find("signal"); signal != json.end() && signal->is_number_integer()) {
    result.signal = signal->get<int>();
  }
  result.stdout_text = json.value("stdout", "");
  result.stderr_text = json.value("stderr", "");
  result.truncated = json.value("truncated", false);
  result.timed_out = json.value("timed_out", false);
  result.run_ms = json.value("run_ms", 0.0);
  result.cpu_ms = json.value("cpu_ms", 0.0);
  result.peak_memory_bytes = json.value("peak_memory_bytes", uint64_t{0});
  result.memory_limit_bytes = json.value("memory_limit_bytes", uint64_t{0});
  result.oom = json.value("oom", false);
  return result;
}

DaytonaProvider::DaytonaProvider(SandboxConfig config, DaytonaClient client)
    : config_(std::move(config)), client_(std::move(client)) {}

Result<std::string> api_key_from(const std::string& variable, std::string_view named_in,
                                 std::string_view account) {
  const char* key = std::getenv(variable.c_str());
  if (key == nullptr || *key == '\0') {
    return make_error(ErrorCode::kFailedPrecondition,
                      "sandbox.provider is daytona, but ${} holds no API key{}: export {}=<key> "
                      "(or name another variable in {})",
                      variable, account.empty() ? "" : fmt::format(" for account {}", account),
                      variable, named_in);
  }
  return std::string(key);
}

Result<std::unique_ptr<DaytonaProvider>> DaytonaProvider::open(const SandboxConfig& config) {
  ASSIGN_OR_RETURN(auto key,
                   api_key_from(config.daytona.api_key_env, "sandbox.daytona.api_key_env"));
  return open(config, std::move(key));
}

Result<std::unique_ptr<DaytonaProvider>> DaytonaProvider::open(const SandboxConfig& config,
                                                               std::string api_key) {
  const auto& daytona = config.daytona;
  ASSIGN_OR_RETURN(auto url, with_context(parse_url(daytona.api_url), "sandbox.daytona.api_url"));
  ASSIGN_OR_RETURN(auto client, DaytonaClient::create({.api_url = std::move(url),
                                                       .api_key = std::move(api_key),
                                                       .request_timeout = daytona.request_timeout,
                                                       .connect_timeout = daytona.connect_timeout,
                                                       .max_retries = daytona.max_retries,
                                                       .ca_file = daytona.ca_file}));
  return std::unique_ptr<DaytonaProvider>(new DaytonaProvider(config, std::move(client)));
}

Result<Url> DaytonaProvider::toolbox(std::string_view id) {
  {
    std::lock_guard lock(mutex_);
    if (auto known = toolboxes_.find(id); known != toolboxes_.end()) return known->second;
  }
  ASSIGN_OR_RETURN(auto sandbox, client_.get_sandbox(id));
  const std::string text = sandbox.value("toolboxProxyUrl", "");
  if (text.empty()) {
    return make_error(ErrorCode::kInternal, "daytona: sandbox {} has no toolboxProxyUrl", id);
  }
  ASSIGN_OR_RETURN(auto url, with_context(parse_url(text), "daytona: the toolboxProxyUrl"));
  std::lock_guard lock(mutex_);
  toolboxes_.insert_or_assign(std::string(id), url);
  return url;
}

void DaytonaProvider::discard(std::string_view id, const Error& why) {
  // A cancelled create is what its caller asked for, not something to warn of.
  spdlog::log(why.code == ErrorCode::kCancelled ? spdlog::level::info : spdlog::level::warn,
              "daytona: deleting sandbox {}: {}", id, why.message);
  if (auto deleted = destroy(id); !deleted && deleted.error().code != ErrorCode::kNotFound) {
    spdlog::error(
        "daytona: sandbox {} could not be deleted ({}); a later start finds it by its "
        "labels",
        id, deleted.error().message);
  }
}

Result<nlohmann::json> DaytonaProvider::wait_started(std::string_view id, int cancel_fd) {
  Poll poll(config_.daytona.create_timeout);
  for (;;) {
    auto sandbox = client_.get_sandbox(id);
    if (!sandbox && sandbox.error().code != ErrorCode::kUnavailable) {
      return std::unexpected(sandbox.error());
    }
    if (sandbox) {
      const std::string state = sandbox->value("state", "");
      if (state == "started") return *sandbox;
      if (state == "error" || state == "build_failed" || state == "destroyed" ||
          state == "destroying") {
        const std::string reason = sandbox->value("errorReason", nlohmann::json()).is_string()
                                       ? (*sandbox)["errorReason"].get<std::string>()
                                       : "no reason given";
        return make_error(ErrorCode::kUnavailable, "daytona: sandbox {} ended in '{}': {}", id,
                          state, reason);
      }
      if (poll.expired()) {
        return make_error(ErrorCode::kDeadlineExceeded,
                          "daytona: sandbox {} was still '{}' after {} (sandbox.daytona."
                          "create_timeout)",
                          id, state, format_duration(config_.daytona.create_timeout));
      }
    } else if (poll.expired()) {
      return std::unexpected(sandbox.error());
    }
    if (!poll.wait(cancel_fd)) {
      return make_error(ErrorCode::kCancelled, "cancelled while sandbox {} was starting", id);
    }
  }
}

Result<SandboxInfo> DaytonaProvider::create(const SandboxSpec& spec) {
  const auto& daytona = config_.daytona;
  if (!spec.packages.empty()) {
    return make_error(ErrorCode::kFailedPrecondition,
                      "the daytona provider installs no extra packages ({}): put them in the "
                      "Daytona snapshot or image it creates sandboxes from (sandbox.daytona)",
                      fmt::join(spec.packages, ", "));
  }
  const std::string token = random_id();
  nlohmann::json labels = daytona.labels;
  for (const auto& [key, value] : spec.labels)
    labels[key] = value;
  labels[std::string(kCreateLabel)] = token;
  nlohmann::json body = {
      {"labels", labels},
      {"autoStopInterval", whole_minutes(daytona.auto_stop)},
      {"autoDeleteInterval", daytona.auto_delete ? whole_minutes(*daytona.auto_delete) : -1},
      {"networkBlockAll", spec.network.mode == NetworkMode::kNone}};
  if (spec.network.mode == NetworkMode::kAllowlist) {
    body["domainAllowList"] = fmt::format("{}", fmt::join(spec.network.allow, ","));
  }
  if (!daytona.target.empty()) body["target"] = daytona.target;
  const std::string snapshot = !spec.snapshot.empty() ? spec.snapshot : daytona.snapshot;
  // A snapshot (Daytona's default one too) brings its resources, and Daytona refuses others
  // beside it: they go only with an image.
  const bool from_image = snapshot.empty() && !daytona.image.empty();
  if (!snapshot.empty()) body["snapshot"] = snapshot;
  if (from_image) {
    body["buildInfo"] = {{"dockerfileContent", fmt::format("FROM {}\n", daytona.image)}};
    body["cpu"] = whole(spec.resources.cpus, 1.0);
    body["memory"] = whole(static_cast<double>(spec.resources.memory_bytes), kGiB);
    body["disk"] = whole(static_cast<double>(spec.resources.disk_bytes), kGiB);
  }

  auto created = client_.create_sandbox(body);
  if (!created) {
    // Did it happen anyway? Only an answer that never came leaves that open.
    const ErrorCode code = created.error().code;
    if (code != ErrorCode::kUnavailable && code != ErrorCode::kDeadlineExceeded) {
      return std::unexpected(created.error());
    }
    auto found = client_.list_sandboxes({{std::string(kCreateLabel), token}});
    if (!found || found->empty()) return std::unexpected(created.error());
    spdlog::warn("daytona: the answer to creating a sandbox was lost ({}); found it as {}",
                 created.error().message, found->front().value("id", "?"));
    created = std::move(found->front());
  }
  const std::string id = created->value("id", "");
  if (id.empty()) return make_error(ErrorCode::kInternal, "daytona: POST /sandbox gave no id");
  // A server that starts sandboxes in milliseconds (another quarry) answers with one started.
  auto started = created->value("state", "") == "started" ? Result<nlohmann::json>(*created)
                                                          : wait_started(id, spec.cancel_fd);
  if (!started) {
    discard(id, started.error());
    return std::unexpected(started.error());
  }
  if (auto url = parse_url(started->value("toolboxProxyUrl", "")); url) {
    std::lock_guard lock(mutex_);
    toolboxes_.insert_or_assign(id, *url);
  }
  SandboxInfo info = info_from(*started);
  info.labels = spec.labels;
  if (from_image) info.resources = spec.resources;
  info.network = spec.network;
  return info;
}

Result<void> DaytonaProvider::prepare(std::string_view id, const PrepareSpec& spec) {
  ASSIGN_OR_RETURN(auto url, toolbox(id));
  for (const auto& directory : spec.directories) {
    RETURN_IF_ERROR(client_.create_folder(url, id, directory, "755"));
  }
  return {};
}

Result<ExecResult> DaytonaProvider::exec(std::string_view id, const ExecRequest& request) {
  if (request.argv.empty()) {
    return make_error(ErrorCode::kInvalidArgument, "exec needs a command");
  }
  ASSIGN_OR_RETURN(auto url, toolbox(id));
  const double timeout_s = std::chrono::duration<double>(request.timeout).count();
  std::string command = fmt::format("python3 -I -S -c {} {} {} --", shell_quote(probe_source()),
                                    request.output_limit, timeout_s);
  for (const auto& arg : request.argv)
    command += " " + shell_quote(arg);
  // The probe keeps the command's timeout and answers after it; the daemon gets none (a server
  // may cap it below the command's: quarry's at sandbox.exec_timeout), and quarry waits for the
  // probe's answer a while longer than the timeout.
  const auto started = Clock::now();
  ASSIGN_OR_RETURN(auto executed,
                   client_.execute(url, id, command, request.working_directory, request.env, 0,
                                   request.timeout + std::chrono::seconds(30)));
  const double total_ms = std::chrono::duration<double, std::milli>(Clock::now() - started).count();
  ExecResult result;
  if (executed.timed_out) {
    result.exit_code = 137;
    result.signal = 9;
    result.timed_out = true;
    result.run_ms = total_ms;
  } else {
    ASSIGN_OR_RETURN(result, parse_probe_report(executed.result));
  }
  // The probe's clock for the command; the rest of the call is the provider's.
  result.run_ms = std::clamp(result.run_ms, 0.0, total_ms);
  result.overhead_ms = total_ms - result.run_ms;
  describe(result, request.timeout);
  if (request.on_output) {
    if (!result.stdout_text.empty()) request.on_output(OutputStream::kStdout, result.stdout_text);
    if (!result.stderr_text.empty()) request.on_output(OutputStream::kStderr, result.stderr_text);
  }
  return result;
}

Result<int> DaytonaProvider::stop_commands(std::string_view id) {
  ASSIGN_OR_RETURN(auto url, toolbox(id));
  // Every process group the probe listed as running.
  constexpr std::string_view kStop =
      "n=0; for f in /tmp/quarry-probe/*; do [ -f \"$f\" ] || continue; "
      "kill -KILL -\"$(cat \"$f\")\" 2>/dev/null && n=$((n+1)); rm -f \"$f\"; done; echo $n";
  ASSIGN_OR_RETURN(
      auto executed,
      client_.execute(url, id, fmt::format("sh -c {}", shell_quote(kStop)), "", {}, 30));
  return std::atoi(executed.result.c_str());
}

Result<void> DaytonaProvider::write_file(std::string_view id, std::string_view path,
                                         std::istream& content, int cancel_fd) {
  ASSIGN_OR_RETURN(auto url, toolbox(id));
  std::string data;
  char buffer[1 << 16];
  while (content.read(buffer, sizeof buffer) || content.gcount() > 0) {
    data.append(buffer, static_cast<size_t>(content.gcount()));
    if (data.size() > kMaxUpload) {
      return make_error(ErrorCode::kResourceExhausted,
                        "'{}' is larger than {}, the most one upload to a remote sandbox takes",
                        path, format_size(kMaxUpload));
    }
  }
  if (content.bad()) {
    return make_error(ErrorCode::kInternal, "reading what to write to '{}' failed", path);
  }
  return client_.upload(url, id, path, std::move(data), cancel_fd);
}

Result<uint64_t> DaytonaProvider::read_file(std::string_view id, std::string_view path,
                                            std::ostream& out, uint64_t max_bytes, int cancel_fd) {
  ASSIGN_OR_RETURN(auto url, toolbox(id));
  ASSIGN_OR_RETURN(auto data, client_.download(url, id, path, max_bytes, cancel_fd));
  out.write(data.data(), static_cast<std::streamsize>(data.size()));
  if (!out) return make_error(ErrorCode::kInternal, "writing '{}' out failed", path);
  return data.size();
}

Result<std::vector<FileInfo>> DaytonaProvider::list_files(std::string_view id,
                                                          std::string_view directory) {
  ASSIGN_OR_RETURN(auto url, toolbox(id));
  const auto deadline = Clock::now() + kListTime;
  std::vector<FileInfo> files;
  std::deque<std::pair<std::string, size_t>> pending = {{std::string(directory), 0}};
  while (!pending.empty()) {
    auto [path, depth] = std::move(pending.front());
    pending.pop_front();
    if (Clock::now() > deadline) {
      return make_error(ErrorCode::kResourceExhausted, "listing '{}' took longer than {} s",
                        directory, kListTime.count());
    }
    ASSIGN_OR_RETURN(auto entries, client_.list_files(url, id, path));
    if (!entries.is_array()) {
      return make_error(ErrorCode::kInternal, "daytona: listing '{}' gave no list", path);
    }
    for (const auto& entry : entries) {
      if (!entry.is_object()) continue;
      const std::string name = entry.value("name", "");
      if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos) {
        continue;
      }
      if (files.size() == kMaxListed) {
        return make_error(ErrorCode::kResourceExhausted, "'{}' holds more than {} entries",
                          directory, kMaxListed);
      }
      FileInfo file;
      file.path = path == "/" ? "/" + name : path + "/" + name;
      file.is_directory = entry.value("isDir", false);
      file.size = entry.value("size", uint64_t{0});
      file.allocated = file.size;
      file.modified_at = parse_time(entry.value("modTime", entry.value("modifiedAt", "")));
      if (file.is_directory) {
        if (depth + 1 >= kMaxDepth) {
          return make_error(ErrorCode::kResourceExhausted, "'{}' is nested deeper than {} levels",
                            directory, kMaxDepth);
        }
        pending.emplace_back(file.path, depth + 1);
      }
      files.push_back(std::move(file));
    }
  }
  return files;
}

Result<bool> DaytonaProvider::is_directory(std::string_view id, std::string_view path) {
  ASSIGN_OR_RETURN(auto url, toolbox(id));
  // The toolbox lists only a directory: 400 for anything else, 404 where nothing is.
  auto listed = client_.list_files(url, id, path);
  if (listed) return true;
  const ErrorCode code = listed.error().code;
  if (code == ErrorCode::kInvalidArgument || code == ErrorCode::kNotFound) return false;
  return std::unexpected(std::move(listed.error()));
}

Result<void> DaytonaProvider::destroy(std::string_view id) {
  Poll poll(config_.daytona.delete_timeout);
  // 409: a state change is in progress (it is still starting, say); Daytona takes the delete
  // once it is done.
  for (;;) {
    auto deleted = client_.delete_sandbox(id);
    if (deleted) break;
    if (deleted.error().code != ErrorCode::kAborted || poll.expired()) {
      return std::unexpected(deleted.error());
    }
    poll.wait();
  }
  {
    std::lock_guard lock(mutex_);
    if (auto known = toolboxes_.find(id); known != toolboxes_.end()) toolboxes_.erase(known);
  }
  // Deleting is asynchronous: gone once GET says 404 (or the state says destroyed).
  for (;;) {
    auto sandbox = client_.get_sandbox(id);
    if (!sandbox && sandbox.error().code == ErrorCode::kNotFound) return {};
    if (sandbox && sandbox->value("state", "") == "destroyed") return {};
    if (poll.expired()) {
      return make_error(ErrorCode::kDeadlineExceeded,
                        "daytona: sandbox {} was not gone {} after its delete (sandbox.daytona."
                        "delete_timeout)",
                        id, format_duration(config_.daytona.delete_timeout));
    }
    poll.wait();
  }
}

Result<bool> DaytonaProvider::is_alive(std::string_view id) {
  ASSIGN_OR_RETURN(auto sandbox, client_.get_sandbox(id));
  return sandbox.value("state", "") == "started";
}

Result<std::vector<SandboxInfo>> DaytonaProvider::find(const Labels& labels) {
  ASSIGN_OR_RETURN(auto sandboxes, client_.list_sandboxes(labels));
  std::vector<SandboxInfo> found;
  for (const auto& sandbox : sandboxes) {
    SandboxInfo info = info_from(sandbox);
    // The list is Daytona's to filter, but a server that ignores the filter must not make
    // quarry take another's sandboxes for its own.
    const bool matches = std::all_of(labels.begin(), labels.end(), [&](const auto& label) {
      auto it = info.labels.find(label.first);
      return it != info.labels.end() && it->second == label.second;
    });
    if (matches && !info.id.empty()) found.push_back(std::move(info));
  }
  return found;
}

}  // namespace quarry::sandbox::daytona

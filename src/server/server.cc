#include "server/server.h"

#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>

#include <condition_variable>
#include <thread>

#include "agent/model_client.h"
#include "common/file_util.h"
#include "common/units.h"
#include "conversation/artifact_files.h"
#include "conversation/open_history_store.h"
#include "sandbox/open_provider.h"
#include "server/api.h"
#include "server/auth.h"
#include "server/daytona/daytona_api.h"
#include "server/daytona/sandboxes.h"
#include "server/http_server.h"
#include "server/server_heartbeat.h"
#include "server/turn_runner.h"

namespace quarry::server {
namespace {

// How long shutdown waits for the requests taken before it (a handler waiting on a slow
// database, a file being sent) to be answered.
constexpr std::chrono::milliseconds kRequestsGrace{10'000};

// Deletes idle sandboxes every `interval` until stopped.
class Reaper {
 public:
  Reaper(conversation::ConversationManager& manager, std::chrono::milliseconds interval)
      : thread_([this, &manager, interval] {
          std::unique_lock lock(mutex_);
          while (!stop_.wait_for(lock, interval, [this] { return stopping_; })) {
            lock.unlock();
            if (auto reaped = manager.reap_idle(); !reaped) {
              spdlog::warn("deleting idle sandboxes failed: {}", reaped.error().message);
            } else if (*reaped > 0) {
              spdlog::info("deleted {} idle sandbox{}", *reaped, *reaped == 1 ? "" : "es");
            }
            lock.lock();
          }
        }) {}
  ~Reaper() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    stop_.notify_all();
    thread_.join();
  }

 private:
  std::mutex mutex_;
  std::condition_variable stop_;
  bool stopping_ = false;
  std::thread thread_;
};

// server.web_dir, else the UI built beside this executable (quarry-data, beside quarry):
// build/web for build/src/quarry-data, <prefix>/share/quarry/web for an installed
// <prefix>/bin/quarry-data.
std::filesystem::path web_directory(const Config& config) {
  if (!config.server.web_dir.empty()) return config.server.web_dir;
  std::error_code error;
  const auto executable = this_executable();
  for (const auto& candidate : {executable.parent_path().parent_path() / "web",
                                executable.parent_path().parent_path() / "share/quarry/web"}) {
    if (std::filesystem::exists(candidate / "index.html", error)) return candidate;
  }
  return executable.parent_path().parent_path() / "web";
}

std::string url_of(const tcp::endpoint& endpoint) {
  const auto address = endpoint.address();
  std::string host = address.to_string();
  if (address.is_unspecified()) host = address.is_v4() ? "127.0.0.1" : "::1";
  if (address.is_v6()) host = "[" + host + "]";
  return fmt::format("http://{}:{}", host, endpoint.port());
}

// Each client holds a descriptor (a watcher of a conversation's stream holds one for as long as
// it watches): take the whole hard limit the system allows, not the soft 1024.
void raise_descriptor_limit() {
  rlimit files{};
  if (::getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
    files.rlim_cur = files.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &files);
  }
}

}  // namespace

Result<void> serve(const Config& config, const ServeOptions& options) {
  ASSIGN_OR_RETURN(auto endpoint,
                   parse_listen_address(options.listen.value_or(config.server.listen)));
  const auto tokens_file = tokens_path(config, options.state_dir);
  std::error_code ignored;
  const bool with_tokens = std::filesystem::exists(tokens_file, ignored);
  if (!with_tokens && !config.server.tokens_file.empty()) {
    // Named but not there (a typo, a file not yet made): serving without sign-in would let in
    // whoever reaches the port.
    return make_error(ErrorCode::kFailedPrecondition,
                      "server.tokens_file in {} names '{}', which does not exist: create a "
                      "token with 'quarry token create NAME' (it makes the file), or remove "
                      "server.tokens_file to serve one user, 'local', on loopback",
                      config.source, tokens_file.string());
  }
  if (!with_tokens && !endpoint.address().is_loopback()) {
    return make_error(ErrorCode::kFailedPrecondition,
                      "refusing to listen on {} without API tokens: anyone who reaches the port "
                      "would act as the one user. Create a token with 'quarry token create NAME' "
                      "(it makes {}), or listen on 127.0.0.1",
                      url_of(endpoint), tokens_file.string());
  }

  raise_descriptor_limit();
  // A client or a model server that hangs up is an error of that one write, not the process's.
  ::signal(SIGPIPE, SIG_IGN);
  RETURN_IF_ERROR(make_directories(options.state_dir, 0755));
  ASSIGN_OR_RETURN(auto provider,
                   sandbox::open_provider(config, {options.state_dir, options.cache_dir}));
  SystemClock clock;
  ASSIGN_OR_RETURN(auto history, conversation::open_history_store(config.conversations,
                                                                  options.state_dir, clock));
  conversation::ConversationManager manager(*provider, *history, clock,
                                            conversation::manager_options(config));
  std::unique_ptr<agent::ModelClient> model;
  std::optional<std::string> model_unavailable;
  if (auto made = agent::make_model_client(config.model)) {
    model = std::move(*made);
  } else {
    model_unavailable = made.error().message;
    spdlog::warn("no language model: {}; questions are refused, cells still run",
                 *model_unavailable);
  }

  // With a shared history, the servers alive now keep their sandboxes, whatever their instance.
  conversation::ServerRegistry* registry = history->registry();
  const auto server_timeout =
      std::chrono::duration_cast<std::chrono::milliseconds>(config.conversations.server_timeout);
  std::vector<std::string> alive;
  if (registry) {
    ASSIGN_OR_RETURN(auto servers, registry->servers());
    for (const auto& server : servers) {
      if (server.silent_for <= server_timeout) alive.push_back(server.boot_id);
    }
  }
  ASSIGN_OR_RETURN(int orphans, manager.destroy_orphans(alive));
  if (orphans > 0) spdlog::info("destroyed {} sandboxes an earlier run left", orphans);
  StreamHub hub(*history);
  ASSIGN_OR_RETURN(auto interrupted, manager.finish_interrupted_turns());
  for (const auto& [conversation_id, turn] : interrupted) {
    RETURN_IF_ERROR(hub.end_interrupted(conversation_id, turn, conversation::kInterruptedReason));
  }

  TurnRunner turns(config, options.state_dir, *history, manager, model.get(), hub,
                   {config.server.workers, config.sandbox.output_limit_bytes});
  // Events other servers record wake this one's watchers, a cancel asked through another
  // server reaches the turn if it runs here (heard before any turn can start), another's
  // request for room may evict an idle sandbox here, and a conversation deleted through any
  // server takes this one's copies of its artifacts with it.
  std::unique_ptr<conversation::Subscription> heard_elsewhere;
  if (registry) {
    conversation::Listeners listeners;
    listeners.on_event = [&hub](const std::string& conversation_id, int turn, int64_t seq) {
      hub.heard(conversation_id, {turn, seq});
    };
    listeners.on_cancel = [&turns](const std::string& conversation_id, int turn) {
      // Another server's turn, or one ended meanwhile: nothing to do.
      (void)turns.cancel(conversation_id, "cancelled by the user", turn);
    };
    listeners.on_room = [&manager, registry](const conversation::RoomRequest& request) {
      // On this thread: an eviction takes a sandbox's destroy. Only the server that claims the
      // request evicts, so it costs one sandbox however many servers hear it.
      if (request.server == manager.boot_id()) return;
      (void)manager.scheduler().evict_for_elsewhere(request.user, [&] {
        auto claimed = registry->claim_room(request.id);
        if (!claimed) {
          spdlog::warn("could not answer another server's request for room: {}",
                       claimed.error().message);
        }
        return claimed && *claimed;
      });
    };
    listeners.on_deleted = [artifacts = options.state_dir / "artifacts"](const std::string& id) {
      if (auto removed = conversation::remove_artifacts(artifacts, id); !removed) {
        spdlog::warn(
            "conversation {} was deleted, but this server's copies of its artifacts "
            "were not: {}",
            id, removed.error().message);
      }
    };
    ASSIGN_OR_RETURN(heard_elsewhere, registry->listen(std::move(listeners)));
    // Listening now, so a delete from here on is heard: those made while this server was down
    // take their copies with them here.
    auto removed =
        conversation::remove_deleted_artifacts(options.state_dir / "artifacts", *registry);
    if (!removed) {
      spdlog::warn(
          "could not remove the artifacts of conversations deleted while this server "
          "was down: {}",
          removed.error().message);
    } else if (*removed > 0) {
      spdlog::info("removed the artifacts of {} conversation(s) deleted while this server was down",
                   *removed);
    }
  }
  Sessions sessions(
      clock, std::chrono::duration_cast<std::chrono::milliseconds>(config.server.session_lifetime));
  Authenticator auth(with_tokens ? std::make_unique<TokenStore>(tokens_file) : nullptr, sessions);
  Api api({config,
           options.state_dir,
           *history,
           manager,
           *provider,
           turns,
           hub,
           auth,
           sessions,
           {options.version, url_of(endpoint), config.server.max_body, config.server.workers,
            model_unavailable},
           web_directory(config)});

  // Sandboxes made through the Daytona-compatible API, each held from the scheduler like a
  // conversation's; idle ones past their autoStopInterval (stopped ones past their
  // autoDeleteInterval) are looked for every 10 s.
  daytona::Sandboxes daytona_sandboxes(manager.scheduler(), *provider, std::chrono::seconds(10));
  daytona::DaytonaApi daytona_api({config, daytona_sandboxes, *provider});

  net::io_context io(1);
  HttpServerOptions http_options;
  http_options.max_body = config.server.max_body;
  http_options.max_file_transfer = config.server.max_file_transfer;
  http_options.daytona_threads = config.server.workers;
  HttpServer http(io, api, &daytona_api, auth, hub, http_options);
  ASSIGN_OR_RETURN(auto listening, http.listen(endpoint));
  const std::string url = url_of(listening);
  std::optional<ServerHeartbeat> heartbeat;
  if (registry) {
    heartbeat.emplace(*registry, manager, hub,
                      conversation::ServerRecord{
                          manager.boot_id(), config.conversations.instance_id, url, {}, {}, {}},
                      server_timeout);
    RETURN_IF_ERROR(heartbeat->start());
  }
  // Recorded first, so the places this server takes go with its record if it dies. A turn that
  // only the others' sandboxes keep waiting asks them for room.
  if (auto* places = history->places(); places && registry) {
    manager.scheduler().share_limits(
        *places, manager.boot_id(), [registry, &manager](const std::string& user) {
          if (auto asked = registry->request_room(manager.boot_id(), user); !asked) {
            spdlog::warn("{}", asked.error().message);
          }
        });
  }
  // Caught from before the first sandbox and the first request: a SIGTERM as soon as the server
  // says it serves is a shutdown like any other, not the default action's exit.
  std::thread stopping;
  net::signal_set signals(io, SIGTERM, SIGINT);
  std::function<void(const boost::system::error_code&, int)> on_signal =
      [&](const boost::system::error_code& error, int signal) {
        if (error) return;
        if (stopping.joinable()) {
          spdlog::warn(
              "second signal: exiting now; sandboxes left behind are cleaned up at the "
              "next start");
          std::_Exit(128 + signal);
        }
        spdlog::info("{}: shutting down (running turns have {} to finish)",
                     signal == SIGTERM ? "SIGTERM" : "SIGINT",
                     format_duration(config.server.shutdown_grace));
        http.stop_accepting();
        // Waiting for turns blocks; the I/O thread goes on streaming their events meanwhile.
        stopping = std::thread([&] {
          turns.shutdown(
              std::chrono::duration_cast<std::chrono::milliseconds>(config.server.shutdown_grace));
          // Like every other sandbox of this run, those of the Daytona-compatible API go.
          if (const int deleted = daytona_sandboxes.shutdown(); deleted > 0) {
            spdlog::info("destroyed {} sandbox{} of the Daytona-compatible API", deleted,
                         deleted == 1 ? "" : "es");
          }
          if (auto deleted = manager.shutdown(); !deleted) {
            spdlog::error("destroying this run's sandboxes failed: {}", deleted.error().message);
          } else {
            spdlog::info("destroyed {} sandbox{}", *deleted, *deleted == 1 ? "" : "es");
          }
          if (heartbeat) heartbeat->leave();
          // Requests taken before the signal are answered before the loop stops.
          if (const int unanswered = http.wait_for_requests(kRequestsGrace); unanswered > 0) {
            spdlog::warn("{} request{} still unanswered after {}: their connections are closed",
                         unanswered, unanswered == 1 ? "" : "s", format_duration(kRequestsGrace));
          }
          net::post(io, [&] {
            hub.close();
            // Streams write their last chunk; then the loop ends.
            auto last = std::make_shared<net::steady_timer>(io, std::chrono::milliseconds(200));
            last->async_wait([&io, last](const boost::system::error_code&) { io.stop(); });
          });
        });
        signals.async_wait(on_signal);
      };
  signals.async_wait(on_signal);
  manager.scheduler().start_pool();
  http.start();
  spdlog::info("serving on {} ({}; model: {})", url,
               with_tokens ? fmt::format("tokens from {}", tokens_file.string())
                           : "no tokens: loopback only, one user 'local'",
               model ? config.model.name : "none");
  if (options.on_listening) options.on_listening(url);

  Reaper reaper(
      manager,
      std::clamp<std::chrono::milliseconds>(
          std::chrono::duration_cast<std::chrono::milliseconds>(config.sandbox.idle_timeout / 4),
          std::chrono::seconds(1), std::chrono::seconds(60)));

  io.run();
  if (stopping.joinable()) stopping.join();
  http.join();
  spdlog::info("stopped");
  return {};
}

}  // namespace quarry::server

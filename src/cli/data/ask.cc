// quarry ask "QUESTION" [--conversation ID], as it runs (the options: ask_command.cc): one turn
// of the agent, streamed to the terminal.
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <iostream>

#include "agent/agent.h"
#include "agent/guidance.h"
#include "agent/model_client.h"
#include "cli/cancel_signals.h"
#include "cli/data/data_room.h"
#include "common/json.h"
#include "common/units.h"
#include "data/database.h"

namespace quarry::cli {
namespace {

// A one-line view of a tool call for the terminal: what it is about, not its full arguments.
std::string describe_call(const agent::AgentEvent& event) {
  auto arguments = parse_json_or_discarded(event.arguments);
  auto text = [&](const char* key) -> std::string {
    if (!arguments.is_object() || !arguments.contains(key) || !arguments[key].is_string()) {
      return "";
    }
    std::string value = arguments[key];
    for (auto& c : value)
      c = (c == '\n' || c == '\t') ? ' ' : c;
    return value.size() > 90 ? value.substr(0, 87) + "..." : value;
  };
  if (event.tool == "run_python") {
    if (!text("path").empty()) return fmt::format("run_python {}", text("path"));
    const std::string code = arguments.value("code", "");
    return fmt::format("run_python ({} lines of code)",
                       std::count(code.begin(), code.end(), '\n') + 1);
  }
  if (event.tool == "export_query") {
    return fmt::format("export_query {}: {}", text("filename"), text("sql"));
  }
  if (event.tool == "query_database") return fmt::format("query_database: {}", text("sql"));
  if (event.tool == "write_file") {
    return fmt::format("write_file {} ({} bytes)", text("path"),
                       arguments.is_object() ? arguments.value("content", "").size() : 0);
  }
  return event.tool;
}

// What a command printed, indented under its step; long output keeps its first lines.
void print_indented(std::string_view text) {
  constexpr int kMaxLines = 20;
  int lines = 0;
  while (!text.empty()) {
    auto newline = text.find('\n');
    if (++lines > kMaxLines) {
      std::cout << "    ...\n";
      return;
    }
    std::cout << "    " << text.substr(0, newline) << "\n";
    if (newline == std::string_view::npos) break;
    text.remove_prefix(newline + 1);
  }
}

// The first line of a tool result, for steps other than run_python.
std::string first_line(const std::string& text) {
  auto line = text.substr(0, text.find('\n'));
  return line.size() > 110 ? line.substr(0, 107) + "..." : line;
}

class Printer {
 public:
  void operator()(const agent::AgentEvent& event) {
    using Kind = agent::AgentEvent::Kind;
    switch (event.kind) {
      case Kind::kText:
        if (event.text.empty()) break;
        std::cout << event.text << std::flush;
        in_text_ = event.text.back() != '\n';
        break;
      case Kind::kToolCall:
        end_text();
        std::cout << "[" << describe_call(event) << "]" << std::endl;
        break;
      case Kind::kToolResult: {
        const auto& result = *event.result;
        if (result.exec) {
          const auto& r = *result.exec;
          std::cout << fmt::format("  {} exit {} · {} · CPU {} · peak {} of {}{}\n",
                                   result.ok ? "ok" : "failed:", r.exit_code,
                                   format_elapsed(r.run_ms), format_elapsed(r.cpu_ms),
                                   format_size(r.peak_memory_bytes),
                                   format_size(r.memory_limit_bytes),
                                   r.oom         ? " · out of memory"
                                   : r.timed_out ? " · timed out"
                                                 : "");
          print_indented(r.stdout_text);
          if (!result.ok) {
            print_indented(r.stderr_text);
            std::cout << "  " << agent::describe(result.failure) << "\n";
          }
        } else {
          std::cout << fmt::format("  {} {}\n",
                                   result.ok ? "ok" : "failed:", first_line(result.content));
        }
        std::cout << std::flush;
        break;
      }
      case Kind::kArtifact:
        std::cout << fmt::format("  saved {} ({}, {}): {}\n", event.artifact->name,
                                 event.artifact->type, format_size(event.artifact->size_bytes),
                                 event.artifact->location)
                  << std::flush;
        break;
      case Kind::kDone:
        end_text();
        break;
      case Kind::kError:
        end_text();
        break;              // reported by the caller
      case Kind::kOutput:   // shown with the step's result, up to its first lines
      case Kind::kSandbox:  // in the history: quarry conversations show --events
        break;
    }
  }

 private:
  void end_text() {
    if (in_text_) std::cout << std::endl;
    in_text_ = false;
  }
  bool in_text_ = false;
};

}  // namespace

int DataRoom::ask(Context& context, const AskOptions& options) {
  ASSIGN_OR_RETURN_CLI(const Config* config, context.config());
  ASSIGN_OR_RETURN_CLI(auto* provider, context.provider());
  ASSIGN_OR_RETURN_CLI(auto* history, context.history());
  ASSIGN_OR_RETURN_CLI(auto database,
                       data::resolve_database(config->database, context.state_dir()));
  ASSIGN_OR_RETURN_CLI(auto model, agent::make_model_client(config->model));

  SystemClock clock;
  conversation::ConversationManager manager(*provider, *history, clock,
                                            conversation::manager_options(*config));
  // No server keeps time here, so each ask deletes the sandboxes that have idled too long.
  if (auto reaped = manager.reap_idle(); !reaped) return report(reaped.error());

  std::string id = options.conversation_id;
  if (id.empty()) {
    // Named by its first question when the turn begins.
    for (const auto& package : options.packages) {
      if (!valid_package_requirement(package)) {
        return report(Error{ErrorCode::kInvalidArgument,
                            fmt::format("--package: '{}' is not a package requirement (e.g. "
                                        "tabulate or tabulate==0.9.0)",
                                        package)});
      }
    }
    ASSIGN_OR_RETURN_CLI(
        auto created,
        history->create_conversation("", conversation::kLocalUser, std::nullopt, options.packages));
    id = created.id;
  }

  agent::Toolbox toolbox({*config, database, *history, context.state_dir()});
  auto runtime = manager.sandbox_runtime();
  agent::Agent agent(
      model.get(), manager, *history, toolbox,
      agent::system_prompt(*config, runtime ? std::optional(*runtime) : std::nullopt),
      agent::agent_options(*config));

  // The turn stops on Ctrl-C, or when its lock goes (a history in PostgreSQL whose session
  // ended): another turn could then begin on the conversation, through a server, and take this
  // one's commands for the remains of a dead process.
  CancelSignals cancel;
  UniqueFd lock_lost(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  UniqueFd stop(::epoll_create1(EPOLL_CLOEXEC));
  if (!lock_lost || !stop) return report(errno_error("setting up the turn's cancel").error());
  for (int fd : {cancel.fd(), lock_lost.get()}) {
    epoll_event watched{};
    watched.events = EPOLLIN;
    if (::epoll_ctl(stop.get(), EPOLL_CTL_ADD, fd, &watched) != 0) {
      return report(errno_error("setting up the turn's cancel").error());
    }
  }
  Printer printer;
  Result<std::string> answer = make_error(ErrorCode::kInternal, "the turn did not run");
  int number = 0;
  try {
    ASSIGN_OR_RETURN_CLI(auto turn, manager.begin_turn(id, conversation::TurnKind::kAsk, {}));
    number = turn->number();
    turn->on_lock_lost([fd = lock_lost.get()] {
      const uint64_t one = 1;
      (void)!::write(fd, &one, sizeof one);
    });
    answer = agent.run_turn(*turn, options.question, std::ref(printer), stop.get());
  } catch (const std::exception& error) {
    // As the server does: the turn is recorded failed (its end, unwinding), and said so here
    // rather than by std::terminate.
    answer = make_error(ErrorCode::kInternal, "quarry failed: {}", error.what());
  }
  std::cerr << fmt::format("conversation {} (continue with: quarry ask --conversation {} ...)\n",
                           id, id);
  if (!answer) {
    uint64_t lost = 0;
    if (answer.error().code == ErrorCode::kCancelled &&
        ::read(lock_lost.get(), &lost, sizeof lost) == sizeof lost) {
      // The agent recorded "cancelled"; the history says why.
      (void)history->finish_turn(id, number, conversation::TurnStatus::kCancelled,
                                 std::string(conversation::kTurnLockLost));
      std::cerr << "quarry: " << conversation::kTurnLockLost << "\n";
      return 1;
    }
    if (answer.error().code == ErrorCode::kCancelled) {
      std::cerr << "quarry: cancelled\n";
      return kCancelledExit;
    }
    return report(answer.error());
  }
  return 0;
}

}  // namespace quarry::cli

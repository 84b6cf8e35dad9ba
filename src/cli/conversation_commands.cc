// quarry conversations ls | show
#include <iostream>
#include <map>

#include "cli/commands.h"
#include "common/units.h"
#include "conversation/artifact_files.h"
#include "conversation/conversation_manager.h"
#include "conversation/history_json.h"
#include "sandbox/metering.h"

namespace quarry::cli {
namespace {

using conversation::Conversation;
using conversation::Event;
using conversation::ExecRecord;
using conversation::Message;

struct ConversationOptions final : CommandGroup {
  bool ls_json = false;
  std::string show_id;
  bool show_events = false;
  bool show_json = false;
};

std::string local_time(Clock::time_point time) {
  auto seconds = std::chrono::system_clock::to_time_t(time);
  std::tm parts{};
  ::localtime_r(&seconds, &parts);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%d %H:%M:%S", &parts);
  return text;
}

// One line of at most `width` characters, for a terminal summary.
std::string one_line(std::string_view text, size_t width) {
  std::string line;
  for (char c : text)
    line += (c == '\n' || c == '\r' || c == '\t') ? ' ' : c;
  if (line.size() > width) line = line.substr(0, width - 3) + "...";
  return line;
}

std::string exec_line(const sandbox::ExecResult& r) {
  std::string line = fmt::format("exit {}, run {}, cpu {}, peak {} of {}, overhead {}", r.exit_code,
                                 format_elapsed(r.run_ms), format_elapsed(r.cpu_ms),
                                 format_size(r.peak_memory_bytes),
                                 format_size(r.memory_limit_bytes), format_elapsed(r.overhead_ms));
  if (r.oom) line += ", OOM";
  if (r.timed_out) line += ", timed out";
  return line;
}

int show(conversation::HistoryStore& history, const std::filesystem::path& state_dir,
         const ConversationOptions& options) {
  auto conversation = history.conversation(options.show_id);
  if (!conversation) return report(conversation.error());
  auto messages = history.messages(conversation->id);
  auto events = history.events(conversation->id);
  auto execs = history.execs(conversation->id);
  auto artifacts = history.artifacts(conversation->id);
  auto reference = history.sandbox_reference(conversation->id);
  for (const Error* error :
       {messages ? nullptr : &messages.error(), events ? nullptr : &events.error(),
        execs ? nullptr : &execs.error(), artifacts ? nullptr : &artifacts.error(),
        reference ? nullptr : &reference.error()}) {
    if (error) return report(*error);
  }

  if (options.show_json) {
    auto document = conversation::conversation_document(history, conversation->id);
    if (!document) return report(document.error());
    // Say where each artifact's file is on this machine, when it is here. One that another
    // server sharing the history collected is written here only when this server serves it:
    // showing a conversation copies nothing.
    for (auto& artifact : (*document)["artifacts"]) {
      for (const auto& a : *artifacts) {
        if (a.id != artifact["id"]) continue;
        auto file = conversation::local_artifact_file(state_dir / "artifacts", conversation->id, a);
        if (!file) return report(file.error());
        if (*file) artifact["path"] = (*file)->string();
      }
    }
    std::cout << document->dump(2, ' ', false, nlohmann::json::error_handler_t::replace)
              << std::endl;
    return 0;
  }

  std::cout << fmt::format(
      "conversation {} \"{}\": {} turns, sandbox {}{}\n", conversation->id, conversation->title,
      conversation->turns, reference->state,
      reference->sandbox_id.empty() ? "" : fmt::format(" ({})", reference->sandbox_id));
  // Everything of one turn in the order it happened: messages, commands and (with --events)
  // what happened to the sandbox.
  struct Line {
    Clock::time_point at;
    int64_t order;
    std::string text;
  };
  std::map<int, std::vector<Line>> turns;
  int64_t order = 0;
  for (const auto& m : *messages) {
    std::string text = m.content;
    if (m.tool_calls.is_array()) {
      for (const auto& call : m.tool_calls) {
        text += fmt::format(" [calls {}]", call.value("name", "?"));
      }
    }
    turns[m.turn].push_back(
        {m.created_at, order++,
         fmt::format("{:<9} {}", conversation::to_string(m.role), one_line(text, 100))});
  }
  for (const auto& x : *execs) {
    turns[x.turn].push_back({x.started_at, order++,
                             fmt::format("{:<9} {}\n{:<9}   {}", "exec", one_line(x.command, 100),
                                         "", exec_line(x.result))});
  }
  if (options.show_events) {
    for (const auto& e : *events) {
      std::string text = e.kind == "state" ? fmt::format("{} -> {}", e.details.value("from", "?"),
                                                         e.details.value("to", "?"))
                                           : e.kind;
      if (!e.reason.empty()) text += fmt::format(" ({})", e.reason);
      if (!e.sandbox_id.empty()) text += fmt::format(" sandbox {}", e.sandbox_id);
      turns[e.turn].push_back({e.created_at, order++, fmt::format("{:<9} {}", "event", text)});
    }
  }
  for (const auto& a : *artifacts) {
    turns[a.turn].push_back(
        {a.created_at, order++,
         fmt::format("{:<9} {} ({}, {})", "artifact", a.name, a.type, format_size(a.size_bytes))});
  }
  for (auto& [turn, lines] : turns) {
    std::stable_sort(lines.begin(), lines.end(), [](const Line& a, const Line& b) {
      return a.at != b.at ? a.at < b.at : a.order < b.order;
    });
    std::cout << fmt::format("\nturn {}\n", turn);
    for (const auto& line : lines)
      std::cout << "  " << line.text << "\n";
  }
  return 0;
}

}  // namespace

std::unique_ptr<CommandGroup> add_conversation_commands(CLI::App& group, Context& context,
                                                        int& exit_code, DataCommands&) {
  auto options = std::make_unique<ConversationOptions>();
  auto& opts = *options;
  group.require_subcommand(1);

  auto* ls = group.add_subcommand("ls", "list conversations, most recent first");
  ls->add_flag("--json", opts.ls_json, "print a JSON array");
  ls->callback([&] {
    auto history = context.history();
    if (!history) return void(exit_code = report(history.error()));
    auto list = (*history)->conversations();
    if (!list) return void(exit_code = report(list.error()));
    auto references = (*history)->sandbox_references();
    if (!references) return void(exit_code = report(references.error()));
    // One query for every conversation's sandbox; one without a row never had one ("new").
    std::map<std::string, conversation::SandboxReference> sandbox_of(references->begin(),
                                                                     references->end());
    auto state_of = [&](const std::string& id) { return sandbox_of[id].state; };
    if (opts.ls_json) {
      nlohmann::json json = nlohmann::json::array();
      for (const auto& conversation : *list) {
        auto entry = conversation::to_json(conversation);
        entry["sandbox_state"] = state_of(conversation.id);
        json.push_back(std::move(entry));
      }
      std::cout << json.dump(2) << std::endl;
      return;
    }
    std::cout << fmt::format("{:<14}{:<7}{:<10}{:<21}{}\n", "ID", "TURNS", "SANDBOX", "UPDATED",
                             "TITLE");
    for (const auto& conversation : *list) {
      std::cout << fmt::format("{:<14}{:<7}{:<10}{:<21}{}\n", conversation.id, conversation.turns,
                               state_of(conversation.id), local_time(conversation.updated_at),
                               one_line(conversation.title, 60));
    }
  });

  auto* show_command =
      group.add_subcommand("show", "a conversation: messages and exec metrics, by turn");
  show_command->add_option("id", opts.show_id, "conversation id")->required();
  show_command->add_flag("--events", opts.show_events,
                         "also show what happened to its sandbox (created, died, replaced, ...)");
  show_command->add_flag("--json", opts.show_json,
                         "print everything (messages, events, execs, artifacts) as JSON");
  auto* reap = group.add_subcommand(
      "reap",
      "delete the sandboxes of conversations idle longer than sandbox.idle_timeout "
      "(quarry ask does this too; run it from cron when nothing else will)");
  reap->callback([&] {
    // The history first: for a PostgreSQL one quarry hands the command over right there.
    auto history = context.history();
    if (!history) return void(exit_code = report(history.error()));
    auto config = context.config();
    if (!config) return void(exit_code = report(config.error()));
    auto provider = context.provider();
    if (!provider) return void(exit_code = report(provider.error()));
    SystemClock clock;
    conversation::ConversationManager manager(**provider, **history, clock,
                                              conversation::manager_options(**config));
    auto reaped = manager.reap_idle();
    if (!reaped) return void(exit_code = report(reaped.error()));
    std::cout << fmt::format("deleted {} idle sandbox{}\n", *reaped, *reaped == 1 ? "" : "es");
  });

  show_command->callback([&] {
    auto history = context.history();
    if (!history) return void(exit_code = report(history.error()));
    exit_code = show(**history, context.state_dir(), opts);
  });
  return options;
}

}  // namespace quarry::cli

// quarry ask "QUESTION" [--conversation ID]: what it parses. What it does is in data/ask.cc
// (quarry-data; data_commands.h).
#include "cli/data_commands.h"

namespace quarry::cli {

std::unique_ptr<CommandGroup> add_ask_command(CLI::App& app, Context& context, int& exit_code,
                                              DataCommands& data) {
  auto options = std::make_unique<AskOptions>();
  auto* command = app.add_subcommand(
      "ask", "ask the agent a question about the data; streams its work and answer");
  command->add_option("question", options->question, "the question")->required();
  command->add_option("--conversation", options->conversation_id,
                      "continue this conversation (default: start a new one)");
  command->callback(
      [&context, &exit_code, &data, &opts = *options] { exit_code = data.ask(context, opts); });
  return options;
}

}  // namespace quarry::cli

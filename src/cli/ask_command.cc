// quarry ask "QUESTION" [--conversation ID | --package REQ...]: what it parses. What it does is in
// data/ask.cc (quarry-data; data_commands.h).
#include "cli/data_commands.h"

namespace quarry::cli {

std::unique_ptr<CommandGroup> add_ask_command(CLI::App& command, Context& context, int& exit_code,
                                              DataCommands& data) {
  auto options = std::make_unique<AskOptions>();
  command.add_option("question", options->question, "the question")
      ->required()
      ->check(CLI::Validator(
          [](const std::string& question) -> std::string {
            if (question.find_first_not_of(" \t\r\n") != std::string::npos) return "";
            return "is empty: write a question, e.g. quarry ask \"Which pages were viewed most?\"";
          },
          "QUESTION"));
  auto* conversation = command.add_option("--conversation", options->conversation_id,
                                          "continue this conversation (default: start a new one)");
  command
      .add_option("--package", options->packages,
                  "an extra Python package for a new conversation's sandboxes, e.g. "
                  "tabulate==0.9.0 (repeatable)")
      ->allow_extra_args(false)
      ->excludes(conversation);
  command.callback(
      [&context, &exit_code, &data, &opts = *options] { exit_code = data.ask(context, opts); });
  return options;
}

}  // namespace quarry::cli

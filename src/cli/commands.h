// The command line: its command groups, one file each, and the function both executables run.
#pragma once

#include <CLI/CLI.hpp>
#include <memory>

#include "cli/context.h"

namespace quarry::cli {

// A group of subcommands, or a single command: each add_* function below fills in the
// subcommand `run` made for it (its name and description are in cli.cc, so that `quarry --help`
// lists every command while only the one argv names is built). It holds the options CLI11 parses
// into, so it must outlive app.parse(); its callbacks set `exit_code`.
// The exit status of a command line that could not be parsed, as most command-line tools give.
inline constexpr int kUsageExit = 2;

class CommandGroup {
 public:
  virtual ~CommandGroup() = default;
  // The exit status of a command line of this group that could not be parsed: kUsageExit,
  // unless the command passes on another program's exit statuses.
  virtual int usage_exit() const { return kUsageExit; }
};

// Runs db, ask and serve (data_commands.h).
class DataCommands;

// The command line of both executables, from this one definition: the global options and every
// command group, in the order `quarry --help` lists them; parses argv, runs the command and
// returns the exit status. `data` runs the commands of the data room.
int run(int argc, char** argv, DataCommands& data);

std::unique_ptr<CommandGroup> add_sandbox_commands(CLI::App& group, Context& context,
                                                   int& exit_code, DataCommands& data);
std::unique_ptr<CommandGroup> add_snapshot_commands(CLI::App& group, Context& context,
                                                    int& exit_code, DataCommands& data);
std::unique_ptr<CommandGroup> add_image_commands(CLI::App& group, Context& context, int& exit_code,
                                                 DataCommands& data);
std::unique_ptr<CommandGroup> add_ask_command(CLI::App& command, Context& context, int& exit_code,
                                              DataCommands& data);
std::unique_ptr<CommandGroup> add_conversation_commands(CLI::App& group, Context& context,
                                                        int& exit_code, DataCommands& data);
std::unique_ptr<CommandGroup> add_db_commands(CLI::App& group, Context& context, int& exit_code,
                                              DataCommands& data);
std::unique_ptr<CommandGroup> add_serve_command(CLI::App& command, Context& context, int& exit_code,
                                                DataCommands& data);
std::unique_ptr<CommandGroup> add_token_commands(CLI::App& group, Context& context, int& exit_code,
                                                 DataCommands& data);

}  // namespace quarry::cli

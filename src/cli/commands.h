// The command groups of the quarry CLI, one file each.
#pragma once

#include <CLI/CLI.hpp>
#include <memory>

#include "cli/context.h"

namespace quarry::cli {

// A group of subcommands. It holds the options CLI11 parses into, so it must outlive
// app.parse(); its callbacks set `exit_code`.
class CommandGroup {
 public:
  virtual ~CommandGroup() = default;
};

std::unique_ptr<CommandGroup> add_sandbox_commands(CLI::App& app, Context& context, int& exit_code);
std::unique_ptr<CommandGroup> add_image_commands(CLI::App& app, Context& context, int& exit_code);
std::unique_ptr<CommandGroup> add_ask_command(CLI::App& app, Context& context, int& exit_code);
std::unique_ptr<CommandGroup> add_conversation_commands(CLI::App& app, Context& context,
                                                        int& exit_code);
std::unique_ptr<CommandGroup> add_db_commands(CLI::App& app, Context& context, int& exit_code);
std::unique_ptr<CommandGroup> add_serve_command(CLI::App& app, Context& context, int& exit_code);
std::unique_ptr<CommandGroup> add_token_commands(CLI::App& app, Context& context, int& exit_code);

}  // namespace quarry::cli

// The command groups of the quarry CLI, one file each.
#pragma once

#include <CLI/CLI.hpp>

#include "cli/context.h"

namespace quarry::cli {

// Each adds its subcommands to `app`; the callbacks set `exit_code`.
void add_sandbox_commands(CLI::App& app, Context& context, int& exit_code);
void add_image_commands(CLI::App& app, Context& context, int& exit_code);
void add_db_commands(CLI::App& app, Context& context, int& exit_code);

}  // namespace quarry::cli

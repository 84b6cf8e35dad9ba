// Runs an external program (debootstrap, pip, mkfs) and reports its output line by line.
#pragma once

#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/error.h"

namespace quarry {

struct CommandOptions {
  // Replaces the environment when set; otherwise the child inherits ours.
  std::optional<std::map<std::string, std::string>> environment;
  std::filesystem::path working_directory;
  // Called for each line the program prints on stdout or stderr (merged).
  std::function<void(std::string_view line)> on_line;
  // How errors name the command ("pip download"); the whole argv when empty.
  std::string name;
  // Readable once the command is to stop (a signalfd for Ctrl-C, a cancelled turn's eventfd):
  // it is killed, and run_command fails with kCancelled. -1 for none. Not read, only polled.
  int cancel_fd = -1;
};

struct CommandOutput {
  int exit_code = 0;
  std::string output;  // stdout and stderr merged, last 64 KiB
};

// Runs argv[0] (searched in PATH) and waits. A nonzero exit is an error whose message names the
// command (options.name, else argv), its exit status and the last lines it printed; a cancel
// (options.cancel_fd) is kCancelled.
Result<CommandOutput> run_command(const std::vector<std::string>& argv,
                                  const CommandOptions& options = {});

// Returns the full path of `program` if it is found in PATH.
std::optional<std::filesystem::path> find_program(std::string_view program);

// The last `lines` lines of `output` without its final newline, for error messages.
std::string tail_lines(std::string_view output, size_t lines);

}  // namespace quarry

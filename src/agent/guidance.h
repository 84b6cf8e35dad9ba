// The system prompt: who the agent is, its tools, where files go, and the execution guidance
// of seed 002 (SQL first, only needed columns, Polars for transforms, DuckDB for large data,
// rewrite after an OOM instead of rerunning).
#pragma once

#include <optional>
#include <string>

#include "config/config.h"
#include "sandbox/provider.h"

namespace quarry::agent {

// `runtime`: what the sandboxes run (the image's Python and package versions), so the model
// writes code for those versions; without it the prompt names the configured packages only.
std::string system_prompt(const Config& config, const std::optional<sandbox::Runtime>& runtime);

// What the system prompt adds for a conversation started with extra packages (empty for none).
std::string extra_packages_text(const std::vector<std::string>& packages);

}  // namespace quarry::agent

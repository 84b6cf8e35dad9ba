// The system prompt: who the agent is, its tools, where files go, and the execution guidance
// of seed 002 (SQL first, only needed columns, Polars for transforms, DuckDB for large data,
// rewrite after an OOM instead of rerunning).
#pragma once

#include <string>

#include "config/config.h"

namespace quarry::agent {

std::string system_prompt(const Config& config);

}  // namespace quarry::agent

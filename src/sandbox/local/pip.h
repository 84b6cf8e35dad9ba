// The host's pip, fetching wheels for a sandbox image's Python rather than for the host:
// resolving requirements into a lock, and downloading exactly what a lock pins. Sandboxes have
// no network, so every wheel they install comes through here into <cache>/wheels; pip runs with
// the host's configuration (its index, PIP_* settings).
#pragma once

#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.h"
#include "common/progress.h"
#include "sandbox/local/python_lock.h"

namespace quarry::sandbox::local {

// The wheels of every package `lock` pins (package name -> file), from `wheels_dir` or
// downloaded there by their pins and hashes, so pip resolves nothing and refuses a file whose
// hash the lock does not list. `source` names the lock in errors; `relock` says how to lock
// again when the index serves other files now ("run quarry image lock"). pip is stopped, and
// this fails with kCancelled, once `cancel_fd` (-1: none) is readable; so for resolving.
Result<std::map<std::string, std::filesystem::path>> fetch_locked_wheels(
    const PythonLock& lock, std::string_view source, std::string_view relock,
    const std::filesystem::path& wheels_dir, Progress& progress, int cancel_fd = -1);

// Resolves `requirements` for Python `python` (the newest versions they allow) and locks what
// pip chose; its wheels are moved into `wheels_dir`. `constraints` are name==version pins pip
// must keep (the packages an image has already), passed as a constraints file.
Result<PythonLock> resolve_requirements(const std::vector<std::string>& requirements,
                                        const std::string& python,
                                        const std::vector<std::string>& constraints,
                                        const std::filesystem::path& wheels_dir, Progress& progress,
                                        int cancel_fd = -1);

}  // namespace quarry::sandbox::local

// A wheel of the tests' own: quarry-probe, a pure-Python package that says its version, for a
// package index in a directory (pip reads it through its ordinary settings, PIP_NO_INDEX and
// PIP_FIND_LINKS), so no test needs the network.
#pragma once

#include <filesystem>
#include <string_view>

#include "common/error.h"

namespace quarry::testing {

// Writes quarry_probe-VERSION-py3-none-any.whl into `directory` (the same bytes every time) and
// returns its path. `import quarry_probe; quarry_probe.__version__` is VERSION.
Result<std::filesystem::path> make_probe_wheel(const std::filesystem::path& directory,
                                               std::string_view version);

}  // namespace quarry::testing

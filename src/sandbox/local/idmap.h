// The image seen with a sandbox's own ids. The image's files belong to one host range
// (kSandboxIdBase..); each sandbox runs in a range of its own, so its overlay's lower layer is
// an idmapped mount of the image that shows those files as that range's. Nothing is copied or
// chowned: the mapping is applied by the kernel as files are looked at.
#pragma once

#include <cstdint>
#include <filesystem>

#include "common/error.h"
#include "common/unique_fd.h"

namespace quarry::sandbox::local {

// A detached mount of `directory` (open_tree) on which host ids [from, from + count) appear as
// [to, to + count), ready to be attached with move_mount (init does so in its own mount
// namespace). Needs Linux 5.12 for the mount, 5.19 for overlayfs to take it as a layer.
Result<UniqueFd> idmapped_tree(const std::filesystem::path& directory, uint32_t from, uint32_t to,
                               uint32_t count);

}  // namespace quarry::sandbox::local

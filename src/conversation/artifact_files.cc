#include "conversation/artifact_files.h"

#include <algorithm>
#include <cctype>

#include "common/file_util.h"
#include "common/sha256.h"
#include "conversation/history_columns.h"

namespace quarry::conversation {
namespace {

// A directory name for a tool call id, which the model chose: used as it is when it is plainly
// safe, else replaced by a hash, so no id can point outside the store.
std::string step_directory(std::string_view call_id) {
  const bool plain = !call_id.empty() && call_id.size() <= 64 &&
                     std::all_of(call_id.begin(), call_id.end(), [](unsigned char c) {
                       return std::isalnum(c) || c == '_' || c == '-';
                     });
  if (plain) return std::string(call_id);
  return call_id.empty() ? "_" : "call-" + sha256_hex(call_id).substr(0, 16);
}

}  // namespace

Result<std::filesystem::path> artifact_path(const std::filesystem::path& store_dir,
                                            std::string_view conversation_id,
                                            const Artifact& artifact) {
  if (!valid_conversation_id(conversation_id)) {
    return make_error(ErrorCode::kInvalidArgument, "bad conversation id '{}'", conversation_id);
  }
  // The name is the file's path under the output directory, as the sandbox's provider listed
  // it; the history is read by every server, so neither is trusted to stay inside the store.
  const std::filesystem::path name(artifact.name);
  bool inside = !artifact.name.empty() && name.is_relative();
  for (const auto& part : name) {
    inside = inside && part != ".." && part != "." && !part.empty();
  }
  if (!inside) {
    return make_error(ErrorCode::kInvalidArgument,
                      "the artifact name '{}' is not a path inside the output directory",
                      artifact.name);
  }
  // Each step has a directory of its own, so two steps writing chart.png keep both.
  return store_dir / conversation_id / std::to_string(artifact.turn) /
         step_directory(artifact.tool_call_id) / name;
}

Result<std::optional<std::filesystem::path>> artifact_file(const std::filesystem::path& store_dir,
                                                           HistoryStore& history,
                                                           std::string_view conversation_id,
                                                           const Artifact& artifact) {
  ASSIGN_OR_RETURN(auto path, artifact_path(store_dir, conversation_id, artifact));
  std::error_code error;
  if (std::filesystem::is_regular_file(path, error)) return path;
  ASSIGN_OR_RETURN(const bool restored, history.restore_artifact(artifact.id, path));
  if (restored) return path;
  if (!artifact.location.empty() && std::filesystem::is_regular_file(artifact.location, error)) {
    return std::filesystem::path(artifact.location);
  }
  return std::nullopt;
}

Result<std::optional<std::filesystem::path>> local_artifact_file(
    const std::filesystem::path& store_dir, std::string_view conversation_id,
    const Artifact& artifact) {
  ASSIGN_OR_RETURN(auto path, artifact_path(store_dir, conversation_id, artifact));
  std::error_code error;
  if (std::filesystem::is_regular_file(path, error)) return path;
  if (!artifact.location.empty() && std::filesystem::is_regular_file(artifact.location, error)) {
    return std::filesystem::path(artifact.location);
  }
  return std::nullopt;
}

Result<void> remove_artifacts(const std::filesystem::path& store_dir,
                              std::string_view conversation_id) {
  if (!valid_conversation_id(conversation_id)) {
    return make_error(ErrorCode::kInvalidArgument, "bad conversation id '{}'", conversation_id);
  }
  return remove_tree(store_dir / conversation_id);
}

}  // namespace quarry::conversation

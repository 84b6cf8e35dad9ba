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

Result<int> remove_deleted_artifacts(const std::filesystem::path& store_dir,
                                     ServerRegistry& registry) {
  std::vector<std::string> stored;
  std::error_code error;
  if (!std::filesystem::exists(store_dir, error)) return 0;
  for (const auto& entry : std::filesystem::directory_iterator(store_dir, error)) {
    std::string id = entry.path().filename().string();
    if (valid_conversation_id(id)) stored.push_back(std::move(id));
  }
  if (error) {
    return make_error(ErrorCode::kInternal, "listing '{}' failed: {}", store_dir.string(),
                      error.message());
  }
  // A thousand ids a question, however many conversations this server kept files of.
  constexpr size_t kBatch = 1000;
  int removed = 0;
  for (size_t first = 0; first < stored.size(); first += kBatch) {
    const std::vector<std::string> batch(
        stored.begin() + static_cast<std::ptrdiff_t>(first),
        stored.begin() + static_cast<std::ptrdiff_t>(std::min(stored.size(), first + kBatch)));
    ASSIGN_OR_RETURN(auto deleted, registry.deleted_among(batch));
    for (const auto& id : deleted) {
      RETURN_IF_ERROR(remove_tree(store_dir / id));
      ++removed;
    }
  }
  return removed;
}

}  // namespace quarry::conversation

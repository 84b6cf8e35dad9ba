// Where artifacts' files are kept: each server keeps them under its own state directory in one
// layout,
//
//   <state>/artifacts/<conversation>/<turn>/<step directory>/<name>
//
// so a server finds the file of any artifact in the history at the same place under its own,
// whichever server collected it; a history several servers share (PostgreSQL) keeps the bytes
// too, which a server restores there when it does not have the file (artifact_file).
#pragma once

#include <filesystem>
#include <optional>
#include <string_view>

#include "common/error.h"
#include "conversation/history_store.h"
#include "conversation/server_registry.h"

namespace quarry::conversation {

// Where a server keeps an artifact's file under its store directory (<state>/artifacts): the
// same place relative to it on every server. A record that would point outside it (a name
// with "..", an absolute one) is refused.
Result<std::filesystem::path> artifact_path(const std::filesystem::path& store_dir,
                                            std::string_view conversation_id,
                                            const Artifact& artifact);

// The file of a recorded artifact on this server: at its artifact_path; else restored there
// from the history (one several servers share keeps the bytes of what any of them collected);
// else at the location it was recorded with (recorded by an older quarry, before the history
// kept bytes or under another layout). nullopt when it is in none of them.
Result<std::optional<std::filesystem::path>> artifact_file(const std::filesystem::path& store_dir,
                                                           HistoryStore& history,
                                                           std::string_view conversation_id,
                                                           const Artifact& artifact);

// The file of a recorded artifact that is already on this server (at its artifact_path, else
// at its recorded location), restoring nothing: for what only looks.
Result<std::optional<std::filesystem::path>> local_artifact_file(
    const std::filesystem::path& store_dir, std::string_view conversation_id,
    const Artifact& artifact);

// Removes the stored files of a conversation's artifacts (under `store_dir`, as a collector
// with that directory stores them).
Result<void> remove_artifacts(const std::filesystem::path& store_dir,
                              std::string_view conversation_id);

// Removes the stored files of each conversation under `store_dir` that was deleted while this
// server was not listening (ServerRegistry::deleted_among); returns how many went. Directories
// of conversations the history does not know are kept: they may be another history's.
Result<int> remove_deleted_artifacts(const std::filesystem::path& store_dir,
                                     ServerRegistry& registry);

}  // namespace quarry::conversation

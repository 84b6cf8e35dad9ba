#include "agent/artifacts.h"

#include <cstdio>
#include <fstream>

#include "common/file_util.h"
#include "common/units.h"

namespace quarry::agent {
std::string artifact_type(std::string_view path) {
  auto dot = path.rfind('.');
  if (dot == std::string_view::npos) return "";
  std::string extension(path.substr(dot + 1));
  for (auto& c : extension)
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (std::string_view type : kArtifactTypes) {
    if (extension == type) return extension;
  }
  return "";
}

ArtifactCollector::ArtifactCollector(std::string output_dir, std::filesystem::path store_dir,
                                     ArtifactLimits limits)
    : output_dir_(std::move(output_dir)), store_dir_(std::move(store_dir)), limits_(limits) {}

Result<OutputSnapshot> ArtifactCollector::snapshot(conversation::LazySandbox& sandbox) const {
  ASSIGN_OR_RETURN(auto files, sandbox.list_files(output_dir_));
  OutputSnapshot snapshot;
  for (const auto& file : files) {
    if (file.is_directory) continue;
    snapshot[file.path] = {.size = file.size,
                           .modified_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                                              file.modified_at.time_since_epoch())
                                              .count(),
                           .allocated = file.allocated,
                           .links = file.links};
  }
  return snapshot;
}

namespace {

// Why a file is not worth copying, or "" when it is. A file with holes costs the sandbox its
// allocated blocks and the host its whole length; a file with several names would be copied
// once per name. Files written by the analysis libraries have neither.
std::string not_worth_copying(const OutputFile& file) {
  constexpr uint64_t kSlack = 64 * kKiB;  // blocks still being allocated, tails, small files
  if (file.links > 1) {
    return fmt::format("it has {} names (hard links); write the file itself, once", file.links);
  }
  if (file.size > file.allocated + kSlack) {
    return fmt::format("it has holes ({} long, {} on disk); write it out in full",
                       format_size(file.size), format_size(file.allocated));
  }
  return "";
}

}  // namespace

Result<Collected> ArtifactCollector::collect(conversation::Turn& turn, const OutputSnapshot& before,
                                             conversation::HistoryStore& history) const {
  auto& sandbox = turn.sandbox();
  const std::string& conversation_id = turn.conversation_id();
  Collected collected;
  ASSIGN_OR_RETURN(collected.after, snapshot(sandbox));
  ASSIGN_OR_RETURN(auto kept, history.artifacts(conversation_id));
  uint64_t conversation_bytes = 0;
  for (const auto& artifact : kept)
    conversation_bytes += artifact.size_bytes;
  uint64_t step_bytes = 0;
  for (const auto& [path, file] : collected.after) {
    auto previous = before.find(path);
    if (previous != before.end() && previous->second == file) continue;  // unchanged
    const std::string name = path.substr(output_dir_.size() + 1);
    const std::string type = artifact_type(path);
    auto skip = [&](std::string_view why) {
      collected.notes.push_back(fmt::format("{} was not collected: {}", path, why));
    };
    if (type.empty()) {
      skip(fmt::format("only {} files are", fmt::join(kArtifactTypes, ", ")));
      continue;
    }
    if (auto why = not_worth_copying(file); !why.empty()) {
      skip(why);
      continue;
    }
    if (file.size > limits_.max_file_bytes) {
      skip(fmt::format("{} is over the {} limit per file", format_size(file.size),
                       format_size(limits_.max_file_bytes)));
      continue;
    }
    // What is left of each budget bounds the copy too, so a file that grows after the listing
    // cannot take more.
    const uint64_t step_left = limits_.max_step_bytes - step_bytes;
    const uint64_t conversation_left = limits_.max_conversation_bytes > conversation_bytes
                                           ? limits_.max_conversation_bytes - conversation_bytes
                                           : 0;
    if (file.size > conversation_left) {
      skip(
          fmt::format("this conversation's files reached its {} limit; start a new "
                      "conversation for more",
                      format_size(limits_.max_conversation_bytes)));
      continue;
    }
    if (file.size > step_left) {
      skip(
          fmt::format("this step's files reached the {} limit per step; write fewer or "
                      "smaller files",
                      format_size(limits_.max_step_bytes)));
      continue;
    }
    const uint64_t max_bytes = std::min({limits_.max_file_bytes, step_left, conversation_left});
    conversation::Artifact artifact;
    artifact.turn = turn.number();
    artifact.tool_call_id = turn.step_call_id();
    artifact.name = name;
    artifact.type = type;
    auto place = conversation::artifact_path(store_dir_, conversation_id, artifact);
    if (!place) {
      skip(place.error().message);
      continue;
    }
    const std::filesystem::path& location = *place;
    RETURN_IF_ERROR(make_directories(location.parent_path(), 0700));
    // Copied beside its place and renamed there, so a stored artifact is always whole.
    auto temp = location;
    temp += ".partial";
    std::ofstream out(temp, std::ios::binary | std::ios::trunc);
    if (!out) return errno_error("storing the artifact '{}'", temp.string());
    auto copied = sandbox.read_file(path, out, max_bytes);
    out.close();
    if (!copied) {
      std::error_code ignored;
      std::filesystem::remove(temp, ignored);
      skip(copied.error().message);
      continue;
    }
    if (!out || ::rename(temp.c_str(), location.c_str()) != 0) {
      auto error = errno_error("storing the artifact '{}'", location.string());
      std::error_code ignored;
      std::filesystem::remove(temp, ignored);
      return std::unexpected(error.error());
    }
    step_bytes += *copied;
    conversation_bytes += *copied;
    artifact.size_bytes = *copied;
    artifact.location = location.string();
    ASSIGN_OR_RETURN(artifact, history.record_artifact(conversation_id, std::move(artifact)));
    collected.artifacts.push_back(std::move(artifact));
  }
  return collected;
}

}  // namespace quarry::agent

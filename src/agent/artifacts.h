// Artifacts: the files an analysis writes to the output directory, copied out of the sandbox
// after each command and stored with the conversation (they outlive the sandbox).
//
//   <state>/artifacts/<conversation>/<turn>/<tool call>/<name>
#pragma once

#include <array>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "conversation/conversation_manager.h"
#include "conversation/history_store.h"

namespace quarry::agent {

// The output directory's files at one moment: path -> (size, mtime).
using OutputSnapshot = std::map<std::string, std::pair<uint64_t, int64_t>>;

struct Collected {
  std::vector<conversation::Artifact> artifacts;
  std::vector<std::string> notes;  // files left out and why, for the model
  OutputSnapshot after;
};

class ArtifactCollector {
 public:
  ArtifactCollector(std::string output_dir, std::filesystem::path store_dir,
                    uint64_t max_file_bytes);

  Result<OutputSnapshot> snapshot(conversation::LazySandbox& sandbox) const;
  // Copies files that are new or changed since `before`, of the collected types (png, svg,
  // html, csv, parquet, json) and at most max_file_bytes each, and records them under the
  // turn's current step.
  Result<Collected> collect(conversation::Turn& turn, const OutputSnapshot& before,
                            conversation::HistoryStore& history) const;

  const std::string& output_dir() const { return output_dir_; }

 private:
  std::string output_dir_;
  std::filesystem::path store_dir_;
  uint64_t max_file_bytes_;
};

// The file types collected from the output dir (and named so to the model).
inline constexpr std::array<std::string_view, 6> kArtifactTypes = {"png", "svg",     "html",
                                                                   "csv", "parquet", "json"};

// "png" for "chart.png", or "" when the type is not one that is collected.
std::string artifact_type(std::string_view path);

// Removes the stored files of a conversation's artifacts (under `store_dir`, as a collector
// with that directory stores them).
Result<void> remove_artifacts(const std::filesystem::path& store_dir,
                              std::string_view conversation_id);

}  // namespace quarry::agent

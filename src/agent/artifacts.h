// Artifacts: the files an analysis writes to the output directory, copied out of the sandbox
// after each command and stored with the conversation (they outlive the sandbox).
//
//   <state>/artifacts/<conversation>/<turn>/<tool call>/<name>
//
// (conversation/artifact_files.h: that layout, the same on every server).
#pragma once

#include <array>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "config/config.h"
#include "conversation/artifact_files.h"
#include "conversation/conversation_manager.h"
#include "conversation/history_store.h"

namespace quarry::agent {

// The output directory's files at one moment, by path.
struct OutputFile {
  uint64_t size = 0;
  int64_t modified_ns = 0;
  uint64_t allocated = 0;  // bytes on disk
  uint64_t links = 1;
  bool operator==(const OutputFile&) const = default;
};
using OutputSnapshot = std::map<std::string, OutputFile>;

struct Collected {
  std::vector<conversation::Artifact> artifacts;
  std::vector<std::string> notes;  // files left out and why, for the model
  OutputSnapshot after;
};

class ArtifactCollector {
 public:
  ArtifactCollector(std::string output_dir, std::filesystem::path store_dir, ArtifactLimits limits);

  Result<OutputSnapshot> snapshot(conversation::LazySandbox& sandbox) const;
  // Copies files that are new or changed since `before`, of the collected types (png, svg,
  // html, csv, parquet, json), within the limits (per file, per step, per conversation), and
  // records them under the turn's current step. What the sandbox could write for free but the
  // host would pay for in full is left out: a file with holes, a file with several names. Every
  // file left out has a note saying why.
  Result<Collected> collect(conversation::Turn& turn, const OutputSnapshot& before,
                            conversation::HistoryStore& history) const;

  const std::string& output_dir() const { return output_dir_; }

 private:
  std::string output_dir_;
  std::filesystem::path store_dir_;
  ArtifactLimits limits_;
};

// The file types collected from the output dir (and named so to the model).
inline constexpr std::array<std::string_view, 6> kArtifactTypes = {"png", "svg",     "html",
                                                                   "csv", "parquet", "json"};

// "png" for "chart.png", or "" when the type is not one that is collected.
std::string artifact_type(std::string_view path);

}  // namespace quarry::agent

#include "data/sandbox_export.h"

#include <fcntl.h>
#include <unistd.h>

#include <fstream>

#include "common/file_util.h"

namespace quarry::data {
namespace {

constexpr std::string_view kSuffix = ".parquet";
constexpr size_t kMaxStem = 100;

bool plain_character(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '_' || c == '-';
}

// A uniquely named file in `dir`, removed when this goes out of scope.
class TempFile {
 public:
  static Result<TempFile> create(const std::filesystem::path& dir) {
    std::string pattern = (dir / "quarry-export-XXXXXX.parquet").string();
    const int fd = ::mkostemps(pattern.data(), static_cast<int>(kSuffix.size()), O_CLOEXEC);
    if (fd < 0) return errno_error("creating a temporary file in '{}'", dir.string());
    ::close(fd);
    return TempFile(pattern);
  }
  TempFile(TempFile&& other) noexcept : path_(std::exchange(other.path_, {})) {}
  TempFile& operator=(TempFile&&) = delete;
  ~TempFile() {
    if (!path_.empty()) ::unlink(path_.c_str());
  }
  const std::filesystem::path& path() const { return path_; }

 private:
  explicit TempFile(std::filesystem::path path) : path_(std::move(path)) {}
  std::filesystem::path path_;
};

std::string cut_message(const ExportSummary& summary) {
  if (!summary.truncated) return {};
  return fmt::format(
      "The result was cut at sandbox.export_max_rows = {} rows; the query returns more. "
      "Filter or aggregate in SQL, or export only the columns and rows the analysis needs.",
      summary.max_rows);
}

}  // namespace

Result<void> validate_export_filename(std::string_view filename) {
  const auto refuse = [&](std::string_view why) {
    return make_error(ErrorCode::kInvalidArgument,
                      "export_query: filename '{}' {}; use a plain name such as "
                      "'views_by_category.parquet' (letters, digits, '.', '_', '-'; no paths)",
                      filename, why);
  };
  if (!filename.ends_with(kSuffix)) return refuse("must end in .parquet");
  const std::string_view stem = filename.substr(0, filename.size() - kSuffix.size());
  if (stem.empty()) return refuse("needs a name before .parquet");
  if (stem.size() > kMaxStem) return refuse("is too long (at most 100 characters before .parquet)");
  if (filename.find('/') != std::string_view::npos) return refuse("must not contain a path");
  if (filename.find("..") != std::string_view::npos) return refuse("must not contain '..'");
  for (char c : filename) {
    if (!plain_character(c)) return refuse("has a character that is not allowed");
  }
  if (!std::isalnum(static_cast<unsigned char>(stem.front()))) {
    return refuse("must start with a letter or digit");
  }
  return {};
}

Result<Upload> upload_to(sandbox::SandboxProvider& provider, std::string id, int cancel_fd) {
  ASSIGN_OR_RETURN(bool alive, provider.is_alive(id));
  if (!alive) {
    return make_error(ErrorCode::kFailedPrecondition,
                      "export_query: sandbox {} is not running; nothing was exported", id);
  }
  return Upload([&provider, id, cancel_fd](std::string_view path, std::istream& content) {
    return provider.write_file(id, path, content, cancel_fd);
  });
}

Result<SandboxExport> export_to_sandbox(const SandboxExportRequest& request, const Upload& upload) {
  RETURN_IF_ERROR(validate_export_filename(request.filename));
  RETURN_IF_ERROR(make_directories(request.temp_dir, 0700));
  ASSIGN_OR_RETURN(auto temp, TempFile::create(request.temp_dir));
  SandboxExport result;
  ASSIGN_OR_RETURN(result.summary,
                   export_parquet(request.conninfo, request.sql, temp.path(), request.options));
  result.path = fmt::format("{}/{}", request.data_dir, request.filename);
  const auto upload_start = std::chrono::steady_clock::now();
  std::ifstream content(temp.path(), std::ios::binary);
  if (!content) {
    return make_error(ErrorCode::kInternal, "export_query: cannot read back '{}'",
                      temp.path().string());
  }
  RETURN_IF_ERROR(with_context(upload(result.path, content),
                               fmt::format("export_query: uploading to {}", result.path)));
  result.summary.elapsed_ms +=
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - upload_start)
          .count();
  return result;
}

nlohmann::json to_json(const ExportSummary& summary) {
  nlohmann::json columns = nlohmann::json::array();
  for (const auto& column : summary.columns) {
    nlohmann::json entry = {
        {"name", column.name}, {"type", column.sql_type}, {"parquet_type", column.parquet_type}};
    if (!column.note.empty()) entry["note"] = column.note;
    columns.push_back(std::move(entry));
  }
  const std::string message = cut_message(summary);
  return {{"rows", summary.rows},
          {"truncated", summary.truncated},
          {"max_rows", summary.max_rows},
          {"bytes", summary.bytes},
          {"elapsed_ms", summary.elapsed_ms},
          {"columns", std::move(columns)},
          {"message", message.empty() ? nlohmann::json(nullptr) : nlohmann::json(message)}};
}

nlohmann::json to_json(const SandboxExport& result) {
  nlohmann::json json = to_json(result.summary);
  json["path"] = result.path;
  return json;
}

}  // namespace quarry::data

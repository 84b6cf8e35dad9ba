// The lock of an image's Python packages: every package the image installs, pinned to one
// version and the sha256 of its wheel, in pip's --require-hashes requirements format, with the
// Python version and the requirements (sandbox.packages) it was resolved for in its header:
//
//   # python: 3.11
//   # requirements: duckdb==1.4.4 polars==1.35.2
//   duckdb==1.4.4 --hash=sha256:<64 hex digits>
//
// (quarry writes each --hash on a line of its own, continued with a backslash, as pip does.)
//
// `quarry image lock` makes it (resolving anew); `quarry image build` installs exactly it.
#pragma once

#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.h"

namespace quarry::sandbox::local {

struct LockedPackage {
  std::string name;                 // normalised (PEP 503: lower case, runs of -_. as one -)
  std::string version;              // exactly as the wheel names it
  std::vector<std::string> sha256;  // lowercase hex, one per acceptable wheel
};

inline constexpr std::string_view kImageLockComment =
    "The Python packages of quarry's sandbox image, each pinned to one version and the\n"
    "sha256 of its wheel (pip's --require-hashes format). `quarry image build` installs\n"
    "exactly these and checks every hash; `quarry image lock` resolves them again.";

struct PythonLock {
  std::string python;                     // the interpreter's major.minor, e.g. 3.11
  std::vector<std::string> requirements;  // what it was resolved for, sorted
  std::vector<LockedPackage> packages;    // sorted by name

  // The lock as quarry writes it, after `comment` (lines, each made a comment); its sha256 is
  // the lock's identity (comments and layout of a hand-edited file do not change it).
  std::string text(std::string_view comment = kImageLockComment) const;
  std::string sha256() const;
  const LockedPackage* find(std::string_view name) const;
};

// PEP 503 normalisation of a package name: "Polars_Runtime.32" -> "polars-runtime-32".
std::string normalize_package_name(std::string_view name);
// The name part of a requirement ("polars[pyarrow]>=1.30" -> "polars"), normalised.
std::string requirement_name(std::string_view requirement);

// Reads a lock; `source` names it in errors ("config.lock:12: ...").
Result<PythonLock> parse_python_lock(std::string_view text, std::string_view source);

// Whether the lock is the one for `requirements` (sandbox.packages): made for the same
// requirements, pinning each one (at the version a requirement's == names).
Result<void> check_lock_covers(const PythonLock& lock, const std::vector<std::string>& requirements,
                               std::string_view source);

// The package and version a wheel file's name says (PEP 427), the name normalised; nullopt for
// a name that is no wheel's.
struct WheelName {
  std::string name;
  std::string version;
};
std::optional<WheelName> parse_wheel_filename(std::string_view filename);

// The wheels in `directory` that the lock pins: one file per package whose sha256 the lock
// lists. `missing` has the packages without one; `mismatched` the files that have a package's
// name and version but another hash.
struct LockedWheels {
  std::map<std::string, std::filesystem::path> found;  // package name -> wheel
  std::vector<LockedPackage> missing;
  std::map<std::string, std::vector<std::string>> mismatched;  // package -> "file (sha256 ...)"
};
LockedWheels find_locked_wheels(const PythonLock& lock, const std::filesystem::path& directory);
// An error naming each missing package and what to do (`relock`: how to lock what the index
// serves now), or nothing when none is missing.
Result<void> check_wheels_found(const LockedWheels& wheels, std::string_view source,
                                std::string_view relock);

// Whether what `pip freeze --all` printed is what the lock pins: every package at its version,
// nothing else but the virtual environment's own pip and setuptools.
Result<void> check_installed(const PythonLock& lock, std::string_view freeze_output,
                             std::string_view source);

}  // namespace quarry::sandbox::local

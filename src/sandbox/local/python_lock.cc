#include "sandbox/local/python_lock.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <set>
#include <sstream>

#include "common/file_util.h"
#include "common/sha256.h"
#include "common/text.h"

namespace quarry::sandbox::local {
namespace {

constexpr std::string_view kRemake = "make the lock again with: quarry image lock";

std::string_view trim(std::string_view text) {
  const auto first = text.find_first_not_of(" \t\r");
  if (first == std::string_view::npos) return {};
  const auto last = text.find_last_not_of(" \t\r");
  return text.substr(first, last - first + 1);
}

bool valid_name(std::string_view name) {
  if (name.empty() || !std::isalnum(static_cast<unsigned char>(name.front()))) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
  });
}

bool valid_version(std::string_view version) {
  if (version.empty() || !std::isalnum(static_cast<unsigned char>(version.front()))) return false;
  return std::all_of(version.begin(), version.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) ||
           std::string_view(".+!_-").find(c) != std::string_view::npos;
  });
}

bool valid_sha256(std::string_view hex) {
  return hex.size() == 64 && std::all_of(hex.begin(), hex.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

// The version a requirement pins with a single ==, if it does ("polars==1.35.2" -> 1.35.2).
std::optional<std::string> pinned_version(std::string_view requirement) {
  const auto at = requirement.find("==");
  if (at == std::string_view::npos || requirement.find("===") != std::string_view::npos) {
    return std::nullopt;
  }
  std::string_view version = requirement.substr(at + 2);
  if (version.find_first_of(",;*") != std::string_view::npos) return std::nullopt;
  return std::string(trim(version));
}

std::vector<std::string> sorted(std::vector<std::string> items) {
  std::sort(items.begin(), items.end());
  return items;
}

// The header lines and the packages: everything of text() but its explanation.
std::string lock_body(const PythonLock& lock) {
  std::string out = fmt::format("# python: {}\n# requirements: {}\n", lock.python,
                                fmt::join(lock.requirements, " "));
  for (const auto& package : lock.packages) {
    out += fmt::format("{}=={}", package.name, package.version);
    for (const auto& hash : package.sha256)
      out += fmt::format(" \\\n    --hash=sha256:{}", hash);
    out += "\n";
  }
  return out;
}

}  // namespace

std::string normalize_package_name(std::string_view name) {
  std::string out;
  bool separator = false;
  for (char c : name) {
    if (c == '-' || c == '_' || c == '.') {
      separator = true;
      continue;
    }
    if (separator && !out.empty()) out.push_back('-');
    separator = false;
    out.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  }
  return out;
}

std::string requirement_name(std::string_view requirement) {
  const auto end = requirement.find_first_of("[=<>!~;, (");
  return normalize_package_name(trim(requirement.substr(0, end)));
}

std::string PythonLock::sha256() const {
  // The lock's identity is what follows the explanatory comment of text().
  return sha256_hex(lock_body(*this));
}

std::string PythonLock::text(std::string_view comment) const {
  std::string out;
  for (size_t start = 0; start < comment.size();) {
    const auto end = std::min(comment.find('\n', start), comment.size());
    out += fmt::format("# {}\n", comment.substr(start, end - start));
    start = end + 1;
  }
  return out + lock_body(*this);
}

const LockedPackage* PythonLock::find(std::string_view name) const {
  const std::string normalized = normalize_package_name(name);
  for (const auto& package : packages) {
    if (package.name == normalized) return &package;
  }
  return nullptr;
}

Result<PythonLock> parse_python_lock(std::string_view text, std::string_view source) {
  PythonLock lock;
  bool has_python = false;
  bool has_requirements = false;
  std::set<std::string> seen;

  auto entry = [&](std::string_view logical, int line) -> Result<void> {
    auto fail = [&](std::string message) -> Result<void> {
      return make_error(ErrorCode::kInvalidArgument, "{}:{}: {}; {}", source, line, message,
                        kRemake);
    };
    std::string_view content = trim(logical);
    if (content.empty()) return {};
    if (content.front() == '#') {
      std::string_view comment = trim(content.substr(1));
      if (comment.starts_with("python:")) {
        std::string_view python = trim(comment.substr(7));
        const auto dot = python.find('.');
        if (dot == std::string_view::npos || dot == 0 || dot + 1 == python.size() ||
            python.find_first_not_of("0123456789.") != std::string_view::npos) {
          return fail(fmt::format("'{}' is not a Python version such as 3.11", python));
        }
        lock.python = std::string(python);
        has_python = true;
      } else if (comment.starts_with("requirements:")) {
        lock.requirements = sorted(words(comment.substr(13)));
        has_requirements = true;
      }
      return {};
    }
    auto tokens = words(content);
    const std::string& pin = tokens.front();
    const auto equals = pin.find("==");
    if (equals == std::string::npos || pin.find_first_of("<>!~;,[@") != std::string::npos) {
      return fail(
          fmt::format("'{}' is not pinned: each package of a lock is NAME==VERSION followed by "
                      "--hash=sha256:<64 hex digits>",
                      content));
    }
    LockedPackage package;
    const std::string name = pin.substr(0, equals);
    package.version = pin.substr(equals + 2);
    if (!valid_name(name)) return fail(fmt::format("'{}' is not a package name", name));
    if (!valid_version(package.version)) {
      return fail(fmt::format("'{}' is not an exact version of {}", package.version, name));
    }
    package.name = normalize_package_name(name);
    for (size_t i = 1; i < tokens.size(); ++i) {
      std::string_view token = tokens[i];
      if (!token.starts_with("--hash=")) {
        return fail(
            fmt::format("'{}' after {}: only --hash=sha256:... may follow a package", token, pin));
      }
      std::string_view hash = token.substr(7);
      if (!hash.starts_with("sha256:") || !valid_sha256(hash.substr(7))) {
        return fail(
            fmt::format("'{}' of {} is not a sha256 hash (--hash=sha256:<64 lowercase "
                        "hex digits>)",
                        token, pin));
      }
      package.sha256.emplace_back(hash.substr(7));
    }
    if (package.sha256.empty()) {
      return fail(
          fmt::format("{} has no --hash=sha256:...; every package needs the hash of its "
                      "wheel",
                      pin));
    }
    if (!seen.insert(package.name).second) {
      return fail(fmt::format("{} is pinned twice", package.name));
    }
    lock.packages.push_back(std::move(package));
    return {};
  };

  std::string logical;
  int start = 0;
  int number = 0;
  std::istringstream lines{std::string(text)};
  for (std::string line; std::getline(lines, line);) {
    ++number;
    if (logical.empty()) start = number;
    std::string_view content = trim(line);
    if (content.ends_with('\\')) {
      logical += std::string(content.substr(0, content.size() - 1)) + " ";
      continue;
    }
    logical += std::string(content);
    RETURN_IF_ERROR(entry(logical, start));
    logical.clear();
  }
  if (!trim(logical).empty()) {
    return make_error(ErrorCode::kInvalidArgument,
                      "{}:{}: the last line ends with '\\' but nothing follows; {}", source, start,
                      kRemake);
  }
  if (!has_python) {
    return make_error(ErrorCode::kInvalidArgument,
                      "{}: no '# python: X.Y' line says which Python the lock is for; {}", source,
                      kRemake);
  }
  if (!has_requirements) {
    return make_error(ErrorCode::kInvalidArgument,
                      "{}: no '# requirements: ...' line says which packages the lock was "
                      "resolved for; {}",
                      source, kRemake);
  }
  std::sort(lock.packages.begin(), lock.packages.end(),
            [](const auto& a, const auto& b) { return a.name < b.name; });
  return lock;
}

Result<void> check_lock_covers(const PythonLock& lock, const std::vector<std::string>& requirements,
                               std::string_view source) {
  const auto wanted = sorted(requirements);
  if (wanted != lock.requirements) {
    return make_error(ErrorCode::kFailedPrecondition,
                      "{} was resolved for the packages [{}], but sandbox.packages is now [{}]; "
                      "run: quarry image lock (it resolves them again, each package to the newest "
                      "version the requirements allow), then quarry image build",
                      source, fmt::join(lock.requirements, ", "), fmt::join(wanted, ", "));
  }
  for (const auto& requirement : requirements) {
    const std::string name = requirement_name(requirement);
    const LockedPackage* package = lock.find(name);
    if (!package) {
      return make_error(ErrorCode::kFailedPrecondition,
                        "{} does not pin {}, which sandbox.packages asks for; {}", source, name,
                        kRemake);
    }
    if (auto version = pinned_version(requirement); version && *version != package->version) {
      return make_error(ErrorCode::kFailedPrecondition,
                        "{} pins {} {}, but sandbox.packages asks for {}; {}", source, name,
                        package->version, requirement, kRemake);
    }
  }
  return {};
}

std::optional<WheelName> parse_wheel_filename(std::string_view filename) {
  if (!filename.ends_with(".whl")) return std::nullopt;
  std::vector<std::string_view> parts;
  std::string_view rest = filename.substr(0, filename.size() - 4);
  for (size_t at; (at = rest.find('-')) != std::string_view::npos; rest = rest.substr(at + 1))
    parts.push_back(rest.substr(0, at));
  parts.push_back(rest);
  // name-version[-build]-python-abi-platform
  if (parts.size() != 5 && parts.size() != 6) return std::nullopt;
  if (!valid_name(parts[0]) || !valid_version(parts[1])) return std::nullopt;
  return WheelName{normalize_package_name(parts[0]), std::string(parts[1])};
}

LockedWheels find_locked_wheels(const PythonLock& lock, const std::filesystem::path& directory) {
  std::map<std::pair<std::string, std::string>, std::vector<std::filesystem::path>> files;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(directory, error)) {
    if (!entry.is_regular_file(error)) continue;
    auto wheel = parse_wheel_filename(entry.path().filename().string());
    if (wheel) files[{wheel->name, wheel->version}].push_back(entry.path());
  }
  LockedWheels out;
  for (const auto& package : lock.packages) {
    for (const auto& path : files[{package.name, package.version}]) {
      auto content = read_file(path);
      if (!content) continue;
      const std::string hash = sha256_hex(*content);
      if (std::find(package.sha256.begin(), package.sha256.end(), hash) != package.sha256.end()) {
        out.found[package.name] = path;
        break;
      }
      out.mismatched[package.name].push_back(
          fmt::format("{} (sha256 {})", path.filename().string(), hash));
    }
    if (!out.found.contains(package.name)) out.missing.push_back(package);
  }
  return out;
}

Result<void> check_wheels_found(const LockedWheels& wheels, std::string_view source,
                                std::string_view relock) {
  if (wheels.missing.empty()) return {};
  std::vector<std::string> lines;
  for (const auto& package : wheels.missing) {
    auto mismatched = wheels.mismatched.find(package.name);
    if (mismatched != wheels.mismatched.end()) {
      lines.push_back(fmt::format("{}=={}: the lock has sha256 {}, but the wheel is {}",
                                  package.name, package.version, fmt::join(package.sha256, " or "),
                                  fmt::join(mismatched->second, ", ")));
    } else {
      lines.push_back(fmt::format("{}=={}: no wheel with the lock's sha256 {} was found",
                                  package.name, package.version,
                                  fmt::join(package.sha256, " or ")));
    }
  }
  return make_error(ErrorCode::kFailedPrecondition,
                    "the wheels do not match the lock {}: {}. A wheel whose hash changed is not "
                    "the file that was locked: if the package index changed it on purpose, {}; "
                    "otherwise remove the file and try again",
                    source, fmt::join(lines, "; "), relock);
}

Result<void> check_installed(const PythonLock& lock, std::string_view freeze_output,
                             std::string_view source) {
  std::map<std::string, std::string> installed;
  for (const auto& line : words(freeze_output)) {
    const auto separator = line.find("==");
    if (separator == std::string::npos) continue;
    installed[normalize_package_name(line.substr(0, separator))] = line.substr(separator + 2);
  }
  std::vector<std::string> differences;
  for (const auto& package : lock.packages) {
    auto found = installed.find(package.name);
    if (found == installed.end()) {
      differences.push_back(fmt::format("{} {} is not installed", package.name, package.version));
    } else if (found->second != package.version) {
      differences.push_back(
          fmt::format("{} is {}, not {}", package.name, found->second, package.version));
    }
  }
  for (const auto& [name, version] : installed) {
    // The virtual environment brings its own pip and setuptools.
    if (name == "pip" || name == "setuptools" || lock.find(name)) continue;
    differences.push_back(fmt::format("{} {} is installed but not in the lock", name, version));
  }
  if (differences.empty()) return {};
  return make_error(ErrorCode::kInternal,
                    "the image's packages differ from the lock {} after installing: {}", source,
                    fmt::join(differences, "; "));
}

}  // namespace quarry::sandbox::local

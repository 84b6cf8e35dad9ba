#include "probe_wheel.h"

#include "common/command.h"

namespace quarry::testing {
namespace {

constexpr const char* kMakeWheel = R"(
import base64, hashlib, os, sys, zipfile
directory, version = sys.argv[1], sys.argv[2]
info = f"quarry_probe-{version}.dist-info"
files = {
    "quarry_probe/__init__.py": f"__version__ = {version!r}\n",
    f"{info}/METADATA": f"Metadata-Version: 2.1\nName: quarry-probe\nVersion: {version}\n",
    f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: quarry-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
}
record = []
for name, text in files.items():
    digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
    record.append(f"{name},sha256={digest},{len(text.encode())}")
record.append(f"{info}/RECORD,,")
files[f"{info}/RECORD"] = "\n".join(record) + "\n"
with zipfile.ZipFile(os.path.join(directory, f"quarry_probe-{version}-py3-none-any.whl"), "w") as wheel:
    for name, text in files.items():
        wheel.writestr(zipfile.ZipInfo(name, (2024, 1, 1, 0, 0, 0)), text)
)";

}  // namespace

Result<std::filesystem::path> make_probe_wheel(const std::filesystem::path& directory,
                                               std::string_view version) {
  RETURN_IF_ERROR(
      run_command({"python3", "-c", kMakeWheel, directory.string(), std::string(version)}));
  return directory / fmt::format("quarry_probe-{}-py3-none-any.whl", version);
}

}  // namespace quarry::testing

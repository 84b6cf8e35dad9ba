// seccomp_compile OUTPUT.cc: a build tool. Builds the sandbox's seccomp filter with libseccomp
// (build_seccomp_filter) and writes it as the C++ source of seccomp_program() (seccomp_program.h),
// replacing OUTPUT only when its text changes.
#include <cstdio>
#include <string>

#include "common/file_util.h"
#include "sandbox/local/seccomp_filter.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: seccomp_compile OUTPUT.cc\n");
    return 2;
  }
  auto program = quarry::sandbox::local::build_seccomp_filter();
  if (!program) {
    std::fprintf(stderr, "seccomp_compile: %s\n", program.error().message.c_str());
    return 1;
  }
  std::string text =
      "// Generated at build time by seccomp_compile from sandbox/local/seccomp_filter.cc.\n"
      "#include \"sandbox/local/seccomp_program.h\"\n\n"
      "namespace quarry::sandbox::local {\n"
      "namespace {\n\n"
      "alignas(8) constexpr uint8_t kProgram[] = {";
  for (size_t at = 0; at < program->size(); ++at) {
    text += fmt::format("{}0x{:02x},", at % 16 == 0 ? "\n    " : " ", (*program)[at]);
  }
  text +=
      "\n};\n\n"
      "}  // namespace\n\n"
      "std::span<const uint8_t> seccomp_program() { return kProgram; }\n\n"
      "}  // namespace quarry::sandbox::local\n";
  const std::filesystem::path output = argv[1];
  if (auto old = quarry::read_file(output); old && *old == text) return 0;
  if (auto written = quarry::write_file_atomic(output, text); !written) {
    std::fprintf(stderr, "seccomp_compile: %s\n", written.error().message.c_str());
    return 1;
  }
  return 0;
}

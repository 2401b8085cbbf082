// The command-line parser and the option resolution behind it on arbitrary arguments
// (NUL-separated): Error or a usage message, never a crash. Nothing is run, so no file is touched.
// Manifests have their own target (manifest_fuzz.cc).
#include <cstdint>
#include <string>
#include <vector>

#include "command_line.h"
#include "ctxgen/error.h"
#include "ctxgen/options.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    std::vector<std::string> args{"ctxgen"};
    size_t start = 0;
    for (size_t end; (end = text.find('\0', start)) != std::string::npos; start = end + 1)
      args.push_back(text.substr(start, end - start));
    args.push_back(text.substr(start));
    std::vector<const char*> argv;
    for (const auto& a : args) argv.push_back(a.c_str());
    const ctxgen::cli::Parsed parsed = ctxgen::cli::parse(static_cast<int>(argv.size()), argv.data(), true, "ctxgen fuzz");
    if (!parsed.line) return 0;
    const ctxgen::cli::CommandLine& line = *parsed.line;
    if (line.command == ctxgen::cli::Command::kCompile || line.command == ctxgen::cli::Command::kShare) {
      ctxgen::CompileOptions options;
      ctxgen::cli::compile_options(line, nullptr, options);
    }
    if (line.command == ctxgen::cli::Command::kVerify) ctxgen::resolve_shapes({"verify"}, {{}, line.verify_shapes, {}});
  } catch (const ctxgen::Error&) {
  }
  return 0;
}

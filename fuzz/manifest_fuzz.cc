// The share manifest reader on arbitrary text, and the merge of its options with a command line's
// (`share --manifest`): Error, never a crash. Nothing is run, so no file is touched; paths resolve
// against a folder that does not exist.
#include <cstdint>
#include <string>

#include "command_line.h"
#include "ctxgen/error.h"
#include "ctxgen/options.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const ctxgen::Manifest manifest = ctxgen::parse_manifest(text, "/nonexistent", "fuzz.json");
    ctxgen::cli::CommandLine line;
    line.command = ctxgen::cli::Command::kShare;
    line.manifest_path = "/nonexistent/fuzz.json";
    ctxgen::CompileOptions options;
    ctxgen::cli::compile_options(line, &manifest, options);
  } catch (const ctxgen::Error&) {
  }
  return 0;
}

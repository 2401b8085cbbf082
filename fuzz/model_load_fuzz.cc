// The model stage on arbitrary bytes: load (protobuf parse, ctxgen's own attribute checks, onnx's
// checker and shape inference) and specialise (constant folding runs the ref kernels). Either
// the model is accepted or Error says why; nothing crashes, hangs or reads outside a buffer.
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "ctxgen/error.h"
#include "ctxgen/model.h"
#include "ctxgen/specialise.h"

namespace fs = std::filesystem;

namespace {

// The loader maps a file, as it does for users; a tmpfs keeps that cheap. Removed after each
// input (libFuzzer's workers end with _Exit, so an atexit handler would not run).
fs::path scratch_file() {
  const fs::path folder = fs::exists("/dev/shm") ? fs::path("/dev/shm") : fs::temp_directory_path();
  return folder / ("ctxgen-fuzz-" + std::to_string(::getpid()) + ".onnx");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const fs::path path = scratch_file();
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  try {
    ctxgen::Model model = ctxgen::load_model(path);
    ctxgen::specialise(model);
  } catch (const ctxgen::Error&) {
  }
  std::error_code ec;
  fs::remove(path, ec);
  return 0;
}

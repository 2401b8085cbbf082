// A compile cache entry on arbitrary bytes, found under the key of testdata/cnn.onnx's partition and
// used by a real compile of that model (`compile --cache`): the entry is used, or found damaged and
// the partition compiled anew; Error or a result, never a crash, a hang or a file outside the run's
// folder. The seeds are the model's own entry (fuzz/seeds.py), so mutations start from a hit.
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "ctxgen/backend.h"
#include "ctxgen/compile_cache.h"
#include "ctxgen/error.h"
#include "ctxgen/log.h"
#include "ctxgen/pipeline.h"

namespace fs = std::filesystem;

namespace {

struct Run {
  fs::path folder, entry;
  ctxgen::BackendRegistry backends = ctxgen::builtin_backends();
  ctxgen::CompileOptions options;

  Run() {
    char name[] = "/tmp/ctxgen-fuzz-cache-XXXXXX";
    folder = ::mkdtemp(name);
    // Made before the handler is registered, so gone only after it ran.
    static const fs::path made = folder;
    std::atexit([] { fs::remove_all(made); });
    options.cache_dir = folder / "cache";
    options.output_dir = folder / "out";
    options.force = true;
    ctxgen::log().set_level(spdlog::level::off);
    // A cold run names the entry the warm runs read.
    const ctxgen::RunSummary cold = ctxgen::compile_models({model()}, options, backends);
    entry = ctxgen::cache_entry_path(options.cache_dir, cold.cache.keys.at(0));
  }
  static fs::path model() { return fs::path(CTXGEN_SOURCE_DIR) / "testdata" / "cnn.onnx"; }
};

Run& run() {
  static Run one;
  return one;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Run& r = run();
  fs::create_directories(r.entry.parent_path());
  std::ofstream(r.entry, std::ios::binary | std::ios::trunc).write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  try {
    ctxgen::compile_models({Run::model()}, r.options, r.backends);
  } catch (const ctxgen::Error&) {
  }
  return 0;
}

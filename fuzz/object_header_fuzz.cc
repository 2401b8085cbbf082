// `link` of one object on arbitrary bytes: the object's header and members are read, checked and
// unpacked, its partitions taken from its entries and the outputs written into the run's folder;
// Error or the outputs, never a crash, a hang or a file outside that folder. The seeds are objects
// compile --object made of the test models (fuzz/seeds.py).
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "ctxgen/backend.h"
#include "ctxgen/error.h"
#include "ctxgen/log.h"
#include "ctxgen/pipeline.h"

namespace fs = std::filesystem;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const fs::path folder = [] {
    char name[] = "/tmp/ctxgen-fuzz-object-XXXXXX";
    ctxgen::log().set_level(spdlog::level::off);
    return fs::path(::mkdtemp(name));
  }();
  static const bool cleaned = std::atexit([] { fs::remove_all(folder); }) == 0;  // after `folder` is made
  (void)cleaned;
  static const ctxgen::BackendRegistry backends = ctxgen::builtin_backends();
  const fs::path object = folder / "model.ctxo";
  std::ofstream(object, std::ios::binary | std::ios::trunc).write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  ctxgen::CompileOptions options;
  options.output_dir = folder / "out";
  options.force = true;
  try {
    ctxgen::link_objects({object}, options, backends);
  } catch (const ctxgen::Error&) {
  }
  return 0;
}

// The same models and options give the same bytes wherever they are compiled: another folder,
// another working directory, another path spelling, another number of threads. CI fleets rely on
// it to compare and cache artifacts; every output file is compared whole.
#include <gtest/gtest.h>

#include <map>

#include "e2e.h"

namespace ctxgen::testing {
namespace {

const fs::path kExports = fs::path(CTXGEN_SOURCE_DIR) / "testdata" / "exports";
const fs::path kQuantized = fs::path(CTXGEN_SOURCE_DIR) / "testdata" / "quantized";

// A group of float, half and quantized models, each with its dims fixed (scoped to its stem).
const std::vector<fs::path> kGroup = {kExports / "decoder_prefill.onnx", kExports / "decoder_decode.onnx",
                                      kExports / "cnn_upsample.onnx", kQuantized / "cnn_upsample_fp16.onnx",
                                      kQuantized / "cnn_upsample_qdq_u8s8.onnx",
                                      kQuantized / "decoder_prefill_matmulnbits.onnx"};
const std::string kShapes = "--fix-dim batch=1 --fix-dim decoder_prefill:seq=16 --fix-dim decoder_prefill_matmulnbits:seq=16";
const std::string kDecodeShapes = "--fix-dim decoder_decode:seq=1 --fix-dim decoder_decode:past=15";

std::map<std::string, std::string> contents(const fs::path& dir) {
  std::map<std::string, std::string> files;
  for (const auto& name : files_in(dir)) files[name] = read_file(dir / name);
  return files;
}

// Copies the group to `folder`, then shares it from `cwd` (inputs named relative to it) into
// `out` on `threads` threads; returns what was written.
std::map<std::string, std::string> share_in(const fs::path& folder, const fs::path& cwd, const fs::path& out,
                                            int threads, const std::string& options) {
  fs::create_directories(folder);
  std::string inputs;
  for (const auto& model : kGroup) {
    fs::copy_file(model, folder / model.filename());
    inputs += (inputs.empty() ? "" : ",") + fs::relative(folder / model.filename(), cwd).string();
  }
  const auto r = run_command("cd " + quote(cwd) + " && OMP_NUM_THREADS=" + std::to_string(threads) + " " +
                             CTXGEN_BINARY + " share " + inputs + " " + kShapes + " " + options + " --output-dir " +
                             quote(out) + " -q");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return contents(out);
}

void expect_same(const std::map<std::string, std::string>& a, const std::map<std::string, std::string>& b) {
  ASSERT_FALSE(a.empty());
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, bytes] : a) {
    ASSERT_TRUE(b.count(name)) << name << " is missing";
    EXPECT_TRUE(b.at(name) == bytes) << name << " differs";
  }
}

TEST(Reproducible, AGroupIsTheSameByteForByteInAnotherFolderOnAnotherNumberOfThreads) {
  // The decoder's decode step with open dims keeps nodes on CPU, their weights in weights.data.
  for (const std::string& options :
       std::vector<std::string>{kDecodeShapes, "--external-initializers-file weights.data", kDecodeShapes + " --target-cpu avx2"}) {
    SCOPED_TRACE("options '" + options + "'");
    TempDir dir;
    const auto one = share_in(dir.path() / "a", dir.path() / "a", dir.path() / "a" / "out", 1, options);
    const fs::path deep = dir.path() / "b" / "deeper" / "models";
    const auto two = share_in(deep, dir.path() / "b", dir.path() / "elsewhere", 2, options);
    expect_same(one, two);
    EXPECT_TRUE(one.count("decoder_prefill_ref.bin"));
    const bool external = options.find("external") != std::string::npos;
    EXPECT_EQ(one.size(), kGroup.size() + 1 + (external ? 1 : 0));
    if (external) {
      EXPECT_GT(one.at("weights.data").size(), 100000u);
    }
  }
}

}  // namespace
}  // namespace ctxgen::testing

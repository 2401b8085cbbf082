// The same models and options give the same bytes wherever they are compiled: another folder,
// another working directory, another path spelling, another number of threads. CI fleets rely on
// it to compare and cache artifacts; every output file is compared whole.
#include <gtest/gtest.h>

#include <map>

#include "e2e.h"

namespace ctxgen::testing {
namespace {

// Copies the group to `folder`, then shares it from `cwd` (inputs named relative to it) into
// `out` on `threads` threads; returns what was written.
std::map<std::string, std::string> share_in(const fs::path& folder, const fs::path& cwd, const fs::path& out,
                                            int threads, const std::string& options) {
  fs::create_directories(folder);
  std::string inputs;
  for (const auto& model : mixed_group()) {
    fs::copy_file(model, folder / model.filename());
    inputs += (inputs.empty() ? "" : ",") + fs::relative(folder / model.filename(), cwd).string();
  }
  const auto r = run_command("cd " + quote(cwd) + " && OMP_NUM_THREADS=" + std::to_string(threads) + " " +
                             CTXGEN_BINARY + " share " + inputs + " " + mixed_group_shapes("", false) + " " + options + " --output-dir " +
                             quote(out) + " -q");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return file_contents(out);
}

TEST(Reproducible, AGroupIsTheSameByteForByteInAnotherFolderOnAnotherNumberOfThreads) {
  // The decoder's decode step with open dims keeps nodes on CPU, their weights in weights.data.
  const std::string decode = "--fix-dim decoder_decode:seq=1 --fix-dim decoder_decode:past=15";
  for (const std::string& options :
       std::vector<std::string>{decode, "--external-initializers-file weights.data", decode + " --target-cpu avx2"}) {
    SCOPED_TRACE("options '" + options + "'");
    TempDir dir;
    const auto one = share_in(dir.path() / "a", dir.path() / "a", dir.path() / "a" / "out", 1, options);
    const fs::path deep = dir.path() / "b" / "deeper" / "models";
    const auto two = share_in(deep, dir.path() / "b", dir.path() / "elsewhere", 2, options);
    expect_same_files(one, two);
    EXPECT_TRUE(one.count("decoder_prefill_ref.bin"));
    const bool external = options.find("external") != std::string::npos;
    EXPECT_EQ(one.size(), mixed_group().size() + 1 + (external ? 1 : 0));
    if (external) {
      EXPECT_GT(one.at("weights.data").size(), 100000u);
    }
  }
}

}  // namespace
}  // namespace ctxgen::testing

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

// Objects too: each model's object, made in another folder on another number of threads, is the
// same file.
TEST(Reproducible, AnObjectIsTheSameByteForByteInAnotherFolderOnAnotherNumberOfThreads) {
  TempDir dir;
  for (const auto& model : mixed_group()) {
    SCOPED_TRACE(model.filename().string());
    const std::string stem = model.stem().string();
    const std::string dims = stem == "decoder_decode"                  ? " --fix-dim seq=1 --fix-dim past=15"
                             : stem.rfind("decoder_prefill", 0) == 0 ? " --fix-dim seq=16"
                                                                     : "";
    std::map<std::string, std::string> made[2];
    for (int threads = 1; threads <= 2; ++threads) {
      const fs::path folder = dir.path() / model.stem() / (threads == 1 ? "a" : "b/deeper");
      fs::create_directories(folder);
      fs::copy_file(model, folder / model.filename(), fs::copy_options::overwrite_existing);
      const auto r = run_command("cd " + quote(folder) + " && OMP_NUM_THREADS=" + std::to_string(threads) + " " +
                                 CTXGEN_BINARY + " compile " + model.filename().string() + " --fix-dim batch=1" + dims + " --object " +
                                 quote(folder / "out" / "model.ctxo") + " -q");
      ASSERT_EQ(r.exit_code, 0) << r.output;
      made[threads - 1] = file_contents(folder / "out");
    }
    expect_same_files(made[0], made[1]);
  }
}

}  // namespace
}  // namespace ctxgen::testing

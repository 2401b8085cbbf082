// `ctxgen compile|share --ep-lib LIB --ep NAME`: any plugin EP compiles through ONNX Runtime's Compile
// API, and ctxgen publishes what it wrote as it publishes its own outputs. Driven here with
// CtxgenRef's own library, which the path treats as any other: its outputs must be what the built-in
// path writes, and they run.

#include <sys/stat.h>

#include <gtest/gtest.h>

#include <chrono>

#include <nlohmann/json.hpp>

#include <set>
#include <utility>
#include <vector>

#include "ort_harness.h"
#include "test_util.h"

namespace fs = std::filesystem;

namespace ctxgen::ort_test {
namespace {

using testing::quote;

testing::CommandResult ctxgen(const std::string& args) {
  return testing::run_command(std::string(CTXGEN_BINARY) + " " + args + " 2>&1");
}

std::string with_ep(const std::string& args) {
  return args + " --ep-lib " + quote(CTXGEN_ORT_EP_PATH) + " --ep CtxgenRef";
}

class EpLibTest : public ::testing::Test {
 protected:
  void SetUp() override { Plugin::register_library(); }
  testing::TempDir dir_;
};

TEST_F(EpLibTest, ShareThroughAPluginWritesWhatTheBuiltInPathWrites) {
  const fs::path first = copy_model("share/fallback/cpu1.onnx", dir_ / "in");
  const fs::path second = copy_model("share/fallback/cpu2.onnx", dir_ / "in");
  const std::string models = quote(first) + "," + quote(second);
  auto r = ctxgen(with_ep("share " + models + " --output-dir " + quote(dir_ / "ep") + " --report " +
                          quote(dir_ / "ep" / "report.json")));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = ctxgen("share " + models + " --output-dir " + quote(dir_ / "cli"));
  ASSERT_EQ(r.exit_code, 0) << r.output;

  EXPECT_EQ(files_in(dir_ / "ep"),
            (std::set<std::string>{"cpu1_ctx.onnx", "cpu2_ctx.onnx", "cpu1_ref.bin", "report.json"}));
  EXPECT_EQ(testing::read_file(dir_ / "ep" / "cpu1_ref.bin"), testing::read_file(dir_ / "cli" / "cpu1_ref.bin"));
  const auto report = nlohmann::json::parse(testing::read_file(dir_ / "ep" / "report.json"));
  EXPECT_EQ(report["status"], "ok");
  EXPECT_EQ(report["backend"], "CtxgenRef");
  EXPECT_EQ(report["models"].size(), 2u);
  EXPECT_EQ(report["models"][0]["partitions"].size(), 2u);
  EXPECT_EQ(report["outputs"].size(), 3u);  // the binary and the two models; the report describes them

  Ort::SessionOptions shared = plugin_options({{"ep.share_ep_contexts", "1"}});
  Ort::Session a = open_session(dir_ / "ep" / "cpu1_ctx.onnx", shared);
  Ort::Session b = open_session(dir_ / "ep" / "cpu2_ctx.onnx", shared);
  expect_matches_original(a, first);
  expect_matches_original(b, second);
}

// The exported prefill/decode pair (testdata/exports), each model with its own dims: the same
// binary, byte for byte, as the built-in path writes. So do its 4-bit variants at opset 21
// (int4 through DequantizeLinear; MatMulNBits and GatherBlockQuantized), whose every Cast ONNX
// Runtime hands the EP with opset 19's `saturate`.
TEST_F(EpLibTest, AnExportedPairGivesTheBuiltInPathsBinary) {
  const fs::path testdata = fs::path(CTXGEN_SOURCE_DIR) / "testdata";
  for (const auto& [dir, suffix] : std::vector<std::pair<std::string, std::string>>{
           {"exports", ""}, {"quantized", "_qdq_int4"}, {"quantized", "_matmulnbits"}}) {
    SCOPED_TRACE(dir + suffix);
    const std::string prefill = "decoder_prefill" + suffix, decode = "decoder_decode" + suffix;
    const std::string args = "share " + quote(testdata / dir / (prefill + ".onnx")) + "," + quote(testdata / dir / (decode + ".onnx")) +
                             " --fix-dim batch=1 --fix-dim " + prefill + ":seq=16 --fix-dim " + decode + ":seq=1 --fix-dim " +
                             decode + ":past=15 -q --force --output-dir ";
    auto r = ctxgen(with_ep(args + quote(dir_ / "ep")));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    r = ctxgen(args + quote(dir_ / "cli"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(testing::read_file(dir_ / "ep" / (prefill + "_ref.bin")), testing::read_file(dir_ / "cli" / (prefill + "_ref.bin")));
  }
}

// The provider option cache_dir: CtxgenRef compiling an ordinary model in a session keeps each
// partition in the compile cache and takes it from there in a later session, writing the binary
// the built-in path writes either way.
TEST_F(EpLibTest, TheCacheDirOptionKeepsAndReusesPartitions) {
  const fs::path model = fs::path(CTXGEN_SOURCE_DIR) / "testdata" / "exports" / "decoder_prefill.onnx";
  const fs::path cache = dir_ / "cache";
  const std::string args = "compile " + quote(model) + " --fix-dim batch=1 --fix-dim seq=16 -q --force --output-dir ";
  auto r = ctxgen(args + quote(dir_ / "cli"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string built_in = testing::read_file(dir_ / "cli" / "decoder_prefill_ref.bin");
  std::vector<fs::path> entries;
  for (int run = 0; run < 2; ++run) {
    SCOPED_TRACE(run == 0 ? "cold" : "warm");
    r = ctxgen(with_ep(args + quote(dir_ / "ep") + " --ep-option cache_dir=" + cache.string()));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_TRUE(testing::read_file(dir_ / "ep" / "decoder_prefill_ref.bin") == built_in);
    if (run == 0) {
      for (const auto& e : fs::recursive_directory_iterator(cache / "entries"))
        if (e.is_regular_file()) entries.push_back(e.path());
      ASSERT_FALSE(entries.empty());
      // Marked long unused: the warm session's hit marks each used again.
      for (const fs::path& e : entries) fs::last_write_time(e, fs::file_time_type::clock::now() - std::chrono::hours(48));
    }
  }
  for (const fs::path& e : entries)
    EXPECT_GT(fs::last_write_time(e), fs::file_time_type::clock::now() - std::chrono::hours(1)) << e << " was not taken";
}

TEST_F(EpLibTest, CompileTakesFixedDimsOutputPathsAndEmbedding) {
  const fs::path dynamic = copy_model("dynamic.onnx", dir_ / "in");
  auto r = ctxgen(with_ep("compile " + quote(dynamic) + " --fix-dim batch=3 -o " + quote(dir_ / "out" / "m.onnx") +
                          " --embed -q"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(files_in(dir_ / "out"), (std::set<std::string>{"m.onnx"}));
  Ort::Session session = open_session(dir_ / "out" / "m.onnx", plugin_options());
  expect_matches_original(session, dynamic);
}

TEST_F(EpLibTest, FailuresExitAsTheBuiltInPathDoesAndLeaveNothing) {
  const fs::path cnn = copy_model("cnn.onnx", dir_ / "in");
  const fs::path unsupported = copy_model("unsupported.onnx", dir_ / "in");
  const std::string out = " --output-dir " + quote(dir_ / "out");

  auto r = ctxgen(with_ep("compile " + quote(unsupported) + out));
  EXPECT_EQ(r.exit_code, 4) << r.output;
  EXPECT_NE(r.output.find("pass --allow-empty"), std::string::npos) << r.output;
  EXPECT_TRUE(!fs::exists(dir_ / "out") || files_in(dir_ / "out").empty()) << "a failed run left files";
  r = ctxgen(with_ep("compile " + quote(unsupported) + out + " --allow-empty -q"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(files_in(dir_ / "out"), (std::set<std::string>{"unsupported_ctx.onnx"}));

  ASSERT_EQ(ctxgen(with_ep("compile " + quote(cnn) + out + " -q")).exit_code, 0);
  const std::string before = testing::read_file(dir_ / "out" / "cnn_ref.bin");
  r = ctxgen(with_ep("compile " + quote(cnn) + out));
  EXPECT_EQ(r.exit_code, 5) << r.output;
  EXPECT_NE(r.output.find("output exists already; remove it or pass --force"), std::string::npos) << r.output;
  EXPECT_EQ(testing::read_file(dir_ / "out" / "cnn_ref.bin"), before);
  EXPECT_EQ(ctxgen(with_ep("compile " + quote(cnn) + out + " --force -q")).exit_code, 0);
  EXPECT_EQ(files_in(dir_ / "out"), (std::set<std::string>{"unsupported_ctx.onnx", "cnn_ctx.onnx", "cnn_ref.bin"}))
      << "a staging folder was left behind";

  r = ctxgen("compile " + quote(cnn) + out + " --ep-lib " + quote(CTXGEN_ORT_EP_PATH) + " --ep NoSuchEp --force");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--ep NoSuchEp: no device of ONNX Runtime offers that EP (offered: "), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("CtxgenRef"), std::string::npos) << r.output;
  // A library is checked before the loader sees it: not one (a model), a FIFO (the loader would
  // wait for a writer), a truncated copy (it would die of SIGBUS mapping past the end).
  r = ctxgen("compile " + quote(cnn) + out + " --ep-lib " + quote(cnn) + " --ep CtxgenRef --force");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--ep-lib " + cnn.string() + ": not a shared library (no ELF header)"), std::string::npos) << r.output;
  ASSERT_EQ(::mkfifo((dir_ / "in" / "fifo.so").c_str(), 0600), 0);
  r = ctxgen("compile " + quote(cnn) + out + " --ep-lib " + quote(dir_ / "in" / "fifo.so") + " --ep CtxgenRef --force");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("fifo.so: not a regular file"), std::string::npos) << r.output;
  const std::string library = testing::read_file(CTXGEN_ORT_EP_PATH);
  testing::write_file(dir_ / "in" / "truncated.so", library.substr(0, library.size() / 2));
  r = ctxgen("compile " + quote(cnn) + out + " --ep-lib " + quote(dir_ / "in" / "truncated.so") + " --ep CtxgenRef --force");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("truncated.so: truncated ("), std::string::npos) << r.output;
  EXPECT_EQ(files_in(dir_ / "out"), (std::set<std::string>{"unsupported_ctx.onnx", "cnn_ctx.onnx", "cnn_ref.bin"}));
  // A relative name is a file of the current folder, not one of the loader's search path.
  testing::write_file(dir_ / "in" / "mine.so", library);
  r = testing::run_command("cd " + quote(dir_ / "in") + " && " + CTXGEN_BINARY + " compile cnn.onnx --ep-lib mine.so --ep CtxgenRef" +
                           out + " --force -q 2>&1");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  // verify's --plugin is opened the same way.
  r = ctxgen("verify " + quote(dir_ / "out" / "cnn_ctx.onnx") + " --reference " + quote(cnn) + " --plugin " +
             quote(dir_ / "in" / "truncated.so"));
  EXPECT_EQ(r.exit_code, 9) << r.output;
  EXPECT_NE(r.output.find("the plugin EP library " + (dir_ / "in" / "truncated.so").string() + ": truncated ("), std::string::npos)
      << r.output;
  r = ctxgen("compile " + quote(cnn) + out + " --ep CtxgenRef");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("need --ep-lib LIB"), std::string::npos) << r.output;
  r = ctxgen(with_ep("compile " + quote(cnn) + out + " -e ref"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  r = ctxgen(with_ep("compile " + quote(cnn) + out + " --ep-option novalue --force"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--ep-option 'novalue': give KEY=VALUE"), std::string::npos) << r.output;
  r = ctxgen(with_ep("compile " + quote(cnn) + out + " --fix-dim bacth=1 --force"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--fix-dim bacth: no dimension of that name in the model's inputs"), std::string::npos)
      << r.output;
  r = ctxgen(with_ep("compile " + quote(cnn) + out + " --session-config ep.context_embed_mode=1 --force"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--session-config ep.context_embed_mode: ctxgen sets it (give --embed)"), std::string::npos)
      << r.output;
  // --cache keeps what a built-in backend compiles; given with --ep-lib it is a usage error.
  r = ctxgen(with_ep("compile " + quote(cnn) + out + " --cache " + quote(dir_ / "cache") + " --force"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--cache keeps what a built-in backend compiles"), std::string::npos) << r.output;
  // The EP itself refuses what it does not know (CtxgenRef has one provider option, cache_dir); ORT
  // reports it as the EP failing to start, exit 9.
  r = ctxgen(with_ep("compile " + quote(cnn) + out + " --ep-option threads=4 --force"));
  EXPECT_EQ(r.exit_code, 9) << r.output;
  EXPECT_NE(r.output.find("CtxgenRef takes one provider option, cache_dir; got 'threads=4'"), std::string::npos) << r.output;
  // What ONNX Runtime cannot hold is a usage error naming the option, not an internal error.
  r = ctxgen(with_ep("compile " + quote(cnn) + out + " --ep-option key=" + std::string(9000, 'v') + " --force"));
  EXPECT_EQ(r.exit_code, 2) << r.output.substr(0, 400);
  EXPECT_NE(r.output.find("--ep-option: ONNX Runtime refuses the EP's options: "), std::string::npos) << r.output.substr(0, 400);
  r = ctxgen(with_ep("compile " + quote(cnn) + out + " --session-config " + std::string(1100, 'k') + "=1 --force"));
  EXPECT_EQ(r.exit_code, 2) << r.output.substr(0, 400);
  EXPECT_NE(r.output.find("...: ONNX Runtime refuses it: "), std::string::npos) << r.output.substr(0, 400);
  r = ctxgen(with_ep("compile " + quote(cnn) + out + " --stop-after partition"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--stop-after cannot be used with --ep-lib"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace ctxgen::ort_test

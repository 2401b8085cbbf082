// --target-cpu: a compile for a CPU level writes what a compile on a CPU of that level writes, and
// the runtime runs a binary of any level its own includes (slower than one of its own level) and
// refuses one of a level it does not include, naming both.

#include <regex>
#include <set>

#include "e2e.h"

namespace ctxgen::testing {
namespace {

// The level a binary is packed for, as inspect shows it: "avx2" of "x86_64 avx2, oneDNN 2.6.3".
std::string level_of(const fs::path& binary) {
  const auto r = ctxgen("inspect " + quote(binary));
  std::smatch found;
  if (!std::regex_search(r.output, found, std::regex(", [a-z0-9_]+ ([a-z0-9_]+), oneDNN"))) return "";
  return found[1];
}

TEST(TargetCpu, CompilesWhatACompileOnACpuOfThatLevelWrites) {
  TempDir dir;
  const fs::path cnn = copy_model("cnn.onnx", dir.path());
  auto r = ctxgen("compile " + quote(cnn) + " --target-cpu avx2 --output-dir " + quote(dir / "option"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // oneDNN's own environment variable makes it choose as a CPU of that level does.
  r = run_command("ONEDNN_MAX_CPU_ISA=AVX2 " + std::string(CTXGEN_BINARY) + " compile " + quote(cnn) + " --output-dir " +
                  quote(dir / "environment"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(level_of(dir / "option" / "cnn_ref.bin"), "avx2");
  EXPECT_EQ(read_file(dir / "option" / "cnn_ref.bin"), read_file(dir / "environment" / "cnn_ref.bin"));
  EXPECT_EQ(read_file(dir / "option" / "cnn_ctx.onnx"), read_file(dir / "environment" / "cnn_ctx.onnx"));

  // A manifest names the level too; the command line's wins.
  write_file(dir / "group.json", R"({"models": [{"path": "cnn.onnx"}], "target_cpu": "sse41", "output_dir": "manifest"})");
  r = ctxgen("share --manifest " + quote(dir / "group.json"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(level_of(dir / "manifest" / "cnn_ref.bin"), "sse41");
  r = ctxgen("share --manifest " + quote(dir / "group.json") + " --target-cpu avx --force");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(level_of(dir / "manifest" / "cnn_ref.bin"), "avx");
}

// Several levels: one compile each (a process of its own, as oneDNN takes one level a process),
// level L's outputs in OUT/L/, all published together or none.
TEST(TargetCpu, SeveralLevelsGoInAFolderEachAllOrNothing) {
  TempDir dir;
  const fs::path cnn = copy_model("cnn.onnx", dir.path());
  ASSERT_EQ(ctxgen("compile " + quote(cnn) + " --target-cpu avx2 --output-dir " + quote(dir / "one")).exit_code, 0);
  fs::create_directories(dir / "out" / "avx2" / ".targets.ctxgen-999999.tmp");
  write_file(dir / "out" / "avx2" / ".targets.ctxgen-999999.tmp" / "cnn_ref.bin", "a killed run's leftover");
  auto r = ctxgen("compile " + quote(cnn) + " --target-cpu avx2,sse41 --output-dir " + quote(dir / "out") + " --report r.json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(files_in(dir / "out" / "avx2"), (std::set<std::string>{"cnn_ctx.onnx", "cnn_ref.bin", "r.json"}));
  EXPECT_EQ(files_in(dir / "out" / "sse41"), (std::set<std::string>{"cnn_ctx.onnx", "cnn_ref.bin", "r.json"}));
  EXPECT_EQ(read_file(dir / "out" / "avx2" / "cnn_ref.bin"), read_file(dir / "one" / "cnn_ref.bin"));
  EXPECT_EQ(level_of(dir / "out" / "sse41" / "cnn_ref.bin"), "sse41");
  EXPECT_NE(r.output.find("[--target-cpu sse41]"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("wrote " + (dir / "out" / "sse41" / "cnn_ref.bin").string()), std::string::npos) << r.output;
  const std::string report = read_file(dir / "out" / "sse41" / "r.json");
  EXPECT_NE(report.find((dir / "out" / "sse41" / "cnn_ctx.onnx").string()), std::string::npos) << report;
  EXPECT_EQ(report.find(".targets.ctxgen-"), std::string::npos) << "the report names the files where they are";

  // An existing output stops the run before any level compiles; --force replaces them all.
  r = ctxgen("compile " + quote(cnn) + " --target-cpu sse41,avx2 --output-dir " + quote(dir / "out"));
  EXPECT_EQ(r.exit_code, 5) << r.output;
  EXPECT_EQ(r.output.find("[--target-cpu"), std::string::npos) << r.output;
  EXPECT_EQ(ctxgen("compile " + quote(cnn) + " --target-cpu sse41,avx2 --output-dir " + quote(dir / "out") + " --force").exit_code, 0);

  // A level that fails leaves nothing of the others.
  r = ctxgen("compile " + quote(cnn) + " --target-cpu avx2,avx3 --output-dir " + quote(dir / "failed"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--target-cpu avx3: no such CPU level"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dir / "failed" / "avx2" / "cnn_ref.bin"));
  EXPECT_TRUE(!fs::exists(dir / "failed") || files_in(dir / "failed").empty());

  for (const auto& [options, message] :
       std::vector<std::pair<std::string, std::string>>{{"--target-cpu avx2,avx2", "avx2 is given twice"},
                                                        {"--target-cpu avx2,", "an empty level in the list"},
                                                        {"--target-cpu avx2,sse41 -o m.onnx", "give --output-dir, not -o"}}) {
    r = ctxgen("compile " + quote(cnn) + " " + options);
    EXPECT_EQ(r.exit_code, 2) << options << "\n" << r.output;
    EXPECT_NE(r.output.find(message), std::string::npos) << r.output;
  }
}

TEST(TargetCpu, AnUnknownLevelIsAUsageError) {
  TempDir dir;
  const fs::path cnn = copy_model("cnn.onnx", dir.path());
  const auto r = ctxgen("compile " + quote(cnn) + " --target-cpu avx3 --output-dir " + quote(dir / "out"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--target-cpu avx3: no such CPU level (oneDNN's: sse41, avx, avx2, avx2_vnni, avx512_core"),
            std::string::npos)
      << r.output;
  EXPECT_FALSE(fs::exists(dir / "out"));
}

// Another level's layouts come from the helper: one that is missing, ends at once, or is of another
// ctxgen fails the compile (exit 1), naming it, instead of a binary whose convolutions kept their
// plain weights as if oneDNN could not run them at that level.
TEST(TargetCpu, AHelperThatCannotAnswerFailsTheCompile) {
  TempDir dir;
  const fs::path cnn = copy_model("cnn.onnx", dir.path());
  write_file(dir / "old_helper.py", "import os, struct\n"
                                    "text = b'0.0.1\\nx86_64 avx2, oneDNN 2.6.3\\x00'\n"
                                    "os.write(0, b'\\x00' + struct.pack('<Q', len(text)) + text)\n"
                                    "os.read(0, 1)\n");
  write_file(dir / "old_helper", "#!/bin/sh\nexec " + std::string(CTXGEN_PYTHON) + " " + (dir / "old_helper.py").string() + "\n");
  fs::permissions(dir / "old_helper", fs::perms::owner_all);
  for (const auto& [helper, said] : std::vector<std::pair<std::string, std::string>>{
           {(dir / "missing").string(), "cannot start " + (dir / "missing").string()},
           {"/bin/true", "ctxgen-cpu-level avx2 ended, or did not answer within 120 s"},
           {(dir / "old_helper").string(), "is the helper of ctxgen 0.0.1, not of this ctxgen"}}) {
    const auto r = run_command("CTXGEN_CPU_LEVEL_HELPER=" + quote(helper) + " " + std::string(CTXGEN_BINARY) + " compile " +
                               quote(cnn) + " --target-cpu avx2 --output-dir " + quote(dir / "out"));
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_NE(r.output.find(said), std::string::npos) << r.output;
    EXPECT_FALSE(fs::exists(dir / "out" / "cnn_ref.bin"));
  }
}

// This machine's level includes sse41 (every x86-64 CPU oneDNN runs on does); ONEDNN_MAX_CPU_ISA
// makes it a CPU of that level alone, which includes no higher one.
TEST(TargetCpu, ALowerLevelRunsAndAHigherOneIsRefusedNamingBoth) {
  TempDir dir;
  const fs::path cnn = copy_model("cnn.onnx", dir.path());
  ASSERT_EQ(ctxgen("compile " + quote(cnn) + " --target-cpu sse41 --output-dir " + quote(dir / "low")).exit_code, 0);
  ASSERT_EQ(ctxgen("compile " + quote(cnn) + " --output-dir " + quote(dir / "host")).exit_code, 0);
  const std::string host = level_of(dir / "host" / "cnn_ref.bin");
  ASSERT_NE(host, "sse41") << "this test needs a CPU above sse41";

  auto r = ctxgen("verify " + quote(dir / "low" / "cnn_ctx.onnx") + " --reference " + quote(cnn));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("runs here, though hardware_architecture is 'x86_64 sse41, oneDNN"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("compiled for this CPU's level it would run faster"), std::string::npos) << r.output;

  r = run_command("ONEDNN_MAX_CPU_ISA=SSE41 " + std::string(CTXGEN_BINARY) + " verify " +
                  quote(dir / "host" / "cnn_ctx.onnx") + " --reference " + quote(cnn));
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("packed for " + host + ", a level this CPU's (x86_64 sse41, oneDNN"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("(ctxgen --target-cpu sse41)"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace ctxgen::testing

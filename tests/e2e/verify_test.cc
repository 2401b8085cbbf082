// `ctxgen verify`: integrity of compiled artifacts, and their outputs in ONNX Runtime against the
// original model's outputs on ORT's CPU EP.

#include <sys/stat.h>

#include <nlohmann/json.hpp>

#include "ctxgen/format.h"
#include "e2e.h"

namespace ctxgen::testing {
namespace {

fs::path compiled(const std::string& model, const TempDir& dir, const std::string& extra = "") {
  fs::path in = copy_model(model, dir.path());
  auto r = ctxgen("compile " + quote(in) + " " + extra);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return dir / (fs::path(model).stem().string() + "_ctx.onnx");
}

TEST(Verify, CompiledModelsMatchTheirOriginals) {
  for (const char* model : {"cnn.onnx", "islands.onnx", "subgraph.onnx", "external.onnx", "constants.onnx"}) {
    TempDir dir;
    fs::path ctx = compiled(model, dir);
    auto r = ctxgen("verify " + quote(ctx) + " --reference " + quote(dir / model));
    EXPECT_EQ(r.exit_code, 0) << model << ":\n" << r.output;
    EXPECT_NE(r.output.find("loads in ONNX Runtime with CtxgenRef"), std::string::npos) << r.output;
    for (const char* shown : {"against the float32 reference, |reference| max", "abs err max", "rel err max",
                              "outside tolerance", "cosine", "SNR"})
      EXPECT_NE(r.output.find(shown), std::string::npos) << shown << "\n" << r.output;
    // In float64 too, next to the original's own float32 error; the ops ONNX Runtime runs in
    // float32 only (Conv, its pools) stay float32 and are named.
    r = ctxgen("verify " + quote(ctx) + " --reference " + quote(dir / model) + " --reference-precision float64");
    EXPECT_EQ(r.exit_code, 0) << model << ":\n" << r.output;
    EXPECT_NE(r.output.find(std::string(model) == "cnn.onnx"
                                ? "against the float64 (Conv, GlobalAveragePool in float32: no float64 kernel) reference"
                                : "against the float64 reference"),
              std::string::npos)
        << r.output;
    EXPECT_NE(r.output.find("times the rounding allowance"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("the original in float32 on ONNX Runtime's CPU EP: abs err max"), std::string::npos) << r.output;
  }
}

// ONNX Runtime's Linux build records each session under ~/.cache/Microsoft (or $XDG_CACHE_HOME) and
// leaves $TMPDIR/mat-debug-PID.log unless told not to; ctxgen's own host tells it not to, and leaves
// a user's ORT_DISABLE_TELEMETRY as they set it. ONNX Runtime also stays silent on its own when it
// sees one of the CI variables below (the names its library holds), so both runs go without them:
// in CI the run with telemetry on would otherwise write nothing, and the check would prove nothing.
TEST(Verify, LeavesNoOnnxRuntimeTelemetryBehind) {
  TempDir dir;
  const fs::path ctx = compiled("cnn.onnx", dir);
  std::string not_ci = "env -u XDG_CACHE_HOME";
  for (const char* name : {"CI", "TF_BUILD", "GITHUB_ACTIONS", "GITLAB_CI", "CIRCLECI", "TRAVIS", "JENKINS_URL",
                           "CODEBUILD_BUILD_ID", "BUILDKITE", "TEAMCITY_VERSION", "APPVEYOR", "BITBUCKET_BUILD_NUMBER",
                           "ORT_RUNNING_UNIT_TESTS"})
    not_ci += std::string(" -u ") + name;
  const std::string verify = std::string(CTXGEN_BINARY) + " verify " + quote(ctx) + " --reference " + quote(dir / "cnn.onnx");
  const auto debug_logs = [](const fs::path& folder) {
    size_t n = 0;
    for (const auto& e : fs::directory_iterator(folder)) n += e.path().filename().string().rfind("mat-debug-", 0) == 0;
    return n;
  };
  for (const bool opted_out : {true, false}) {
    const fs::path home = dir / (opted_out ? "home" : "home_on"), tmp = dir / (opted_out ? "tmp" : "tmp_on");
    fs::create_directories(tmp);
    auto r = run_command(not_ci + " " + std::string(opted_out ? "-u ORT_DISABLE_TELEMETRY" : "ORT_DISABLE_TELEMETRY=0") +
                         " HOME=" + quote(home) + " TMPDIR=" + quote(tmp) + " " + verify);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    if (opted_out) {
      EXPECT_FALSE(fs::exists(home / ".cache" / "Microsoft")) << "ONNX Runtime wrote telemetry under HOME";
      EXPECT_EQ(debug_logs(tmp), 0u) << "ONNX Runtime left a mat-debug log in TMPDIR";
    } else {  // ORT's telemetry left on by the user: the checks above can see it
      EXPECT_TRUE(fs::exists(home / ".cache" / "Microsoft")) << "no telemetry under HOME even when on: this test checks nothing";
      EXPECT_EQ(debug_logs(tmp), 1u) << "no mat-debug log in TMPDIR even when on: this test checks nothing";
    }
  }
}

// The project's LLM sample (scripts/gen_llm_pair.py, small): its float32 rounding passes the
// defaults in both precisions, and a reference that computes something slightly different (every
// LayerNormalization's epsilon 1e-4 instead of 1e-5, an error within any float32 tolerance) is
// caught by the float64 reference, which measures rounding against the original's own.
TEST(Verify, TheLlmSamplePassesForTheRightReason) {
  TempDir dir;
  auto r = run_command(std::string(CTXGEN_PYTHON) + " " + CTXGEN_SOURCE_DIR "/scripts/gen_llm_pair.py " +
                       quote(dir.path()) + " --size-mb 4 --hidden 128");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_EQ(ctxgen("share " + quote(dir / "prefill.onnx") + "," + quote(dir / "decode.onnx")).exit_code, 0);
  const std::string models = quote(dir / "prefill_ctx.onnx") + " " + quote(dir / "decode_ctx.onnx") + " --reference " +
                             quote(dir / "prefill.onnx") + " --reference " + quote(dir / "decode.onnx");
  r = ctxgen("verify " + models);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  r = ctxgen("verify " + models + " --reference-precision float64");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("against the float64 reference"), std::string::npos) << r.output;

  r = run_command(std::string(CTXGEN_PYTHON) + " -c " +
                  quote("import onnx, sys\n"
                        "m = onnx.load(sys.argv[1], load_external_data=False)\n"
                        "for n in m.graph.node:\n"
                        "    if n.op_type == \"LayerNormalization\":\n"
                        "        n.attribute.append(onnx.helper.make_attribute(\"epsilon\", 1e-4))\n"
                        "onnx.save(m, sys.argv[2])\n") +
                  " " + quote(dir / "prefill.onnx") + " " + quote(dir / "prefill_eps.onnx"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string wrong = quote(dir / "prefill_ctx.onnx") + " --reference " + quote(dir / "prefill_eps.onnx");
  r = ctxgen("verify " + wrong);
  EXPECT_EQ(r.exit_code, 0) << "within the float32 tolerance\n" << r.output;
  r = ctxgen("verify " + wrong + " --reference-precision float64");
  EXPECT_EQ(r.exit_code, 8) << r.output;
  EXPECT_NE(r.output.find("fails: its rms error against float64"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("at most 4 times is rounding"), std::string::npos) << r.output;
  // The error line names the criterion that failed.
  EXPECT_NE(r.output.find("error: " + (dir / "prefill_ctx.onnx").string() +
                          ": output 'hidden_out' fails against the reference: its rms error against float64"),
            std::string::npos)
      << r.output;
  // A loose enough --max-error-ratio lets it through.
  EXPECT_EQ(ctxgen("verify " + wrong + " --reference-precision float64 --max-error-ratio 10000").exit_code, 0);
}

TEST(Verify, EmbeddedContextAndInputShapes) {
  TempDir dir;
  // The original's batch dimension is symbolic; the compiled model's input is [3, 8], which verify
  // feeds to both.
  fs::path ctx = compiled("dynamic.onnx", dir, "--input-shape x=3x8 --embed");
  auto r = ctxgen("verify " + quote(ctx) + " --reference " + quote(dir / "dynamic.onnx"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("embedded context"), std::string::npos) << r.output;
  // Compiled without fixing anything, the input stays dynamic in both: verify asks for a shape.
  TempDir other;
  ctx = compiled("dynamic.onnx", other, "--allow-empty");
  r = ctxgen("verify " + quote(ctx) + " --reference " + quote(other / "dynamic.onnx") + " --allow-empty");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--input-shape x="), std::string::npos) << r.output;
  r = ctxgen("verify " + quote(ctx) + " --reference " + quote(other / "dynamic.onnx") + " --input-shape x=5x8 --allow-empty");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("no EPContext node: nothing in it is compiled (--allow-empty)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("verify: 1 model(s), 2 check(s) passed, 1 of 1 output(s) within tolerance"), std::string::npos)
      << r.output;
}

// A model in which nothing is compiled (compile --allow-empty, or the original given by mistake)
// would pass every check while running nothing on the backend: verify fails it unless told.
TEST(Verify, AModelWithNothingCompiledFailsUnlessAllowed) {
  TempDir dir;
  const fs::path original = copy_model("cnn.onnx", dir.path());
  auto r = ctxgen("verify " + quote(original));
  EXPECT_EQ(r.exit_code, 8) << r.output;
  EXPECT_NE(r.output.find("cnn.onnx: holds no EPContext node of CtxgenRef: nothing in it is compiled (pass --allow-empty"),
            std::string::npos)
      << r.output;
  r = ctxgen("verify " + quote(original) + " --allow-empty");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  r = ctxgen("verify " + quote(dir / "missing_ctx.onnx"));
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_NE(r.output.find("missing_ctx.onnx: no such file"), std::string::npos) << r.output;
}

TEST(Verify, IntegrityOnlyWithoutReference) {
  TempDir dir;
  fs::path ctx = compiled("islands.onnx", dir);
  auto r = ctxgen("verify " + quote(ctx));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("3 weights re-hashed, all match"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("3 EPContext node(s)"), std::string::npos) << r.output;
}

TEST(Verify, AFlippedWeightByteFailsIntegrity) {
  TempDir dir;
  fs::path ctx = compiled("cnn.onnx", dir);
  auto binary = ContextBinary::open(dir / "cnn_ref.bin");
  uint64_t offset = binary->weights().at(1).offset;
  binary.reset();
  std::string bytes = read_file(dir / "cnn_ref.bin");
  bytes[offset] = static_cast<char>(bytes[offset] ^ 0x40);
  write_file(dir / "cnn_ref.bin", bytes);
  auto r = ctxgen("verify " + quote(ctx));
  EXPECT_EQ(r.exit_code, 8) << r.output;
  EXPECT_NE(r.output.find("weight 1"), std::string::npos) << r.output;
}

TEST(Verify, AMissingBinaryFailsIntegrity) {
  TempDir dir;
  fs::path ctx = compiled("cnn.onnx", dir);
  fs::remove(dir / "cnn_ref.bin");
  auto r = ctxgen("verify " + quote(ctx));
  EXPECT_EQ(r.exit_code, 8) << r.output;
  EXPECT_NE(r.output.find("cnn_ref.bin is missing"), std::string::npos) << r.output;
}

TEST(Verify, ABinaryBehindASymlinkLoopFailsIntegrityNamingTheCause) {
  TempDir dir;
  fs::path ctx = compiled("cnn.onnx", dir);
  fs::remove(dir / "cnn_ref.bin");
  fs::create_symlink("loop.bin", dir / "cnn_ref.bin");
  fs::create_symlink("cnn_ref.bin", dir / "loop.bin");
  auto r = ctxgen("verify " + quote(ctx));
  EXPECT_EQ(r.exit_code, 8) << r.output;
  EXPECT_NE(r.output.find("cnn_ref.bin cannot be reached: Too many levels of symbolic links"), std::string::npos) << r.output;
}

TEST(Verify, ABinaryFromAnotherCompilationFailsIntegrityNamingBothIds) {
  TempDir dir;
  fs::path ctx = compiled("cnn.onnx", dir);
  const std::string ours = ContextBinary::open(dir / "cnn_ref.bin")->content_id().hex();
  fs::create_directories(dir / "other");
  ASSERT_EQ(ctxgen("compile " + quote(ctx.parent_path() / "cnn.onnx") + " --output-dir " + quote(dir / "other") +
                   " --node-name-prefix p_").exit_code, 0);
  const std::string theirs = ContextBinary::open(dir / "other" / "cnn_ref.bin")->content_id().hex();
  ASSERT_NE(ours, theirs);
  fs::copy_file(dir / "other" / "cnn_ref.bin", dir / "cnn_ref.bin", fs::copy_options::overwrite_existing);
  auto r = ctxgen("verify " + quote(ctx));
  EXPECT_EQ(r.exit_code, 8) << r.output;
  EXPECT_NE(r.output.find("whose id is " + ours), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("has id " + theirs), std::string::npos) << r.output;
}

// ONNX Runtime's CPU EP dies of SIGFPE on the original (lowest int64 / -1); verify runs it in a
// child process, so that is an error naming the models and the signal, not a crash of ctxgen.
TEST(Verify, OnnxRuntimeCrashingOnTheOriginalIsAnError) {
#if !defined(__x86_64__)
  GTEST_SKIP() << "only x86 traps on the lowest int64 divided by -1";
#endif
  TempDir dir;
  fs::path ctx = compiled("bad/int_min_div.onnx", dir);
  auto r = ctxgen("verify " + quote(ctx) + " --reference " + quote(generated_models() / "bad" / "int_min_div.onnx"));
  EXPECT_EQ(r.exit_code, 9) << r.output;
  // (signal 8, SIGFPE; under a sanitizer its handler exits instead)
  EXPECT_NE(r.output.find("verify crashed ("), std::string::npos) << r.output;
  // ORT folds the constant Div while loading the original, so it dies in that step.
  EXPECT_NE(r.output.find("while loading " + (generated_models() / "bad" / "int_min_div.onnx").string() +
                          " in ONNX Runtime's CPU EP"), std::string::npos) << r.output;
  r = ctxgen("verify " + quote(ctx));  // the compiled model alone is fine: ctxgen folded the division
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

TEST(Verify, AFifoAsTheContextBinaryIsRefusedWithoutWaiting) {
  TempDir dir;
  fs::path ctx = compiled("cnn.onnx", dir);
  fs::remove(dir / "cnn_ref.bin");
  ASSERT_EQ(::mkfifo((dir / "cnn_ref.bin").c_str(), 0600), 0);
  auto r = run_command("timeout 20 " + std::string(CTXGEN_BINARY) + " verify " + quote(ctx));
  EXPECT_EQ(r.exit_code, 8) << r.output;
  EXPECT_NE(r.output.find("not a regular file"), std::string::npos) << r.output;
}

// The weights CPU nodes read from --external-initializers-file are tied to the models too: a file
// with other bytes (another run's, or a damaged one) is refused naming both ids.
TEST(Verify, AnExternalWeightsFileOfAnotherCompilationFailsIntegrity) {
  TempDir dir;
  fs::path a = generated_models() / "share/fallback/cpu1.onnx", b = generated_models() / "share/fallback/cpu2.onnx";
  ASSERT_EQ(ctxgen("share " + quote(a) + "," + quote(b) + " --external-initializers-file w.data --output-dir " +
                   quote(dir.path())).exit_code, 0);
  auto r = ctxgen("verify " + quote(dir / "cpu1_ctx.onnx") + " --reference " + quote(a));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("w.data: the external weights file the model was written with"), std::string::npos) << r.output;
  write_file(dir / "w.data", read_file(dir / "w.data") + std::string(64, '\0'));
  r = ctxgen("verify " + quote(dir / "cpu1_ctx.onnx"));
  EXPECT_EQ(r.exit_code, 8) << r.output;
  EXPECT_NE(r.output.find("was written with the external weights file whose id is "), std::string::npos) << r.output;
}

// Only models that read the weights file record its id: one whose nodes all compiled verifies too.
TEST(Verify, AGroupWhereOneModelNeedsNoExternalWeights) {
  TempDir dir;
  fs::path cnn = copy_model("cnn.onnx", dir / "in"), cpu = generated_models() / "share/fallback/cpu1.onnx";
  ASSERT_EQ(ctxgen("share " + quote(cnn) + "," + quote(cpu) + " --external-initializers-file w.data --output-dir " +
                   quote(dir / "out")).exit_code, 0);
  auto r = ctxgen("verify " + quote(dir / "out" / "cnn_ctx.onnx") + " " + quote(dir / "out" / "cpu1_ctx.onnx") +
                  " --reference " + quote(cnn) + " --reference " + quote(cpu));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(load_proto(dir / "out" / "cnn_ctx.onnx").metadata_props_size(),
            load_proto(dir / "out" / "cpu1_ctx.onnx").metadata_props_size() - 1)
      << "only cpu1 records the weights file";
}

TEST(Verify, DifferentWeightsAreAMismatchNamingTheOutput) {
  TempDir dir;
  fs::path tuned = dir / "tuned.onnx";
  fs::copy_file(generated_models() / "share/partial/tuned.onnx", tuned);
  ASSERT_EQ(ctxgen("compile " + quote(tuned)).exit_code, 0);
  auto r = ctxgen("verify " + quote(dir / "tuned_ctx.onnx") + " --reference " +
                  quote(generated_models() / "share/partial/base.onnx"));
  EXPECT_EQ(r.exit_code, 8) << r.output;
  EXPECT_NE(r.output.find("FAIL"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("output 'y'"), std::string::npos) << r.output;
  EXPECT_LT(r.output.find("FAIL"), r.output.find("error: ")) << "the results, then why they fail\n" << r.output;
}

// verify and inspect find a context binary as the plugin EP does, inside the model's folder: a
// path leading out of it (here "../cnn_ref.bin", the binary moved up a folder) is refused by all.
TEST(Verify, AContextBinaryOutsideTheModelFolderIsRefusedAsThePluginRefusesIt) {
  TempDir dir;
  const fs::path ctx = compiled("cnn.onnx", dir);
  fs::create_directories(dir / "m");
  fs::rename(ctx, dir / "m" / "cnn_ctx.onnx");
  auto r = run_command(std::string(CTXGEN_PYTHON) + " -c " +
                       quote("import onnx, sys\n"
                             "m = onnx.load(sys.argv[1])\n"
                             "for n in m.graph.node:\n"
                             "    for a in n.attribute:\n"
                             "        if a.name == \"ep_cache_context\": a.s = b\"../cnn_ref.bin\"\n"
                             "onnx.save(m, sys.argv[1])\n") +
                       " " + quote(dir / "m" / "cnn_ctx.onnx"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string refusal = "ep_cache_context '../cnn_ref.bin' contains '..'; it must not point outside the model folder";
  r = ctxgen("verify " + quote(dir / "m" / "cnn_ctx.onnx"));
  EXPECT_EQ(r.exit_code, 8) << r.output;
  EXPECT_NE(r.output.find(refusal), std::string::npos) << r.output;
  r = ctxgen("inspect " + quote(dir / "m" / "cnn_ctx.onnx"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find(refusal), std::string::npos) << r.output;
}

// Models float64 cannot or should not judge, and a float16 input: each gets a sensible verdict.
TEST(Verify, WhatAFloat64ReferenceLeavesToFloat32) {
  TempDir dir;
  auto r = run_command(std::string(CTXGEN_PYTHON) + " -c " +
                       quote("import onnx, sys\n"
                             "from onnx import helper as h, TensorProto as T\n"
                             "def save(name, nodes, ins, outs, inits=()):\n"
                             "    g = h.make_graph(nodes, name, ins, outs, list(inits))\n"
                             "    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid(\"\", 17)]), sys.argv[1] + \"/\" + name + \".onnx\")\n"
                             "x = h.make_tensor_value_info(\"x\", T.FLOAT, [4, 8])\n"
                             "# ArgMax over [x, x + 1e-9]: a tie in float32, not in float64\n"
                             "save(\"tie\", [h.make_node(\"Add\", [\"x\", \"e\"], [\"x2\"]),\n"
                             "                h.make_node(\"Unsqueeze\", [\"x\", \"a\"], [\"u1\"]), h.make_node(\"Unsqueeze\", [\"x2\", \"a\"], [\"u2\"]),\n"
                             "                h.make_node(\"Concat\", [\"u1\", \"u2\"], [\"c\"], axis=0), h.make_node(\"ArgMax\", [\"c\"], [\"y\"], axis=0, keepdims=0)],\n"
                             "     [x], [h.make_tensor_value_info(\"y\", T.INT64, [4, 8])],\n"
                             "     [h.make_tensor(\"e\", T.FLOAT, [], [1e-9]), h.make_tensor(\"a\", T.INT64, [1], [0])])\n"
                             "save(\"random\", [h.make_node(\"RandomUniformLike\", [\"x\"], [\"r\"], seed=1.0), h.make_node(\"Add\", [\"x\", \"r\"], [\"y\"])],\n"
                             "     [x], [h.make_tensor_value_info(\"y\", T.FLOAT, [4, 8])])\n"
                             "# Conv -> Conv -> pool, all without float64 kernels, beside a value named as verify names the float32 twins\n"
                             "w = h.make_tensor(\"w\", T.FLOAT, [1, 1, 1, 1], [0.5])\n"
                             "save(\"chain\", [h.make_node(\"Identity\", [\"x4\"], [\"x4/float32\"]),\n"
                             "                  h.make_node(\"Conv\", [\"x4/float32\", \"w\"], [\"c1\"]), h.make_node(\"Conv\", [\"c1\", \"w\"], [\"c2\"]),\n"
                             "                  h.make_node(\"GlobalAveragePool\", [\"c2\"], [\"y\"])],\n"
                             "     [h.make_tensor_value_info(\"x4\", T.FLOAT, [1, 1, 4, 4])], [h.make_tensor_value_info(\"y\", T.FLOAT, [1, 1, 1, 1]),\n"
                             "      h.make_tensor_value_info(\"c1\", T.FLOAT, [1, 1, 4, 4])], [w])\n"
                             "save(\"half\", [h.make_node(\"Cast\", [\"x16\"], [\"x32\"], to=T.FLOAT), h.make_node(\"Relu\", [\"x32\"], [\"y\"])],\n"
                             "     [h.make_tensor_value_info(\"x16\", T.FLOAT16, [4, 8])], [h.make_tensor_value_info(\"y\", T.FLOAT, [4, 8])])\n") +
                       " " + quote(dir.path()));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* name : {"tie", "random", "half", "chain"}) {
    ASSERT_EQ(ctxgen("compile " + quote(dir / (std::string(name) + ".onnx")) + " --allow-empty").exit_code, 0) << name;
    const std::string args =
        quote(dir / (std::string(name) + "_ctx.onnx")) + " --reference " + quote(dir / (std::string(name) + ".onnx"));
    r = ctxgen("verify " + args);
    EXPECT_EQ(r.exit_code, 0) << name << "\n" << r.output;
    r = ctxgen("verify " + args + " --reference-precision float64");
    EXPECT_EQ(r.exit_code, 0) << name << "\n" << r.output;
    // Integers must equal the float32 run, which float64 may tie-break otherwise; random draws
    // differ in float64; a float16 input is fed and the rest widened.
    const std::string expected =
        std::string(name) == "tie"      ? "output 'y' [4x8] against the float32 (integers and booleans must equal the original's float32 run) reference"
        : std::string(name) == "random" ? "no float64 run: it draws random numbers (RandomUniformLike)"
        : std::string(name) == "chain"  ? "against the float64 (Conv, GlobalAveragePool in float32: no float64 kernel) reference"
                                        : "against the float64 reference";
    EXPECT_NE(r.output.find(expected), std::string::npos) << name << "\n" << r.output;
  }
}

const fs::path kVerifySchema = fs::path(CTXGEN_SOURCE_DIR) / "docs/verify-schema.json";

// verify --json alone on standard output.
nlohmann::json verify_json(const std::string& args, int expected_exit) {
  auto r = run_command("(" + std::string(CTXGEN_BINARY) + " verify " + args + " --json 2>/dev/null)");
  EXPECT_EQ(r.exit_code, expected_exit) << r.output;
  expect_valid_json(kVerifySchema, "-", r.output);
  auto json = nlohmann::json::parse(r.output, nullptr, false);
  EXPECT_FALSE(json.is_discarded()) << r.output;
  return json;
}

TEST(Verify, JsonOnSuccessOnMismatchAndOnAFailedCheck) {
  TempDir dir;
  fs::path ctx = compiled("cnn.onnx", dir);
  auto ok = verify_json(quote(ctx) + " --reference " + quote(dir / "cnn.onnx") + " --rtol 1e-3", 0);
  EXPECT_EQ(ok["schema_version"], 1);
  EXPECT_EQ(ok["ctxgen_version"], CTXGEN_VERSION);
  EXPECT_EQ(ok["status"], "ok");
  EXPECT_EQ(ok["options"]["rtol"], 1e-3);
  EXPECT_EQ(ok["options"]["references"][0], (dir / "cnn.onnx").string());
  EXPECT_FALSE(ok["checks"].empty());
  ASSERT_EQ(ok["outputs"].size(), 1u);
  EXPECT_EQ(ok["outputs"][0]["ok"], true);
  EXPECT_EQ(ok["outputs"][0]["reference"], "float32");
  EXPECT_EQ(ok["outputs"][0]["shape"], nlohmann::json::array({1, 10}));
  EXPECT_GT(ok["outputs"][0]["cosine"].get<double>(), 0.999999);
  EXPECT_TRUE(ok["outputs"][0]["baseline"].is_null());
  EXPECT_TRUE(ok["options"]["atol"].is_null()) << "by default, relative to each output's magnitude";
  EXPECT_DOUBLE_EQ(ok["outputs"][0]["atol"].get<double>(),
                   1e-3 * ok["outputs"][0]["reference_magnitude"]["max_abs"].get<double>());
  auto wide = verify_json(quote(ctx) + " --reference " + quote(dir / "cnn.onnx") +
                              " --reference-precision float64 --atol 1e-6 --error-stat p99 --min-cosine 0.99 --min-snr 60",
                          0);
  EXPECT_EQ(wide["options"]["error_stat"], "p99");
  EXPECT_EQ(wide["options"]["atol"], 1e-6);
  EXPECT_EQ(wide["options"]["min_snr_db"], 60);
  EXPECT_EQ(wide["outputs"][0]["atol"], 1e-6);
  EXPECT_NE(wide["outputs"][0]["reference"].get<std::string>().find("float64"), std::string::npos);
  EXPECT_TRUE(wide["outputs"][0]["baseline"].is_object());
  EXPECT_TRUE(wide["outputs"][0]["error_ratio"].is_number());

  fs::path tuned = dir / "tuned.onnx";
  fs::copy_file(generated_models() / "share/partial/tuned.onnx", tuned);
  ASSERT_EQ(ctxgen("compile " + quote(tuned)).exit_code, 0);
  auto mismatch = verify_json(quote(dir / "tuned_ctx.onnx") + " --reference " +
                              quote(generated_models() / "share/partial/base.onnx"), 8);
  EXPECT_EQ(mismatch["status"], "failed");
  EXPECT_EQ(mismatch["error"]["code"], "mismatch");
  EXPECT_EQ(mismatch["outputs"][0]["ok"], false);

  fs::remove(dir / "cnn_ref.bin");
  auto missing = verify_json(quote(ctx), 8);
  EXPECT_EQ(missing["status"], "failed");
  EXPECT_EQ(missing["error"]["exit_code"], 8);
  EXPECT_NE(missing["error"]["message"].get<std::string>().find("cnn_ref.bin"), std::string::npos) << missing;
  EXPECT_FALSE(missing.contains("outputs"));
}

TEST(Verify, SharedGroup) {
  TempDir dir;
  fs::path a = generated_models() / "share/full/prefill.onnx", b = generated_models() / "share/full/decode.onnx";
  ASSERT_EQ(ctxgen("share " + quote(a) + "," + quote(b) + " --output-dir " + quote(dir.path())).exit_code, 0);
  auto r = ctxgen("verify " + quote(dir / "prefill_ctx.onnx") + " " + quote(dir / "decode_ctx.onnx") + " --reference " +
                  quote(a) + " --reference " + quote(b));
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

}  // namespace
}  // namespace ctxgen::testing

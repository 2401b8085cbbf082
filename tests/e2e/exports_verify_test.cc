// Real exports (testdata/exports, written by torch.onnx.export): a Llama-shaped decoder pair with
// dynamic axes and shape arithmetic, shared with per-model shapes, and a CNN with upsampling.
// Each must compile nearly whole into one partition and match ONNX Runtime's CPU run of the
// original (`ctxgen verify`).

#include <cstring>
#include <set>

#include <nlohmann/json.hpp>

#include "ctxgen/format.h"
#include "e2e.h"

namespace ctxgen::testing {
namespace {

const fs::path kExports = fs::path(CTXGEN_SOURCE_DIR) / "testdata" / "exports";

nlohmann::json read_json(const fs::path& path) { return nlohmann::json::parse(read_file(path)); }

void expect_compiled_whole(const nlohmann::json& model) {
  double nodes = model["nodes"].get<double>(), on_ref = model["nodes_compiled"].get<double>();
  EXPECT_GE(on_ref / nodes, 0.95) << model.dump(2);
  EXPECT_EQ(model["partitions"].size(), 1u) << model.dump(2);
  EXPECT_GT(model["nodes_folded"].get<int>(), 50) << "the shape arithmetic is folded";
}

void expect_verified(const std::string& args) {
  auto r = ctxgen("verify " + args);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("FAIL"), std::string::npos) << r.output;
}

TEST(Exports, DecoderPairSharesOneBinaryWithPerModelShapes) {
  TempDir dir;
  fs::path prefill = kExports / "decoder_prefill.onnx", decode = kExports / "decoder_decode.onnx";
  auto r = ctxgen("share " + quote(prefill) + "," + quote(decode) +
                  " --fix-dim batch=1 --fix-dim decoder_prefill:seq=128 --fix-dim decoder_decode:seq=1"
                  " --fix-dim decoder_decode:past=127 --output-dir " + quote(dir / "out") + " --report " +
                  quote(dir / "r.json"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto report = read_json(dir / "r.json");
  for (const auto& m : report["models"]) expect_compiled_whole(m);
  // The two models hold the same 21 weights: the second adds almost nothing to the binary.
  auto models = report["models"];
  EXPECT_LT(models[1]["weights"]["new_bytes"].get<uint64_t>(), models[1]["weights"]["bytes"].get<uint64_t>() / 10);
  auto binary = ContextBinary::open(dir / "out" / "decoder_prefill_ref.bin");
  std::set<std::string> hashes;
  for (const auto& w : binary->weights()) EXPECT_TRUE(hashes.insert(w.hash.hex()).second) << "a weight stored twice";
  EXPECT_EQ(files_in(dir / "out"),
            (std::set<std::string>{"decoder_prefill_ctx.onnx", "decoder_decode_ctx.onnx", "decoder_prefill_ref.bin"}));
  // Inputs take the compiled models' static shapes: [1,128] for prefill, [1,1] and pasts of 127.
  expect_verified(quote(dir / "out" / "decoder_prefill_ctx.onnx") + " " + quote(dir / "out" / "decoder_decode_ctx.onnx") +
                  " --reference " + quote(prefill) + " " + quote(decode));
}

TEST(Exports, ManifestDescribesTheSameGroup) {
  TempDir dir;
  std::string manifest = R"({"models": [{"path": ")" + (kExports / "decoder_prefill.onnx").string() +
                         R"(", "fix_dim": {"seq": 128}}, {"path": ")" + (kExports / "decoder_decode.onnx").string() +
                         R"(", "fix_dim": {"seq": 1, "past": 127}}], "fix_dim": {"batch": 1}, "output_dir": "dist"})";
  write_file(dir / "group.json", manifest);
  auto r = ctxgen("share --manifest " + quote(dir / "group.json") + " --report " + quote(dir / "r.json"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto report = read_json(dir / "r.json");
  for (const auto& m : report["models"]) expect_compiled_whole(m);
  EXPECT_TRUE(fs::exists(dir / "dist" / "decoder_decode_ctx.onnx"));

  write_file(dir / "typo.json", R"({"models": [{"path": "a.onnx", "fixdim": {"seq": 1}}]})");
  r = ctxgen("share --manifest " + quote(dir / "typo.json"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("models[0]: unknown key 'fixdim'"), std::string::npos) << r.output;
}

TEST(Exports, ScopeNamingNoModelIsAnError) {
  TempDir dir;
  auto r = ctxgen("share " + quote(kExports / "decoder_prefill.onnx") + "," + quote(kExports / "decoder_decode.onnx") +
                  " --fix-dim decoder:seq=1 --output-dir " + quote(dir / "out"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--fix-dim decoder:seq: no dimension of that name in the model (no model given has the file "
                          "stem 'decoder', so it was read as part of the name)"),
            std::string::npos)
      << r.output;
  EXPECT_FALSE(fs::exists(dir / "out"));
}

TEST(Exports, CnnWithUpsamplingMatchesOrt) {
  TempDir dir;
  fs::path cnn = kExports / "cnn_upsample.onnx";
  auto r = ctxgen("compile " + quote(cnn) + " --fix-dim batch=2 --output-dir " + quote(dir / "out") + " --report " +
                  quote(dir / "r.json"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto model = read_json(dir / "r.json")["models"][0];
  EXPECT_GT(model["nodes_folded"].get<int>(), 0) << "the Shape -> Gather -> Concat of the flatten folds";
  expect_verified(quote(dir / "out" / "cnn_upsample_ctx.onnx") + " --reference " + quote(cnn));
}

}  // namespace
}  // namespace ctxgen::testing

namespace ctxgen::testing {
namespace {

// Models as onnx >= 1.16 writes them (IR 10, opsets 19 and 21, ops whose inputs changed after
// opset 17), which Debian's onnx 1.12 cannot check: whole on ref, same outputs as ORT 1.29.
TEST(Modern, NewerIrAndOpsetsCompileWholeAndMatchOrt) {
  for (const char* name : {"ir10_opset21.onnx", "opset19.onnx"}) {
    TempDir dir;
    fs::path model = generated_models() / "modern" / name;
    auto r = ctxgen("compile " + quote(model) + " --input-shape x=" + (std::string(name) == "opset19.onnx" ? "1x3x5x6" : "2x4x8x8") +
                    " --output-dir " + quote(dir.path()) + " --report " + quote(dir / "r.json"));
    ASSERT_EQ(r.exit_code, 0) << name << ": " << r.output;
    auto m = read_json(dir / "r.json")["models"][0];
    EXPECT_EQ(m["nodes_compiled"], m["nodes"]) << name << ": " << m.dump(2);
    expect_verified(quote(dir / (fs::path(name).stem().string() + "_ctx.onnx")) + " --reference " + quote(model));
  }
}

}  // namespace
}  // namespace ctxgen::testing

namespace ctxgen::testing {
namespace {

// --fix-value: an input is a constant to the compiler, the If on it takes one branch, and the
// branch's nodes compile like any other; the compiled model keeps the input (whose value the plugin
// EP checks, tests/ort). verify feeds both models the same value (recorded in the model).
TEST(FixValue, InlinesTheBranchTakenAndMatchesOrt) {
  fs::path vad = generated_models() / "vad.onnx";
  {
    TempDir dir;
    auto r = ctxgen("compile " + quote(vad) + " --output-dir " + quote(dir.path()) + " --report " + quote(dir / "r.json"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    auto m = read_json(dir / "r.json")["models"][0];
    EXPECT_EQ(m["cpu_nodes_by_op"]["If"], 1) << "without --fix-value the compute stays in the If";
  }
  for (const char* rate : {"16000", "8000"}) {
    TempDir dir;
    auto r = ctxgen("compile " + quote(vad) + " --fix-value sr=" + rate + " --output-dir " + quote(dir.path()) +
                    " --report " + quote(dir / "r.json"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    auto m = read_json(dir / "r.json")["models"][0];
    EXPECT_EQ(m["nodes_on_cpu"], 0) << m.dump(2);
    EXPECT_EQ(m["partitions"].size(), 1u);
    onnx::ModelProto ctx = load_proto(dir / "vad_ctx.onnx");
    ASSERT_EQ(ctx.graph().input_size(), 2) << "sr stays an input, as the original declares it";
    EXPECT_EQ(ctx.graph().input(1).DebugString(), load_proto(vad).graph().input(1).DebugString());
    EXPECT_EQ(ctx.graph().initializer_size(), 0) << "sr has no default value in the original";
    expect_verified(quote(dir / "vad_ctx.onnx") + " --reference " + quote(vad));
  }
}

// Several fixed inputs go back where the original declares them; one the original gave a default
// (an initializer) keeps a default, now the value compiled for; inspect shows what was compiled in.
TEST(FixValue, FixedInputsKeepTheirPlaceAndDefaults) {
  TempDir dir;
  const std::string script =
      "import onnx, sys\n"
      "from onnx import helper as h, TensorProto as T\n"
      "g = h.make_graph([h.make_node('Cast', ['k'], ['kf'], to=T.FLOAT), h.make_node('Mul', ['x', 'kf'], ['xk']),\n"
      "                  h.make_node('ReduceSum', ['a'], ['s'], keepdims=0), h.make_node('Add', ['xk', 's'], ['y'])],\n"
      "    'g', [h.make_tensor_value_info('a', T.FLOAT, [2]), h.make_tensor_value_info('k', T.INT64, []),\n"
      "          h.make_tensor_value_info('x', T.FLOAT, [1, 4])], [h.make_tensor_value_info('y', T.FLOAT, [1, 4])],\n"
      "    [h.make_tensor('k', T.INT64, [], [3])])\n"
      "onnx.save(h.make_model(g, opset_imports=[h.make_opsetid('', 11)]), sys.argv[1])\n";
  write_file(dir / "make.py", script);
  ASSERT_EQ(run_command(std::string(CTXGEN_PYTHON) + " " + quote(dir / "make.py") + " " + quote(dir / "m.onnx")).exit_code, 0);
  auto r = ctxgen("compile " + quote(dir / "m.onnx") + " --fix-value k=5 --fix-value a=1,2 --output-dir " + quote(dir / "out"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const onnx::ModelProto original = load_proto(dir / "m.onnx"), ctx = load_proto(dir / "out" / "m_ctx.onnx");
  ASSERT_EQ(ctx.graph().input_size(), 3);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(ctx.graph().input(i).DebugString(), original.graph().input(i).DebugString()) << i;
  ASSERT_EQ(ctx.graph().initializer_size(), 1);
  EXPECT_EQ(ctx.graph().initializer(0).name(), "k");
  const onnx::TensorProto& k = ctx.graph().initializer(0);
  int64_t value = k.int64_data_size() == 1 ? k.int64_data(0) : -1;
  if (k.raw_data().size() == sizeof value) std::memcpy(&value, k.raw_data().data(), sizeof value);
  EXPECT_EQ(value, 5) << k.DebugString();
  r = ctxgen("inspect " + quote(dir / "out" / "m_ref.bin"));
  EXPECT_NE(r.output.find("fixed input a = [1, 2] (compiled for this value: a run must feed it)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("fixed input k = 5"), std::string::npos) << r.output;
  expect_verified(quote(dir / "out" / "m_ctx.onnx") + " --reference " + quote(dir / "m.onnx"));
  // With nothing compiled, no partition could check a fed value: refused, even with --allow-empty.
  r = ctxgen("compile " + quote(dir / "m.onnx") + " --fix-value k=5 --fix-value a=1,2 --fix-value x=1,2,3,4 --allow-empty "
             "--output-dir " + quote(dir / "empty"));
  EXPECT_EQ(r.exit_code, 4) << r.output;
  EXPECT_NE(r.output.find("no compiled partition checks the value of input"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dir / "empty" / "m_ctx.onnx"));
  // Against a model of another interface, verify says the compiled model does not replace it.
  r = ctxgen("verify " + quote(dir / "out" / "m_ctx.onnx") + " --reference " + quote(generated_models() / "vad.onnx"));
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("not a drop-in replacement of the original: its input 'a' of type float32 where the original "
                          "has input 'x' of type float32"),
            std::string::npos)
      << r.output;
}

// A segmentation head as detectors end (PaddleOCR's DB head): ConvTranspose upsampling, grouped,
// with output_padding, down to one channel. Its weights are packed for oneDNN's deconvolution in the
// .bin (float32) or laid out once a session from float16 (ConvWeight); one whose output_padding
// exceeds its end padding keeps its plain weight. Each matches ONNX Runtime's CPU run.
TEST(ConvTranspose, PackedUpsamplingMatchesOrt) {
  TempDir dir;
  const std::string script =
      "import numpy as np, onnx, sys\n"
      "from onnx import helper as h, numpy_helper as nh, TensorProto as T\n"
      "half = sys.argv[2] == 'fp16'\n"
      "r = np.random.default_rng(3)\n"
      "inits, nodes = [], []\n"
      "def w(name, shape):\n"
      "    a = (r.standard_normal(shape) * 0.3).astype(np.float16 if half else np.float32)\n"
      "    inits.append(nh.from_array(a, name + ('_h' if half else '')))\n"
      "    if half: nodes.append(h.make_node('Cast', [name + '_h'], [name], to=T.FLOAT))\n"
      "    return name\n"
      "def up(x, y, wname, shape, **attrs):\n"
      "    nodes.append(h.make_node('ConvTranspose', [x, w(wname, shape), w(wname + '_b', [shape[1] * attrs.get('group', 1)])], [y], **attrs))\n"
      "up('x', 'u1', 'w1', [8, 6, 2, 2], strides=[2, 2])\n"
      "nodes.append(h.make_node('Relu', ['u1'], ['r1']))\n"
      "up('r1', 'u2', 'w2', [6, 2, 3, 3], strides=[2, 2], pads=[1, 1, 1, 1], output_padding=[1, 1], group=2)\n"
      "nodes.append(h.make_node('Sigmoid', ['u2'], ['s2']))\n"
      "up('s2', 'u3', 'w3', [4, 1, 2, 2], strides=[2, 2])\n"
      "up('u3', 'y', 'w4', [1, 1, 3, 3], strides=[2, 2], output_padding=[1, 1])\n"
      "g = h.make_graph(nodes, 'head', [h.make_tensor_value_info('x', T.FLOAT, [1, 8, 5, 5])],\n"
      "                 [h.make_tensor_value_info('y', T.FLOAT, None)], inits)\n"
      "m = h.make_model(g, opset_imports=[h.make_opsetid('', 17)])\n"
      "m.ir_version = 8\n"
      "onnx.save(m, sys.argv[1])\n";
  write_file(dir / "make.py", script);
  for (const std::string precision : {"fp32", "fp16"}) {
    SCOPED_TRACE(precision);
    const fs::path model = dir / ("head_" + precision + ".onnx");
    ASSERT_EQ(run_command(std::string(CTXGEN_PYTHON) + " " + quote(dir / "make.py") + " " + quote(model) + " " + precision).exit_code, 0);
    auto r = ctxgen("compile " + quote(model) + " -v --force --output-dir " + quote(dir / "out") + " --report " + quote(dir / "r.json"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const auto m = read_json(dir / "r.json")["models"][0];
    EXPECT_EQ(m["nodes_on_cpu"], 0) << m.dump(2);
    EXPECT_EQ(m["partitions"].size(), 1u);
    size_t packed = 0;
    for (size_t at = 0; (at = r.output.find("packed ConvTranspose weight", at)) != std::string::npos; ++at) ++packed;
    EXPECT_EQ(packed, 3u) << r.output;
    EXPECT_NE(r.output.find("ConvTranspose 'y' keeps its plain weight"), std::string::npos) << r.output;
    expect_verified(quote(dir / "out" / ("head_" + precision + "_ctx.onnx")) + " --reference " + quote(model));
  }
}

TEST(FixValue, BadValuesAreUsageErrors) {
  TempDir dir;
  fs::path vad = generated_models() / "vad.onnx";
  auto r = ctxgen("compile " + quote(vad) + " --fix-value rate=16000 --output-dir " + quote(dir / "out"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--fix-value rate: the model has no input of that name"), std::string::npos) << r.output;
  r = ctxgen("compile " + quote(vad) + " --fix-value sr=16k --output-dir " + quote(dir / "out"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("'16k' is not a int64 value"), std::string::npos) << r.output;
  r = ctxgen("compile " + quote(vad) + " --fix-value sr=1,2 --output-dir " + quote(dir / "out"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("the input holds 1 values, 2 given"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dir / "out"));
}

}  // namespace
}  // namespace ctxgen::testing

namespace ctxgen::testing {
namespace {

// --stop-after writes the model as each phase leaves it: valid ONNX, smaller after folding, and
// after partitioning every node says where it goes.
TEST(StopAfter, WritesTheModelAfterEachPhase) {
  TempDir dir;
  fs::path decode = kExports / "decoder_decode.onnx";
  std::map<std::string, int> nodes;
  for (const char* phase : {"load", "specialise", "partition"}) {
    auto r = ctxgen("compile " + quote(decode) + " --fix-dim batch=1 --fix-dim seq=1 --fix-dim past=127 --stop-after " +
                    phase + " --output-dir " + quote(dir.path()));
    ASSERT_EQ(r.exit_code, 0) << phase << ": " << r.output;
    fs::path out = dir / (std::string("decoder_decode_") + phase + ".onnx");
    onnx::ModelProto m = load_proto(out);
    EXPECT_NO_THROW(onnx::checker::check_model(m)) << phase;
    nodes[phase] = m.graph().node_size();
    if (std::string(phase) == "partition") {
      for (const auto& n : m.graph().node()) EXPECT_EQ(n.doc_string(), "ctxgen: ref partition 0") << n.name();
    }
  }
  EXPECT_EQ(nodes["load"], 239) << "357 nodes less the 118 Constant nodes hoisted into initializers";
  EXPECT_EQ(nodes["specialise"], 125);
  EXPECT_EQ(nodes["partition"], 125);
  EXPECT_EQ(files_in(dir.path()).size(), 3u) << "no context binary before compiling";
}

}  // namespace
}  // namespace ctxgen::testing

namespace ctxgen::testing {
namespace {

// -v says what specialisation and lowering did, and inspect says it later from the model.
TEST(SayWhy, VerboseLogsFoldsFusionsAndInspectShowsThem) {
  TempDir dir;
  auto r = ctxgen("compile " + quote(kExports / "decoder_decode.onnx") +
                  " --fix-dim batch=1 --fix-dim seq=1 --fix-dim past=127 -v --output-dir " + quote(dir.path()));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("folded 114 nodes (1 Add, 11 Cast, 14 Concat"), std::string::npos) << r.output;
  r = ctxgen("inspect " + quote(dir / "decoder_decode_ctx.onnx"));
  EXPECT_NE(r.output.find("specialised: 239 input nodes, 114 folded into constants"), std::string::npos) << r.output;
  r = ctxgen("compile " + quote(copy_model("cnn.onnx", dir / "cnn")) + " -v");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("ref: folded BatchNormalization 'n1' into the Conv producing 'c1'"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("ref: fused Relu 'r1' into Conv 'n1'"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("ref: packed Conv weight 'w2' for "), std::string::npos) << r.output;
}

}  // namespace
}  // namespace ctxgen::testing

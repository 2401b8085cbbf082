// --weightless: the binary refers to the weights the model keeps in external data instead of
// holding them. What it holds, that verify runs it on the original's weights, what it refuses.
// (ONNX Runtime finding the source model: tests/ort/ort_compiled_test.cc.)

#include "ctxgen/error.h"
#include "ctxgen/format.h"
#include "e2e.h"

namespace ctxgen::testing {
namespace {

// DIR/STEM.onnx, the graph `g` the Python code makes, saved with every tensor in DIR/STEM.weights.
fs::path external_model(const fs::path& dir, const std::string& stem, const std::string& graph_code) {
  const fs::path script = dir / (stem + ".py"), model = dir / (stem + ".onnx");
  write_file(script, "import sys\nimport numpy as np\nimport onnx\nfrom onnx import TensorProto, helper, numpy_helper\n" +
                         graph_code + "m = helper.make_model(g, opset_imports=[helper.make_opsetid('', 13)])\n"
                         "m.ir_version = 8\nonnx.save_model(m, sys.argv[1], save_as_external_data=True, "
                         "all_tensors_to_one_file=True, location='" + stem + ".weights', size_threshold=0)\n");
  const auto r = run_command(std::string(CTXGEN_PYTHON) + " " + quote(script) + " " + quote(model));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return model;
}

// Compiles `model` --weightless; the tensors its binary names in its one source data file.
std::vector<std::string> weightless_tensors(const fs::path& model) {
  const auto r = ctxgen("compile " + quote(model) + " --weightless");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  const auto binary = ContextBinary::open(model.parent_path() / (model.stem().string() + "_ref.bin"));
  EXPECT_EQ(binary->weight_files().size(), 1u);
  return binary->weight_files().at(0).tensors;
}

// Flips the byte at `offset` of the model's <stem>.weights: verify then refuses naming `tensor`.
void expect_change_refused(const fs::path& model, size_t offset, const std::string& tensor) {
  const fs::path weights = model.parent_path() / (model.stem().string() + ".weights");
  std::string data = read_file(weights);
  data.at(offset) ^= 1;
  write_file(weights, data);
  const auto r = ctxgen("verify " + quote(model.parent_path() / (model.stem().string() + "_ctx.onnx")) + " --reference " +
                        quote(model));
  EXPECT_EQ(r.exit_code, exit_code(ErrorCode::kMismatch)) << r.output;
  EXPECT_NE(r.output.find(tensor), std::string::npos) << r.output;
}

TEST(Weightless, TheBinaryHoldsNoWeightTheModelStores) {
  TempDir dir;
  const fs::path model = copy_model("weightless.onnx", dir.path());
  auto r = ctxgen("compile " + quote(model) + " --weightless");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("--weightless: 4 tensor(s) stay in"), std::string::npos) << r.output;
  const auto binary = ContextBinary::open(dir / "weightless_ref.bin");
  ASSERT_EQ(binary->weight_files().size(), 1u);
  const WeightFile& source = binary->weight_files()[0];
  EXPECT_EQ(source.kind, WeightFileKind::kSourceData);
  EXPECT_EQ(source.path, "weightless.weights");
  EXPECT_EQ(std::set<std::string>(source.tensors.begin(), source.tensors.end()),
            (std::set<std::string>{"conv_w", "conv_b", "fc_w", "fc_b"}));
  for (const auto& w : binary->weights()) EXPECT_EQ(w.file, 1u) << "a weight the model stores is in the binary";
  EXPECT_LT(fs::file_size(dir / "weightless_ref.bin"), fs::file_size(dir / "weightless.weights") / 10);

  r = ctxgen("inspect " + quote(dir / "weightless_ref.bin"));
  EXPECT_NE(r.output.find("source data weightless.weights: 4 tensor(s) of the source model"), std::string::npos) << r.output;
  fs::rename(dir / "weightless.weights", dir / "elsewhere.weights");  // inspect reads the binary only
  r = ctxgen("inspect " + quote(dir / "weightless_ctx.onnx"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  fs::rename(dir / "elsewhere.weights", dir / "weightless.weights");
  r = ctxgen("verify " + quote(dir / "weightless_ctx.onnx") + " --reference " + quote(model));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("1 of 1 output(s) within tolerance"), std::string::npos) << r.output;
}

// Outputs elsewhere than the model: --reference names the source model, as
// ep.context_source_model_path does for ONNX Runtime.
TEST(Weightless, VerifyFindsTheWeightsThroughTheReference) {
  TempDir dir;
  const fs::path model = copy_model("weightless.onnx", dir.path());
  auto r = ctxgen("compile " + quote(model) + " --weightless --output-dir " + quote(dir / "out"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = ctxgen("verify " + quote(dir / "out" / "weightless_ctx.onnx") + " --reference " + quote(model));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  r = ctxgen("verify " + quote(dir / "out" / "weightless_ctx.onnx"));
  EXPECT_EQ(r.exit_code, exit_code(ErrorCode::kMismatch)) << r.output;
  EXPECT_NE(r.output.find("source data: the external data of the model the binary was compiled from"), std::string::npos)
      << r.output;

  std::string data = read_file(dir / "weightless.weights");
  data[10000] ^= 1;  // inside fc_w
  write_file(dir / "weightless.weights", data);
  r = ctxgen("verify " + quote(dir / "out" / "weightless_ctx.onnx") + " --reference " + quote(model));
  EXPECT_EQ(r.exit_code, exit_code(ErrorCode::kMismatch)) << r.output;
  EXPECT_NE(r.output.find("tensor 'fc_w'"), std::string::npos) << r.output;
}

// Two models reading one external-data file: their weights are referred to once.
TEST(Weightless, SharedModelsReferToOneDataFile) {
  TempDir dir;
  const fs::path first = copy_model("weightless.onnx", dir.path());
  fs::copy_file(first, dir / "again.onnx");
  auto r = ctxgen("share " + quote(first) + "," + quote(dir / "again.onnx") + " --weightless");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto binary = ContextBinary::open(dir / "weightless_ref.bin");
  ASSERT_EQ(binary->weight_files().size(), 1u);
  EXPECT_EQ(binary->weight_files()[0].tensors.size(), 4u);
  r = ctxgen("verify " + quote(dir / "weightless_ctx.onnx") + " " + quote(dir / "again_ctx.onnx") + " --reference " +
             quote(first) + " --reference " + quote(dir / "again.onnx"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

// Two tensors with the same bytes are one weight of the binary; the second is recorded too, so a
// change to it is caught when the binary is opened, not run on the first one's bytes.
TEST(Weightless, EveryTensorReadIsChecked) {
  TempDir dir;
  const fs::path model = external_model(dir.path(), "twins", R"(
w = np.random.default_rng(1).standard_normal((16, 16)).astype(np.float32)
nodes = [helper.make_node("MatMul", ["x", "a"], ["p"]), helper.make_node("MatMul", ["x", "b"], ["q"]),
         helper.make_node("Add", ["p", "q"], ["y"])]
g = helper.make_graph(nodes, "twins", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 16])],
                      [numpy_helper.from_array(w, "a"), numpy_helper.from_array(w, "b")])
)");
  EXPECT_EQ(weightless_tensors(model), (std::vector<std::string>{"a", "b"}));
  ASSERT_EQ(fs::file_size(dir / "twins.weights"), 2048u);
  expect_change_refused(model, 1500, "tensor 'b'");
}

// Tensors the compiler turns into weights the binary holds (a BatchNormalization folded into the
// Conv before it) are checked on open too: the binary was made from their bytes.
TEST(Weightless, TensorsFoldedIntoTheBinaryAreCheckedToo) {
  TempDir dir;
  const fs::path model = external_model(dir.path(), "folded", R"(
r = np.random.default_rng(2)
t = lambda name, *shape: numpy_helper.from_array(r.standard_normal(shape).astype(np.float32), name)
nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
         helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["n"]),
         helper.make_node("Relu", ["n"], ["r"]), helper.make_node("Flatten", ["r"], ["f"]),
         helper.make_node("MatMul", ["f", "fc"], ["y"])]
v = numpy_helper.from_array(np.abs(r.standard_normal(8)).astype(np.float32) + 0.5, "v")
g = helper.make_graph(nodes, "folded", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
                      [t("w", 8, 3, 3, 3), t("s", 8), t("b", 8), t("m", 8), v, t("fc", 512, 4)])
)");
  const std::vector<std::string> tensors = weightless_tensors(model);
  EXPECT_EQ(std::set<std::string>(tensors.begin(), tensors.end()), (std::set<std::string>{"fc", "w", "s", "b", "m", "v"}));
  expect_change_refused(model, 3 * 9 * 8 * 4 + 2, "tensor 's'");  // inside s, after w (8x3x3x3 floats)
}

TEST(Weightless, RefusesWhatCannotBeWeightless) {
  TempDir dir;
  const fs::path model = copy_model("weightless.onnx", dir.path());
  auto r = ctxgen("compile " + quote(model) + " --weightless --embed");
  EXPECT_EQ(r.exit_code, exit_code(ErrorCode::kUsage)) << r.output;
  EXPECT_NE(r.output.find("--weightless cannot be combined with --embed"), std::string::npos) << r.output;
  r = ctxgen("compile " + quote(model) + " --weightless --package " + quote(dir / "pkg"));
  EXPECT_EQ(r.exit_code, exit_code(ErrorCode::kUsage)) << r.output;
  EXPECT_NE(r.output.find("it takes no --weightless"), std::string::npos) << r.output;
  r = ctxgen("compile " + quote(model) + " --weightless --stop-after partition");
  EXPECT_EQ(r.exit_code, exit_code(ErrorCode::kUsage)) << r.output;
  EXPECT_NE(r.output.find("there is no binary to make --weightless"), std::string::npos) << r.output;
  r = ctxgen("compile " + quote(model) + " --weightless --ep-lib " + quote(dir / "no_such_lib.so") + " --ep CtxgenRef");
  EXPECT_EQ(r.exit_code, exit_code(ErrorCode::kUsage)) << r.output;
  EXPECT_NE(r.output.find("--weightless cannot be used with --ep-lib"), std::string::npos) << r.output;

  const fs::path inside = copy_model("cnn.onnx", dir / "inside");
  r = ctxgen("compile " + quote(inside) + " --weightless");
  EXPECT_EQ(r.exit_code, exit_code(ErrorCode::kUsage)) << r.output;
  EXPECT_NE(r.output.find("as it is stored in external data"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("save_as_external_data=True"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dir / "inside" / "cnn_ref.bin"));

  const fs::path other = copy_model("weightless.onnx", dir / "other");
  r = ctxgen("share " + quote(model) + "," + quote(other) + " --weightless --output-dir " + quote(dir / "out"));
  EXPECT_EQ(r.exit_code, exit_code(ErrorCode::kUsage)) << r.output;
  EXPECT_NE(r.output.find("must share one folder"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace ctxgen::testing

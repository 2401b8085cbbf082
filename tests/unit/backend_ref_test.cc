// The backend registry and the ref backend's supports(): which nodes it takes, and the reason it
// gives for each one it refuses.

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "../../lib/backend/ref/normalise.h"
#include "backend_test_util.h"
#include "ctxgen/error.h"
#include "ctxgen/ref_identity.h"
#include "ctxgen/runtime.h"

namespace ctxgen {
namespace {

using testing::support_of;
using testing::TestModel;
constexpr int32_t kFloat = onnx::TensorProto::FLOAT;
constexpr int32_t kInt32 = onnx::TensorProto::INT32;
constexpr int32_t kInt64 = onnx::TensorProto::INT64;
constexpr int32_t kBool = onnx::TensorProto::BOOL;
constexpr int32_t kDouble = onnx::TensorProto::DOUBLE;

void expect_yes(const NodeSupport& s) { EXPECT_TRUE(s.supported) << s.reason; }
void expect_no(const NodeSupport& s, const std::string& reason) {
  EXPECT_FALSE(s.supported);
  EXPECT_EQ(s.reason, reason);
}

TEST(BackendRegistry, BuiltinsHoldRefWithItsIdentity) {
  auto registry = builtin_backends();
  const Backend* ref = registry.find("ref");
  ASSERT_NE(ref, nullptr);
  EXPECT_EQ(registry.find("qnn"), nullptr);
  ASSERT_EQ(registry.list().size(), 1u);
  EXPECT_EQ(registry.list()[0], ref);
  EXPECT_EQ(ref->name(), ref::kBackendName);
  // One value, the same the ref runtime runs.
  const BinaryIdentity identity = ref->identity();
  EXPECT_EQ(identity.backend, ref::kEpName);
  EXPECT_EQ(identity.sdk_version, ref::kSdkVersion);
  EXPECT_EQ(identity.hardware_architecture, runtime::hardware_architecture());
  EXPECT_EQ(identity.format_version, kContextBinaryVersion);
  EXPECT_EQ(identity, runtime::make_ref_runtime()->identity());
  EXPECT_FALSE(ref->description().empty());
  EXPECT_EQ(ref->description().find('\n'), std::string::npos);
}

TEST(BackendRegistry, RejectsDuplicateAndNullBackends) {
  BackendRegistry registry;
  registry.add(make_ref_backend());
  EXPECT_THROW(registry.add(make_ref_backend()), Error);
  EXPECT_THROW(registry.add(nullptr), Error);
  EXPECT_EQ(registry.list().size(), 1u);
}

TEST(RefSupports, StaticFloatConvIsSupported) {
  auto m = TestModel().input("x", {1, 3, 8, 8}).floats("w", {4, 3, 3, 3}, std::vector<float>(108, 0.1f))
               .node("Conv", {"x", "w"}, {"y"}).attr("pads", std::vector<int64_t>{1, 1, 1, 1}).output("y").load();
  expect_yes(support_of(m, "Conv"));
}

TEST(RefSupports, RefusesDynamicShapes) {
  auto m = TestModel().input("x", {-1, 3, 224, 224}).node("Relu", {"x"}, {"y"}).output("y").load();
  // An open dim is shown by its name, the one --fix-dim takes.
  expect_no(support_of(m, "Relu"), "dynamic shape on input 0 'x' (dims [N,3,224,224])");
}

TEST(RefSupports, RefusesUnknownOpsAndOtherDomains) {
  // Round (like Floor) is not a ref op; Cos used to be refused too but is supported now.
  auto m = TestModel().input("x", {2}).node("Round", {"x"}, {"y"}).output("y").load();
  expect_no(support_of(m, "Round"), "unsupported op");
  auto det = TestModel().input("x", {3, 3}).node("Det", {"x"}, {"y"}).output("y").load();
  expect_no(support_of(det, "Det"), "unsupported op");

  TestModel ms;
  auto* op = ms.proto().add_opset_import();
  op->set_domain("com.microsoft");
  op->set_version(1);
  auto m2 = ms.input("x", {2}).node("Gelu", {"x"}, {"y"}, "com.microsoft").output("y", kFloat, std::vector<int64_t>{2}).load();
  expect_no(support_of(m2, "Gelu"), "domain 'com.microsoft' is not supported");
}

TEST(RefSupports, ElementTypes) {
  // Arithmetic takes int32 and int64 as well as float32.
  auto add32 = TestModel().input("a", {2}, kInt32).input("b", {2}, kInt32).node("Add", {"a", "b"}, {"y"})
                   .output("y", kInt32).load();
  expect_yes(support_of(add32, "Add"));
  auto div64 = TestModel().input("a", {2}, kInt64).int64s("b", {}, {3}).node("Div", {"a", "b"}, {"y"})
                   .output("y", kInt64).load();
  expect_yes(support_of(div64, "Div"));
  // Float-only ops refuse other types through the input check, before the runtime rule.
  auto relu = TestModel().input("a", {2}, kInt32).node("Relu", {"a"}, {"y"}).output("y", kInt32).load();
  expect_no(support_of(relu, "Relu"), "element type int32 on input 0 'a' (ref supports float32)");
  // Pow with an integer exponent stays refused, now by the runtime's rule for Pow.
  auto p = TestModel().input("a", {2}).input("e", {2}, kInt64).node("Pow", {"a", "e"}, {"y"}).output("y").load();
  expect_no(support_of(p, "Pow"), "Pow: input 1 has element type int64, expected float32");
  // Bool arithmetic: a type ref holds, but not one Add takes; ONNX Runtime refuses such a model
  // at load, and so does the loader, naming the input.
  try {
    TestModel().input("a", {2}, kBool).input("b", {2}, kBool).node("Add", {"a", "b"}, {"y"}).output("y", kBool).load();
    ADD_FAILURE() << "a bool Add was loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("input 0 'a' is tensor(bool), which Add (opset 14) does not take as T"), std::string::npos)
        << e.what();
  }
  // Types ref does not hold at all.
  auto f64 = TestModel().input("a", {2}, kDouble).input("b", {2}, kDouble).node("Add", {"a", "b"}, {"y"})
                 .output("y", kDouble).load();
  expect_no(support_of(f64, "Add"),
            "element type float64 on input 0 'a' (ref supports float32, float16, bfloat16, uint8, int8, uint16, int16, int32, int64, bool)");
  auto cast64 = TestModel().input("a", {2}).node("Cast", {"a"}, {"y"}).attr("to", int64_t{onnx::TensorProto::DOUBLE})
                    .output("y", onnx::TensorProto::DOUBLE).load();
  expect_no(support_of(cast64, "Cast"),
            "element type float64 on attribute to (ref supports float32, float16, bfloat16, uint8, int8, uint16, int16, int32, int64, bool)");
}

// Ops added with the integer/bool types: supported on static shapes, refused with a reason where
// their inputs cannot be attributes or their mode has no ref form.
TEST(RefSupports, NewOps) {
  for (const char* op : {"Cos", "Sin", "Log", "Reciprocal", "Softplus", "Elu", "Selu", "LogSoftmax"}) {
    auto m = TestModel().input("x", {2, 3}).node(op, {"x"}, {"y"}).output("y").load();
    expect_yes(support_of(m, op));
  }
  auto max2 = TestModel().input("a", {2}).input("b", {2}).node("Max", {"a", "b"}, {"y"}).output("y").load();
  expect_yes(support_of(max2, "Max"));
  auto max3 = TestModel().input("a", {2}).input("b", {2}).input("c", {2}).node("Max", {"a", "b", "c"}, {"y"}).output("y").load();
  expect_no(support_of(max3, "Max"), "Max with 3 inputs (ref takes 1 or 2)");
  auto eq = TestModel().input("a", {2, 3}, kInt64).input("b", {3}, kInt64).node("Equal", {"a", "b"}, {"y"})
                .output("y", kBool).load();
  expect_yes(support_of(eq, "Equal"));
  auto range = TestModel(11).int64s("s", {}, {0}).int64s("l", {}, {5}).int64s("d", {}, {2})
                   .node("Range", {"s", "l", "d"}, {"y"}).output("y", kInt64).load();
  expect_yes(support_of(range, "Range"));
  auto range0 = TestModel(11).int64s("s", {}, {0}).int64s("l", {}, {5}).int64s("d", {}, {0})
                    .node("Range", {"s", "l", "d"}, {"y"}).output("y", kInt64, std::vector<int64_t>{-1}).load();
  expect_no(support_of(range0, "Range"), "Range with delta 0");
  auto expand = TestModel().input("x", {3, 1}).int64s("shape", {3}, {2, 1, 4}).node("Expand", {"x", "shape"}, {"y"})
                    .output("y").load();
  expect_yes(support_of(expand, "Expand"));
  auto expand_dyn = TestModel().input("x", {3, 1}).input("shape", {2}, kInt64).node("Expand", {"x", "shape"}, {"y"})
                        .output("y", kFloat, std::vector<int64_t>{-1, -1}).load();
  expect_no(support_of(expand_dyn, "Expand"), "input 1 'shape' is not a constant");
  auto pad = TestModel().input("x", {2, 3}).int64s("pads", {4}, {0, 1, 0, 1}).node("Pad", {"x", "pads"}, {"y"})
                 .attr("mode", std::string("reflect")).output("y").load();
  expect_yes(support_of(pad, "Pad"));
  auto wrap = TestModel(19).input("x", {2, 3}).int64s("pads", {4}, {0, 1, 0, 1}).node("Pad", {"x", "pads"}, {"y"})
                  .attr("mode", std::string("wrap")).output("y").load();
  expect_no(support_of(wrap, "Pad"), "Pad mode 'wrap'");
}

TEST(RefSupports, RefusesZeroSizedTensors) {
  auto m = TestModel().input("x", {0, 3}).node("Relu", {"x"}, {"y"}).output("y").load();
  expect_no(support_of(m, "Relu"), "zero-sized tensor on input 0 'x' (dims [0,3])");
}

TEST(RefSupports, ShapeInputsMustBeConstants) {
  auto m = TestModel().input("x", {2, 3}).input("shape", {2}, kInt64).node("Reshape", {"x", "shape"}, {"y"})
               .output("y", kFloat, std::vector<int64_t>{-1, -1}).load();
  expect_no(support_of(m, "Reshape"), "input 1 'shape' is not a constant");
  auto c = TestModel().input("x", {2, 3}).int64s("shape", {2}, {3, 2}).node("Reshape", {"x", "shape"}, {"y"})
               .output("y").load();
  expect_yes(support_of(c, "Reshape"));
}

TEST(RefSupports, ClipBoundsMustBeConstantScalars) {
  auto m = TestModel(13).input("x", {4}).input("lo", {}).node("Clip", {"x", "lo"}, {"y"}).output("y").load();
  expect_no(support_of(m, "Clip"), "input 1 'lo' is not a constant");
  auto c = TestModel(13).input("x", {4}).floats("lo", {}, {0.0f}).node("Clip", {"x", "lo"}, {"y"}).output("y").load();
  expect_yes(support_of(c, "Clip"));
  auto legacy = TestModel(6).input("x", {4}).node("Clip", {"x"}, {"y"}).attr("min", 0.0f).output("y").load();
  expect_yes(support_of(legacy, "Clip"));
}

TEST(RefSupports, AxesInputsMustBeConstants) {
  auto m = TestModel(13).input("x", {1, 4}).input("axes", {1}, kInt64).node("Squeeze", {"x", "axes"}, {"y"})
               .output("y", kFloat, std::vector<int64_t>{-1}).load();
  expect_no(support_of(m, "Squeeze"), "input 1 'axes' is not a constant");
  auto c = TestModel(13).input("x", {1, 4}).int64s("axes", {1}, {0}).node("Squeeze", {"x", "axes"}, {"y"})
               .output("y").load();
  expect_yes(support_of(c, "Squeeze"));
  auto old = TestModel(11).input("x", {1, 4}).node("Squeeze", {"x"}, {"y"}).attr("axes", std::vector<int64_t>{0})
                 .output("y").load();
  expect_yes(support_of(old, "Squeeze"));
  auto sum = TestModel(13).input("x", {2, 4}).input("axes", {1}, kInt64).node("ReduceSum", {"x", "axes"}, {"y"})
                 .output("y", kFloat, std::vector<int64_t>{-1}).load();
  expect_no(support_of(sum, "ReduceSum"), "input 1 'axes' is not a constant");
}

TEST(RefSupports, RefusesExtraOutputs) {
  auto mp = TestModel().input("x", {1, 1, 4, 4}).node("MaxPool", {"x"}, {"y", "i"})
                .attr("kernel_shape", std::vector<int64_t>{2, 2}).output("y").output("i", kInt64).load();
  expect_no(support_of(mp, "MaxPool"), "MaxPool with Indices output");
  auto dr = TestModel().input("x", {4}).node("Dropout", {"x"}, {"y", "mask"}).output("y")
                .output("mask", onnx::TensorProto::BOOL).load();
  expect_no(support_of(dr, "Dropout"), "Dropout with mask output");
  auto bn = TestModel().input("x", {1, 2, 3, 3}).floats("p", {2}, {1, 2})
                .node("BatchNormalization", {"x", "p", "p", "p", "p"}, {"y", "mean", "var"})
                .output("y").output("mean").output("var").load();
  expect_no(support_of(bn, "BatchNormalization"), "BatchNormalization with training outputs");
  // LayerNormalization's Mean and InvStdDev are ref ops of their own: one per output.
  auto ln = TestModel().input("x", {2, 4}).floats("s", {4}, {1, 1, 1, 1}).node("LayerNormalization", {"x", "s"}, {"y", "mean"})
                .output("y").output("mean").load();
  EXPECT_TRUE(support_of(ln, "LayerNormalization").supported);
}

TEST(RefSupports, BatchNormalizationInferenceOnly) {
  TestModel t;
  t.input("x", {1, 2, 3, 3});
  for (const char* p : {"s", "b", "m", "v"}) t.floats(p, {2}, {1.0f, 2.0f});
  auto ok = TestModel(t).node("BatchNormalization", {"x", "s", "b", "m", "v"}, {"y"}).output("y").load();
  expect_yes(support_of(ok, "BatchNormalization"));
  auto training = TestModel(t).node("BatchNormalization", {"x", "s", "b", "m", "v"}, {"y"}).attr("training_mode", int64_t{1})
                      .output("y", kFloat, std::vector<int64_t>{1, 2, 3, 3}).load();
  expect_no(support_of(training, "BatchNormalization"), "BatchNormalization in training mode");
}

TEST(RefSupports, GatherIndexTypes) {
  auto runtime64 = TestModel().input("d", {5, 2}).input("i", {3}, kInt64).node("Gather", {"d", "i"}, {"y"}).output("y").load();
  expect_yes(support_of(runtime64, "Gather"));
  // int32 indices computed at run time are supported now (they used to be refused).
  auto runtime32 = TestModel().input("d", {5, 2}).input("i", {3}, kInt32).node("Gather", {"d", "i"}, {"y"}).output("y").load();
  expect_yes(support_of(runtime32, "Gather"));
  auto int_data = TestModel().input("d", {5, 2}, kInt64).input("i", {3}, kInt32).node("Gather", {"d", "i"}, {"y"})
                      .output("y", kInt64).load();
  expect_yes(support_of(int_data, "Gather"));
  auto const32 = TestModel().input("d", {5, 2}).int32s("i", {3}, {0, -1, 4}).node("Gather", {"d", "i"}, {"y"}).output("y").load();
  expect_yes(support_of(const32, "Gather"));
  auto out_of_range = TestModel().input("d", {5, 2}).int64s("i", {1}, {5}).node("Gather", {"d", "i"}, {"y"}).output("y").load();
  expect_no(support_of(out_of_range, "Gather"), "index 5 is out of range for axis 0 of size 5");
}

TEST(RefSupports, WindowAttributes) {
  for (const char* pad : {"SAME_UPPER", "SAME_LOWER", "VALID", "NOTSET"}) {
    auto m = TestModel().input("x", {1, 1, 5, 5}).node("AveragePool", {"x"}, {"y"}).attr("kernel_shape", std::vector<int64_t>{2, 2})
                 .attr("auto_pad", std::string(pad)).output("y").load();
    expect_yes(support_of(m, "AveragePool"));
  }
  auto dilated = TestModel().input("x", {1, 1, 5, 5}).node("MaxPool", {"x"}, {"y"}).attr("kernel_shape", std::vector<int64_t>{2, 2})
                     .attr("dilations", std::vector<int64_t>{2, 2}).attr("ceil_mode", int64_t{1}).output("y").load();
  expect_yes(support_of(dilated, "MaxPool"));
  auto no_kernel = TestModel().input("x", {1, 1, 5, 5}).node("AveragePool", {"x"}, {"y"}).output("y");
  no_kernel.proto().mutable_graph()->mutable_output(0)->mutable_type()->mutable_tensor_type()->mutable_shape()->add_dim()->set_dim_value(1);
  // The onnx checker refuses a missing kernel_shape before the backend sees it; this documents it.
  EXPECT_THROW(no_kernel.load(), Error);
}

TEST(RefSupports, MatMulAndGemmShapes) {
  auto mm = TestModel().input("a", {2, 3, 4}).input("b", {4}).node("MatMul", {"a", "b"}, {"y"}).output("y").load();
  expect_yes(support_of(mm, "MatMul"));
  auto gemm = TestModel().input("a", {3, 4}).input("b", {5, 4}).input("c", {5}).node("Gemm", {"a", "b", "c"}, {"y"})
                  .attr("transB", int64_t{1}).output("y").load();
  expect_yes(support_of(gemm, "Gemm"));
}

TEST(RefSupports, DocsListEveryOp) {
  std::ifstream in(std::string(CTXGEN_SOURCE_DIR) + "/docs/ops.md");
  ASSERT_TRUE(in) << "docs/ops.md is missing";
  std::stringstream text;
  text << in.rdbuf();
  for (const auto& op : refc::supported_op_types())
    EXPECT_NE(text.str().find("| " + op + " |"), std::string::npos) << op << " is not in the docs/ops.md table";
}

TEST(RefSupports, NeverThrowsOnMalformedNodes) {
  // Hand-made models that skip the checker: wrong input counts and attribute kinds.
  auto m = TestModel().input("x", {1, 3, 4, 4}).node("Relu", {"x"}, {"y"}).output("y").load();
  auto backend = make_ref_backend();
  onnx::NodeProto bad;
  bad.set_op_type("Conv");
  bad.add_input("x");
  bad.add_output("z");
  EXPECT_FALSE(backend->supports(m, bad).supported);
  bad.set_op_type("Softmax");
  auto* a = bad.add_attribute();
  a->set_name("axis");
  a->set_type(onnx::AttributeProto::STRING);
  a->set_s("one");
  auto s = backend->supports(m, bad);
  EXPECT_FALSE(s.supported);
  for (const auto& op : refc::supported_op_types()) {
    onnx::NodeProto empty;
    empty.set_op_type(op);
    EXPECT_FALSE(backend->supports(m, empty).supported) << op;
  }
}

}  // namespace
}  // namespace ctxgen

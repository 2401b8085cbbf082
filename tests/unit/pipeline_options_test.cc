// Shape options scoped to one model, and share manifests.

#include <gtest/gtest.h>

#include <fstream>

#include "ctxgen/error.h"
#include "ctxgen/options.h"
#include "test_util.h"

namespace ctxgen::testing {
namespace {

template <typename F>
void expect_usage_error(F&& f, const std::string& part) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one containing '" << part << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUsage) << e.what();
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

const std::vector<fs::path> kPair = {"dir/prefill.onnx", "other/decode.onnx"};

TEST(ResolveShapes, ScopedValuesWinOverGlobalOnes) {
  ShapeArgs args;
  args.fix_dims = {"batch=1", "seq=64", "decode:seq=1", "decode:past=127"};
  args.input_shapes = {"prefill:ids=1x64"};
  args.fix_values = {"sr=16000", "decode:sr=8000"};
  auto loads = resolve_shapes(kPair, args);
  ASSERT_EQ(loads.size(), 2u);
  EXPECT_EQ(loads[0].fix_dims, (std::map<std::string, int64_t>{{"batch", 1}, {"seq", 64}}));
  EXPECT_EQ(loads[1].fix_dims, (std::map<std::string, int64_t>{{"batch", 1}, {"past", 127}, {"seq", 1}}));
  EXPECT_EQ(loads[0].input_shapes.at("ids"), (std::vector<int64_t>{1, 64}));
  EXPECT_TRUE(loads[1].input_shapes.empty());
  EXPECT_EQ(loads[0].fix_values.at("sr"), (std::vector<std::string>{"16000"}));
  EXPECT_EQ(loads[1].fix_values.at("sr"), (std::vector<std::string>{"8000"}));
}

// A prefix that is no model's stem is part of the name: TensorFlow-style inputs are "input:0".
TEST(ResolveShapes, OnlyModelStemsAreScopes) {
  auto loads = resolve_shapes(kPair, {{"decoder:seq=1"}, {"input:0=1x3", "decode:input:0=1x1"}, {}});
  EXPECT_EQ(loads[0].fix_dims.count("decoder:seq"), 1u);
  EXPECT_EQ(loads[0].input_shapes.at("input:0"), (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(loads[1].input_shapes.at("input:0"), (std::vector<int64_t>{1, 1}));
  auto colon = resolve_shapes({"a:b.onnx", "a.onnx"}, {{"a:b:seq=2", "a:seq=3"}, {}, {}});
  EXPECT_EQ(colon[0].fix_dims.at("seq"), 2) << "the longest stem that fits is the scope";
  EXPECT_EQ(colon[1].fix_dims.at("seq"), 3);
}

TEST(ResolveShapes, AShapeHoldsAtMost2To48Values) {
  EXPECT_EQ(resolve_shapes(kPair, {{}, {"x=65536x65536x65536"}, {}})[0].input_shapes.at("x"),
            (std::vector<int64_t>{65536, 65536, 65536}));
  expect_usage_error([] { resolve_shapes(kPair, {{}, {"x=4294967296x4294967296"}, {}}); },
                     "--input-shape x: '4294967296x4294967296' holds more than 2^48 values");
  expect_usage_error([] { resolve_shapes(kPair, {{}, {"x=65536x65536x65536x2"}, {}}); }, "holds more than 2^48 values");
}

TEST(ResolveShapes, CommandLineOverridesTheManifest) {
  auto loads = resolve_shapes(kPair, {{"batch=2", "decode:past=7"}, {}, {}});
  override_with(loads, resolve_shapes(kPair, {{"batch=1"}, {}, {}}));
  EXPECT_EQ(loads[0].fix_dims.at("batch"), 1);
  EXPECT_EQ(loads[1].fix_dims.at("batch"), 1);
  EXPECT_EQ(loads[1].fix_dims.at("past"), 7);
}

TEST(ResolveShapes, MistakesAreUsageErrors) {
  expect_usage_error([] { resolve_shapes(kPair, {{"decode:seq=1", "decode:seq=2"}, {}, {}}); },
                     "--fix-dim decode:seq: given twice with different values");
  expect_usage_error([] { resolve_shapes(kPair, {{"n=3", "n=4"}, {}, {}}); }, "--fix-dim n: given twice with different values");
  expect_usage_error([] { resolve_shapes(kPair, {{}, {}, {"s=1", "s=2"}}); }, "--fix-value s: given twice");
  EXPECT_NO_THROW(resolve_shapes(kPair, {{"n=3", "n=3"}, {}, {}})) << "the same value twice is fine";
  expect_usage_error([] { resolve_shapes(kPair, {{"=1"}, {}, {}}); }, "expected [MODEL:]NAME=VALUE");
  expect_usage_error([] { resolve_shapes(kPair, {{}, {"ids=1x"}, {}}); }, "ends with 'x'");
  expect_usage_error([] { resolve_shapes(kPair, {{}, {}, {"sr=1,"}}); }, "is not a list of values");
}

TEST(Manifest, ReadsModelsShapesAndOptionsRelativeToItsFolder) {
  TempDir dir;
  write_file(dir / "g.json", R"({"models": [{"path": "m/prefill.onnx", "fix_dim": {"seq": 128}},
                                            {"path": "/abs/decode.onnx", "fix_value": {"sr": [8000]}}],
                                 "fix_dim": {"batch": 1}, "output_dir": "dist", "backend": "ref", "embed": false,
                                 "node_name_prefix": "p_"})");
  Manifest m = read_manifest(dir / "g.json");
  EXPECT_EQ(m.models, (std::vector<fs::path>{dir / "m/prefill.onnx", "/abs/decode.onnx"}));
  EXPECT_EQ(m.options.output_dir, dir / "dist");
  EXPECT_EQ(m.options.node_name_prefix, "p_");
  auto loads = resolve_shapes(m.models, m.shapes);
  EXPECT_EQ(loads[0].fix_dims, (std::map<std::string, int64_t>{{"batch", 1}, {"seq", 128}}));
  EXPECT_EQ(loads[1].fix_values.at("sr"), (std::vector<std::string>{"8000"}));
}

TEST(Manifest, TyposAndWrongTypesAreErrors) {
  TempDir dir;
  auto fails = [&](const std::string& text, const std::string& part) {
    write_file(dir / "bad.json", text);
    expect_usage_error([&] { read_manifest(dir / "bad.json"); }, part);
  };
  fails(R"({"model": []})", "unknown key 'model'");
  fails(R"({"models": []})", "'models' must be a non-empty list");
  fails(R"({"models": [{"fix_dim": {}}]})", "models[0]: 'path' is missing");
  fails(R"({"models": [{"path": "a.onnx", "fix_dim": {"seq": -1}}]})", "fix_dim 'seq' must be a non-negative integer");
  fails(R"({"models": [{"path": "a.onnx", "input_shape": {"x": []}}]})", "input_shape 'x' must be a list of sizes");
  fails(R"({"models": [{"path": "a.onnx"}], "embed": "yes"})", "embed must be true or false");
  fails("{not json", "not valid JSON");
  fails(R"({"models": [{"path": "a.onnx", "path": "b.onnx"}]})", "key 'path' is given twice in one object");
  fails(R"({"models": [{"path": "a.onnx"}], "fix_dim": {"n": 1, "n": 2}})", "key 'n' is given twice in one object");
  fails(R"({"models": [{"path": "a.onnx\u0000b.onnx"}]})", "models[0].path: holds a NUL character");
  fails(R"({"models": [{"path": "a.onnx"}], "output_dir": "o\u0000"})", "output_dir: holds a NUL character");
  expect_usage_error([&] { read_manifest(dir / "missing.json"); }, "no such manifest file");
  expect_usage_error([&] { read_manifest(dir.path()); }, "the manifest is not a regular file");
}

}  // namespace
}  // namespace ctxgen::testing

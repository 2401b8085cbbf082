// Per-kernel numeric tests on small tensors, expectations computed by hand.

#include <cmath>
#include <limits>

#include "runtime_test_util.h"

namespace ctxgen::testing {
namespace {

using ref::Activation;

ref::Attr act(Activation a) { return int_attr("act", static_cast<int64_t>(a)); }

TEST(RuntimeKernels, BinaryOpsBroadcastNumpyStyle) {
  // [2,3] + [3]: the row is added to each row.
  expect_near(run_op("Add", {{{2, 3}, f32({1, 2, 3, 4, 5, 6})}, {{3}, f32({10, 20, 30})}}, {2, 3}),
              {11, 22, 33, 14, 25, 36});
  // [2,1] - [1,3]: both sides broadcast.
  expect_near(run_op("Sub", {{{2, 1}, f32({1, 2})}, {{1, 3}, f32({1, 2, 3})}}, {2, 3}), {0, -1, -2, 1, 0, -1});
  // Scalar on the left, same-shape fast path for Mul.
  expect_near(run_op("Div", {{{}, f32({12})}, {{2, 2}, f32({1, 2, 3, 4})}}, {2, 2}), {12, 6, 4, 3});
  expect_near(run_op("Mul", {{{3}, f32({1, 2, 3})}, {{3}, f32({4, 5, 6})}}, {3}), {4, 10, 18});
  expect_near(run_op("Pow", {{{3}, f32({2, 3, 4})}, {{1}, f32({2})}}, {3}), {4, 9, 16});
  // Middle-axis broadcast: [2,1,2] * [3,1].
  expect_near(run_op("Mul", {{{2, 1, 2}, f32({1, 2, 3, 4})}, {{3, 1}, f32({1, 10, 100})}}, {2, 3, 2}),
              {1, 2, 10, 20, 100, 200, 3, 4, 30, 40, 300, 400});
}

TEST(RuntimeKernels, UnaryOps) {
  auto x = f32({-2, -0.5f, 0, 1, 4});
  auto unary = [&](const std::string& type, std::vector<ref::Attr> attrs = {}) {
    return run_op(type, {{{5}, x}}, {5}, std::move(attrs));
  };
  expect_near(unary("Relu"), {0, 0, 0, 1, 4});
  expect_near(unary("Neg"), {2, 0.5f, 0, -1, -4});
  expect_near(unary("Abs"), {2, 0.5f, 0, 1, 4});
  expect_near(unary("LeakyRelu", {float_attr("alpha", 0.1f)}), {-0.2f, -0.05f, 0, 1, 4});
  expect_near(unary("HardSigmoid", {float_attr("alpha", 0.2f), float_attr("beta", 0.5f)}), {0.1f, 0.4f, 0.5f, 0.7f, 1});
  expect_near(unary("HardSwish"), {-2 * (0.5f - 2 / 6.0f), -0.5f * (0.5f - 0.5f / 6), 0, 1 * (0.5f + 1 / 6.0f), 4});
  expect_near(unary("Clip", {float_attr("min", -1), float_attr("max", 2)}), {-1, -0.5f, 0, 1, 2});
  expect_near(unary("Sigmoid"), {0.11920292f, 0.37754067f, 0.5f, 0.73105858f, 0.98201379f});
  expect_near(unary("Tanh"), {-0.96402758f, -0.46211716f, 0, 0.76159416f, 0.99932930f});
  expect_near(unary("Exp"), {0.13533528f, 0.60653066f, 1, 2.71828183f, 54.59815f}, 1e-4f);
  expect_near(unary("Erf"), {-0.99532227f, -0.52049988f, 0, 0.84270079f, 1});
  auto roots = run_op("Sqrt", {{{3}, f32({4, 0, -1})}}, {3});
  EXPECT_EQ(roots[0], 2);
  EXPECT_EQ(roots[1], 0);
  EXPECT_TRUE(std::isnan(roots[2]));
}

TEST(RuntimeKernels, SoftmaxAlongAxisOrCoercedTo2d) {
  // [1,2,2], axis 1: per column {0, ln 3} -> {1/4, 3/4}, {0, 0} -> {1/2, 1/2}.
  In x{{1, 2, 2}, f32({0, 0, std::log(3.0f), 0})};
  expect_near(run_op("Softmax", {x}, {1, 2, 2}, {int_attr("axis", 1), int_attr("coerce_2d", 0)}),
              {0.25f, 0.5f, 0.75f, 0.5f});
  // coerce_2d: one softmax over the flattened [2,2] block: exps 1, 1, 3, 1.
  expect_near(run_op("Softmax", {x}, {1, 2, 2}, {int_attr("axis", 1), int_attr("coerce_2d", 1)}),
              {1 / 6.0f, 1 / 6.0f, 0.5f, 1 / 6.0f});
  // Large values do not overflow (the row maximum is subtracted first).
  expect_near(run_op("Softmax", {{{2}, f32({1000, 1000})}}, {2}, {int_attr("axis", 0), int_attr("coerce_2d", 0)}),
              {0.5f, 0.5f});
}

TEST(RuntimeKernels, MatMulBroadcastsBatchDims) {
  // [2,2,2] x [2,2]: B is shared by both batches.
  expect_near(run_op("MatMul", {{{2, 2, 2}, f32({1, 2, 3, 4, 5, 6, 7, 8})}, {{2, 2}, f32({1, 0, 1, 1})}}, {2, 2, 2}),
              {3, 2, 7, 4, 11, 6, 15, 8});
  // [1,1,3] x [2,3,1]: A is shared.
  expect_near(run_op("MatMul", {{{1, 1, 3}, f32({1, 2, 3})}, {{2, 3, 1}, f32({1, 1, 1, 1, 0, -1})}}, {2, 1, 1}),
              {6, -2});
  // Fused Relu.
  expect_near(run_op("MatMul", {{{1, 2}, f32({1, -1})}, {{2, 2}, f32({1, 2, 3, 1})}}, {1, 2}, {act(Activation::kRelu)}),
              {0, 1});
}

std::vector<ref::Attr> gemm_attrs(int64_t ta, int64_t tb, float alpha, float beta, std::vector<ref::Attr> more = {}) {
  std::vector<ref::Attr> a = {int_attr("transA", ta), int_attr("transB", tb), float_attr("alpha", alpha),
                              float_attr("beta", beta)};
  a.insert(a.end(), more.begin(), more.end());
  return a;
}

TEST(RuntimeKernels, GemmTransposesScalesAndBroadcastsC) {
  // A stored [K,M] = [[1,2],[3,4]], B stored [N,K] = [[1,1],[0,1]]: A'B' = [[4,3],[6,4]].
  In a{{2, 2}, f32({1, 2, 3, 4})}, b{{2, 2}, f32({1, 1, 0, 1})};
  // C [M,1] = [[10],[20]] broadcast along N.
  expect_near(run_op("Gemm", {a, b, {{2, 1}, f32({10, 20})}}, {2, 2}, gemm_attrs(1, 1, 2, 0.5f)), {13, 11, 22, 18});
  // C [N] broadcast along M.
  expect_near(run_op("Gemm", {a, b, {{2}, f32({1, 2})}}, {2, 2}, gemm_attrs(1, 1, 1, 1)), {5, 5, 7, 6});
  // Scalar C, no transposes: A B = [[1,3],[3,7]].
  expect_near(run_op("Gemm", {a, b, {{}, f32({-1})}}, {2, 2}, gemm_attrs(0, 0, 1, 1)), {0, 2, 2, 6});
  // No C; fused LeakyRelu on alpha-scaled products.
  expect_near(run_op("Gemm", {a, b, {}}, {2, 2},
                     gemm_attrs(0, 0, -1, 1, {act(Activation::kLeakyRelu), float_attr("act_alpha", 0.5f)})),
              {-0.5f, -1.5f, -1.5f, -3.5f});
}

std::vector<ref::Attr> conv_attrs(Dims kernel, Dims strides, Dims pads, Dims dilations, int64_t group,
                                  std::vector<ref::Attr> more = {}) {
  std::vector<ref::Attr> a = {ints_attr("kernel_shape", kernel), ints_attr("strides", strides), ints_attr("pads", pads),
                              ints_attr("dilations", dilations), int_attr("group", group)};
  a.insert(a.end(), more.begin(), more.end());
  return a;
}

TEST(RuntimeKernels, ConvPadsStridesDilationsBias) {
  In x{{1, 1, 3, 3}, f32({1, 2, 3, 4, 5, 6, 7, 8, 9})};
  In ones{{1, 1, 2, 2}, f32({1, 1, 1, 1})};
  // Pads 1, stride 2: windows at (-1,-1), (-1,1), (1,-1), (1,1), padding reads 0.
  expect_near(run_op("Conv", {x, ones, {}}, {1, 1, 2, 2}, conv_attrs({2, 2}, {2, 2}, {1, 1, 1, 1}, {1, 1}, 1)),
              {1, 5, 11, 28});
  // Dilation 2 picks the four corners; bias added.
  expect_near(run_op("Conv", {x, ones, {{1}, f32({0.5f})}}, {1, 1, 1, 1},
                     conv_attrs({2, 2}, {1, 1}, {0, 0, 0, 0}, {2, 2}, 1)),
              {20.5f});
  // 1-D, stride 2, fused LeakyRelu.
  expect_near(run_op("Conv", {{{1, 1, 5}, f32({1, 2, 3, 4, 5})}, {{1, 1, 3}, f32({1, 0, -1})}, {}}, {1, 1, 2},
                     conv_attrs({3}, {2}, {0, 0}, {1}, 1, {act(Activation::kLeakyRelu), float_attr("act_alpha", 0.5f)})),
              {-1, -1});
}

TEST(RuntimeKernels, ConvGroups) {
  // Pointwise, 2 groups: each output channel sees only its own input channel.
  expect_near(run_op("Conv", {{{1, 2, 1, 2}, f32({1, 2, 3, 4})}, {{2, 1, 1, 1}, f32({10, 100})}, {}}, {1, 2, 1, 2},
                     conv_attrs({1, 1}, {1, 1}, {0, 0, 0, 0}, {1, 1}, 2)),
              {10, 20, 300, 400});
  // 1x2 kernels, 2 groups: c0 = [1,2,3] * [1,1], c1 = [4,5,7] * [1,-1].
  expect_near(run_op("Conv", {{{1, 2, 1, 3}, f32({1, 2, 3, 4, 5, 7})}, {{2, 1, 1, 2}, f32({1, 1, 1, -1})}, {}},
                     {1, 2, 1, 2}, conv_attrs({1, 2}, {1, 1}, {0, 0, 0, 0}, {1, 1}, 2)),
              {3, 5, -1, -2});
  // Batch of 2, one group of 2 channels into 2 outputs (every output reads both inputs).
  expect_near(run_op("Conv", {{{2, 2, 1, 1}, f32({1, 2, 3, 4})}, {{2, 2, 1, 1}, f32({1, 1, 1, -1})}, {}}, {2, 2, 1, 1},
                     conv_attrs({1, 1}, {1, 1}, {0, 0, 0, 0}, {1, 1}, 1)),
              {3, -1, 7, -1});
}

std::vector<ref::Attr> pool_attrs(Dims kernel, Dims strides, Dims pads, std::vector<ref::Attr> more) {
  std::vector<ref::Attr> a = {ints_attr("kernel_shape", kernel), ints_attr("strides", strides), ints_attr("pads", pads)};
  a.insert(a.end(), more.begin(), more.end());
  return a;
}

TEST(RuntimeKernels, MaxPoolClipsWindowsAndIgnoresPadding) {
  // ceil_mode output (3, not 2): the last window runs past the input and is clipped.
  expect_near(run_op("MaxPool", {{{1, 1, 1, 5}, f32({1, 5, 2, 4, 3})}}, {1, 1, 1, 3},
                     pool_attrs({1, 2}, {1, 2}, {0, 0, 0, 0}, {ints_attr("dilations", {1, 1})})),
              {5, 4, 3});
  // Padding never wins, even against negative values.
  expect_near(run_op("MaxPool", {{{1, 1, 1, 3}, f32({-1, -2, -3})}}, {1, 1, 1, 2},
                     pool_attrs({1, 2}, {1, 2}, {0, 1, 0, 0}, {ints_attr("dilations", {1, 1})})),
              {-1, -2});
  // Dilation 2.
  expect_near(run_op("MaxPool", {{{1, 1, 1, 5}, f32({1, 5, 2, 4, 3})}}, {1, 1, 1, 3},
                     pool_attrs({1, 2}, {1, 1}, {0, 0, 0, 0}, {ints_attr("dilations", {1, 2})})),
              {2, 5, 3});
}

TEST(RuntimeKernels, AveragePoolCountIncludePadAndCeilMode) {
  In x{{1, 1, 1, 3}, f32({3, 6, 9})};
  Dims pads = {0, 1, 0, 1};
  expect_near(run_op("AveragePool", {x}, {1, 1, 1, 4}, pool_attrs({1, 2}, {1, 1}, pads, {int_attr("count_include_pad", 1)})),
              {1.5f, 4.5f, 7.5f, 4.5f});
  expect_near(run_op("AveragePool", {x}, {1, 1, 1, 4}, pool_attrs({1, 2}, {1, 1}, pads, {int_attr("count_include_pad", 0)})),
              {3, 4.5f, 7.5f, 9});
  // ceil_mode: the last window [4, 7) holds two elements; either way it averages those two.
  In y{{1, 1, 1, 6}, f32({1, 2, 3, 4, 5, 6})};
  for (int64_t include : {0, 1})
    expect_near(run_op("AveragePool", {y}, {1, 1, 1, 3},
                       pool_attrs({1, 3}, {1, 2}, {0, 0, 0, 0}, {int_attr("count_include_pad", include)})),
                {2, 4, 5.5f});
  // ceil_mode with padding: the count stops at the padded edge.
  expect_near(run_op("AveragePool", {{{1, 1, 1, 5}, f32({1, 2, 3, 4, 5})}}, {1, 1, 1, 4},
                     pool_attrs({1, 2}, {1, 2}, {0, 1, 0, 1}, {int_attr("count_include_pad", 1)})),
              {0.5f, 2.5f, 4.5f, 0});
}

TEST(RuntimeKernels, BatchNormalization) {
  // c0: (x - 1) / sqrt(4) * 1 + 0; c1: (x - 0) / sqrt(1) * 2 + 1.
  expect_near(run_op("BatchNormalization",
                     {{{1, 2, 1, 2}, f32({1, 3, 1, 2})}, {{2}, f32({1, 2})}, {{2}, f32({0, 1})}, {{2}, f32({1, 0})},
                      {{2}, f32({4, 1})}},
                     {1, 2, 1, 2}, {float_attr("epsilon", 0)}),
              {0, 1, 3, 5});
}

TEST(RuntimeKernels, LayerNormalizationOverLastTwoAxes) {
  // Rows [0,0,2,2] (mean 1, var 1) and [5,3,5,3] (mean 4, var 1), normalised over [2,2].
  expect_near(run_op("LayerNormalization",
                     {{{2, 2, 2}, f32({0, 0, 2, 2, 5, 3, 5, 3})}, {{2, 2}, f32({1, 2, 3, 4})}, {{2, 2}, f32({0, 0, 0, 1})}},
                     {2, 2, 2}, {int_attr("axis", 1), float_attr("epsilon", 0)}),
              {-1, -2, 3, 5, 1, -2, 3, -3});
  // Without B, epsilon counted.
  expect_near(run_op("LayerNormalization", {{{1, 2}, f32({1, 3})}, {{2}, f32({1, 1})}, {}}, {1, 2},
                     {int_attr("axis", 1), float_attr("epsilon", 3)}),
              {-0.5f, 0.5f});
}

TEST(RuntimeKernels, ReduceMeanAndSum) {
  In x{{2, 3}, f32({1, 2, 3, 4, 5, 6})};
  expect_near(run_op("ReduceSum", {x}, {2}, {ints_attr("axes", {1}), int_attr("keepdims", 0)}), {6, 15});
  expect_near(run_op("ReduceMean", {x}, {1, 3}, {ints_attr("axes", {0}), int_attr("keepdims", 1)}), {2.5f, 3.5f, 4.5f});
  expect_near(run_op("ReduceSum", {x}, {}, {ints_attr("axes", {}), int_attr("keepdims", 0)}), {21});
  In y{{2, 2, 2}, f32({0, 1, 2, 3, 4, 5, 6, 7})};
  expect_near(run_op("ReduceSum", {y}, {2, 1, 2}, {ints_attr("axes", {1}), int_attr("keepdims", 1)}), {2, 4, 10, 12});
  expect_near(run_op("ReduceMean", {y}, {2}, {ints_attr("axes", {0, 2}), int_attr("keepdims", 0)}), {2.5f, 4.5f});
}

TEST(RuntimeKernels, TransposeConcatReshape) {
  expect_near(run_op("Transpose", {{{2, 3}, f32({1, 2, 3, 4, 5, 6})}}, {3, 2}, {ints_attr("perm", {1, 0})}),
              {1, 4, 2, 5, 3, 6});
  // [2,1,3] -> perm [2,0,1] -> [3,2,1].
  expect_near(run_op("Transpose", {{{2, 1, 3}, f32({1, 2, 3, 4, 5, 6})}}, {3, 2, 1}, {ints_attr("perm", {2, 0, 1})}),
              {1, 4, 2, 5, 3, 6});
  expect_near(run_op("Concat", {{{2, 1}, f32({1, 2})}, {{2, 2}, f32({3, 4, 5, 6})}}, {2, 3}, {int_attr("axis", 1)}),
              {1, 3, 4, 2, 5, 6});
  expect_near(run_op("Reshape", {{{2, 2}, f32({1, 2, 3, 4})}}, {4}), {1, 2, 3, 4});
}

TEST(RuntimeKernels, SliceWithNegativeSteps) {
  In x{{2, 4}, f32({0, 1, 2, 3, 4, 5, 6, 7})};
  // Rows 1, 0; columns 3, 1.
  expect_near(run_op("Slice", {x}, {2, 2}, {ints_attr("starts", {1, 3}), ints_attr("steps", {-1, -2})}), {7, 5, 3, 1});
  // A single-element axis may carry any step.
  expect_near(run_op("Slice", {x}, {1, 2}, {ints_attr("starts", {1, 1}), ints_attr("steps", {INT64_MAX, 2})}), {5, 7});
}

TEST(RuntimeKernels, GatherWithNegativeIndices) {
  In data{{3, 2}, f32({1, 2, 3, 4, 5, 6})};
  expect_near(run_op("Gather", {data, {{2}, i64({-1, 0}), ref::DType::kInt64}}, {2, 2}, {int_attr("axis", 0)}),
              {5, 6, 1, 2});
  expect_near(run_op("Gather", {data, {{2, 1}, i64({1, -2}), ref::DType::kInt64}}, {3, 2, 1}, {int_attr("axis", 1)}),
              {2, 1, 4, 3, 6, 5});
  expect_error([&] { run_op("Gather", {data, {{1}, i64({7}), ref::DType::kInt64}}, {1, 2}, {int_attr("axis", 0)}); },
               ErrorCode::kRuntime, "Gather index 7 out of range [-3, 3)");
  expect_error([&] { run_op("Gather", {data, {{1}, i64({-4}), ref::DType::kInt64}}, {1, 2}, {int_attr("axis", 0)}); },
               ErrorCode::kRuntime, "op 0 (Gather)");
}

TEST(RuntimeKernels, FusedActivationsOnConv) {
  In x{{1, 1, 1, 4}, f32({-8, -1, 1, 8})};
  In w{{1, 1, 1, 1}, f32({1})};
  auto with = [&](std::vector<ref::Attr> a) {
    return run_op("Conv", {x, w, {}}, {1, 1, 1, 4}, conv_attrs({1, 1}, {1, 1}, {0, 0, 0, 0}, {1, 1}, 1, std::move(a)));
  };
  expect_near(with({act(Activation::kClip), float_attr("act_alpha", -2), float_attr("act_beta", 2)}), {-2, -1, 1, 2});
  expect_near(with({act(Activation::kHardSigmoid), float_attr("act_alpha", 0.25f), float_attr("act_beta", 0.5f)}),
              {0, 0.25f, 0.75f, 1});
  expect_near(with({act(Activation::kHardSwish)}), {0, -1 / 3.0f, 2 / 3.0f, 8});
  expect_near(with({act(Activation::kTanh)}), {std::tanh(-8.0f), std::tanh(-1.0f), std::tanh(1.0f), std::tanh(8.0f)});
  expect_near(with({act(Activation::kSigmoid)}), {1 / (1 + std::exp(8.0f)), 1 / (1 + std::exp(1.0f)),
                                                  1 / (1 + std::exp(-1.0f)), 1 / (1 + std::exp(-8.0f))});
}

// Arena values share bytes when their lifetimes do not overlap: `c` reuses `a`'s slot after `a`
// was last read, while `b` (still alive) has its own.
TEST(RuntimeKernels, ArenaSlotsAreReusedAcrossDisjointLifetimes) {
  ProgramBuilder b;
  int32_t x = b.input({4});
  int32_t a = b.arena({4}, 0);
  int32_t bb = b.arena({4}, 64);
  int32_t c = b.arena({4}, 0);
  int32_t y = b.output({4});
  b.op("Relu", {x}, a);
  b.op("Neg", {a}, bb);
  b.op("Abs", {bb}, c);
  b.op("Add", {c, bb}, y);
  EXPECT_EQ(b.program().arena_bytes, 128u);
  expect_near(run(b.program(), {f32({-1, 2, -3, 4})})[0], {0, 0, 0, 0});
  // A partition output is read by a later op too.
  ProgramBuilder p;
  int32_t in = p.input({2});
  int32_t first = p.output({2});
  int32_t second = p.output({2});
  p.op("Exp", {in}, first);
  p.op("Mul", {first, first}, second);
  auto outs = run(p.program(), {f32({0, 1})});
  expect_near(outs[0], {1, std::exp(1.0f)});
  expect_near(outs[1], {1, std::exp(2.0f)}, 1e-4f);
}

TEST(RuntimeKernels, ExecuteChecksBufferCounts) {
  ProgramBuilder b;
  int32_t x = b.input({1});
  int32_t y = b.output({1});
  b.op("Relu", {x}, y);
  runtime::validate(b.program(), 0);
  float in = 1, out = 0;
  std::vector<uint8_t> arena;
  auto no_weights = [](uint32_t) -> const uint8_t* { return nullptr; };
  expect_error([&] { runtime::execute(b.program(), no_weights, {}, {&out}, arena); }, ErrorCode::kRuntime,
               "0 input buffers given, the graph has 1");
  expect_error([&] { runtime::execute(b.program(), no_weights, {&in}, {}, arena); }, ErrorCode::kRuntime,
               "0 output buffers given, the graph has 1");
  expect_error([&] { runtime::execute(b.program(), no_weights, {nullptr}, {&out}, arena); }, ErrorCode::kRuntime,
               "no buffer for input 0");
}

TEST(RuntimeKernels, SupportedOpsListsEveryKernel) {
  auto ops = runtime::supported_ops();
  EXPECT_EQ(ops.size(), 32u);
  for (const char* type : {"Add", "Conv", "Gather", "LayerNormalization", "Reshape", "HardSwish"})
    EXPECT_NE(std::find(ops.begin(), ops.end(), type), ops.end()) << type;
}

}  // namespace
}  // namespace ctxgen::testing

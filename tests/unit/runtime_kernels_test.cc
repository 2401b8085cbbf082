// Per-kernel numeric tests on small tensors, expectations computed by hand.

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <thread>

#include "../../lib/runtime/kernels.h"
#include "../../lib/runtime/onednn.h"
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

// Rows of a few values (a detector's 4420 pairs of scores) go in blocks side by side, the same
// operations in the same order as along a row alone: bit for bit a softmax over the transposed
// input's first axis, Softmax and LogSoftmax, for row lengths 1 to 8 and a long one.
TEST(RuntimeKernels, SoftmaxOfShortRowsIsTheSoftmaxOfItsColumns) {
  const int64_t rows = 4420;
  for (const int64_t n : {int64_t{1}, int64_t{2}, int64_t{5}, int64_t{8}, int64_t{9}})
    for (const char* type : {"Softmax", "LogSoftmax"}) {
      std::vector<float> x(static_cast<size_t>(rows * n)), t(x.size());
      for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37f * static_cast<float>(i)) * 20.0f;
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t k = 0; k < n; ++k) t[static_cast<size_t>(k * rows + r)] = x[static_cast<size_t>(r * n + k)];
      const auto along = run_op(type, {{{1, rows, n}, f32(x)}}, {1, rows, n}, {int_attr("axis", 2), int_attr("coerce_2d", 0)});
      const auto down = run_op(type, {{{n, rows}, f32(t)}}, {n, rows}, {int_attr("axis", 0), int_attr("coerce_2d", 0)});
      size_t wrong = 0;
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t k = 0; k < n; ++k)
          wrong += std::memcmp(&along[static_cast<size_t>(r * n + k)], &down[static_cast<size_t>(k * rows + r)], sizeof(float)) != 0;
      EXPECT_EQ(wrong, 0u) << type << ", rows of " << n;
    }
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

// The MatMul weight transpose the compiler stores, from a source at an odd address (embedded
// weights sit anywhere in the model file), over shapes no block size divides.
TEST(RuntimeKernels, TransposeMatrixFromAnyAddress) {
  for (auto [rows, cols] : {std::pair<size_t, size_t>{1, 1}, {3, 5}, {17, 1}, {1, 33}, {257, 129}, {1024, 1031}}) {
    std::vector<uint8_t> storage(rows * cols * sizeof(float) + 1);
    uint8_t* from = storage.data() + 1;
    for (size_t i = 0; i < rows * cols; ++i) {
      const float v = static_cast<float>(i) * 0.5f;
      std::memcpy(from + i * sizeof(float), &v, sizeof v);
    }
    const auto to = runtime::transpose_matrix(from, rows, cols);
    ASSERT_EQ(to.size(), rows * cols * sizeof(float));
    size_t wrong = 0;
    for (size_t r = 0; r < rows; ++r)
      for (size_t c = 0; c < cols; ++c)
        wrong += std::memcmp(to.data() + (c * rows + r) * sizeof(float), from + (r * cols + c) * sizeof(float), sizeof(float)) != 0;
    EXPECT_EQ(wrong, 0u) << rows << " x " << cols;
  }
  EXPECT_TRUE(runtime::transpose_matrix(nullptr, 0, 7).empty());
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

// GEMMs large enough to be cut into column blocks, run with the tasks on two threads (as ONNX
// Runtime's pool would) and on one: both against a plain double-precision product.
// Runs the tasks on two threads, as ONNX Runtime's pool would.
const runtime::ParallelFor two_threads = [](size_t tasks, const std::function<void(size_t)>& body) {
  std::thread other([&] {
    for (size_t t = 1; t < tasks; t += 2) body(t);
  });
  for (size_t t = 0; t < tasks; t += 2) body(t);
  other.join();
};

TEST(RuntimeKernels, GemmsCutOverThreadsMatchTheProduct) {
  const int64_t m = 33, k = 129, n = 517;  // m n k > 2^18, n not a multiple of any block width
  std::vector<float> a(static_cast<size_t>(m * k)), b(static_cast<size_t>(k * n));
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(static_cast<int>(i * 7 % 13) - 6) / 8;
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(static_cast<int>(i * 5 % 11) - 5) / 4;
  auto at = [](const std::vector<float>& v, int64_t r, int64_t c, int64_t cols) { return v[static_cast<size_t>(r * cols + c)]; };
  std::vector<float> want(static_cast<size_t>(m * n));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double sum = 0;
      for (int64_t p = 0; p < k; ++p) sum += static_cast<double>(at(a, i, p, k)) * at(b, p, j, n);
      want[static_cast<size_t>(i * n + j)] = static_cast<float>(sum);
    }
  // The same product as Gemm with both operands stored transposed.
  std::vector<float> at_(a.size()), bt(b.size());
  for (int64_t i = 0; i < m; ++i)
    for (int64_t p = 0; p < k; ++p) at_[static_cast<size_t>(p * m + i)] = at(a, i, p, k);
  for (int64_t p = 0; p < k; ++p)
    for (int64_t j = 0; j < n; ++j) bt[static_cast<size_t>(j * k + p)] = at(b, p, j, n);
  for (const runtime::ParallelFor& parallel : {runtime::ParallelFor{}, two_threads}) {
    for (bool transposed : {false, true}) {
      ProgramBuilder p;
      const int32_t x = p.input(transposed ? Dims{k, m} : Dims{m, k}), w = p.input(transposed ? Dims{n, k} : Dims{k, n});
      const int32_t y = p.output({m, n});
      if (transposed)
        p.op("Gemm", {x, w, -1}, y, gemm_attrs(1, 1, 1, 1));
      else
        p.op("MatMul", {x, w}, y);
      const auto got = values_of<float>(run_bytes(p.program(), {f32(transposed ? at_ : a), f32(transposed ? bt : b)}, {}, parallel)[0]);
      expect_near(got, want, 1e-3f);
    }
  }
  // MatMul with B stored [N, K] (transB, as the compiler packs a constant B), A's rows cut in
  // batches of 3 and 11 rows: one GEMM over all of them.
  for (const runtime::ParallelFor& parallel : {runtime::ParallelFor{}, two_threads}) {
    ProgramBuilder p;
    const int32_t x = p.input({3, 11, k}), w = p.input({n, k}), y = p.output({3, 11, n});
    p.op("MatMul", {x, w}, y, {int_attr("transB", 1)});
    const auto got = values_of<float>(run_bytes(p.program(), {f32(a), f32(bt)}, {}, parallel)[0]);
    expect_near(got, want, 1e-3f);
  }
  // Few rows (up to kFewRows) by B stored [N, K], as a 16-row transformer's projections: run as
  // B times A transposed, MatMul and Gemm alike, on one thread and cut over two.
  for (const int64_t rows : {int64_t{1}, int64_t{7}, runtime::kFewRows}) {
    const std::vector<float> a_rows(a.begin(), a.begin() + rows * k), want_rows(want.begin(), want.begin() + rows * n);
    for (const runtime::ParallelFor& parallel : {runtime::ParallelFor{}, two_threads})
      for (const bool gemm : {false, true}) {
        SCOPED_TRACE(std::to_string(rows) + (gemm ? " rows, Gemm" : " rows, MatMul"));
        ProgramBuilder p;
        const int32_t x = p.input({rows, k}), w = p.input({n, k}), y = p.output({rows, n});
        if (gemm)
          p.op("Gemm", {x, w, -1}, y, gemm_attrs(0, 1, 1, 1));
        else
          p.op("MatMul", {x, w}, y, {int_attr("transB", 1)});
        expect_near(values_of<float>(run_bytes(p.program(), {f32(a_rows), f32(bt)}, {}, parallel)[0]), want_rows, 1e-3f);
      }
  }
  // Batched, B stored with its last two dims swapped: attention's Q x K^T with K as it is.
  expect_near(run_op("MatMul", {{{2, 1, 3}, f32({1, 2, 3, 4, 5, 6})}, {{2, 2, 3}, f32({1, 0, 0, 0, 1, 1, 1, 1, 1, 2, 0, 0})}},
                     {2, 1, 2}, {int_attr("transB", 1)}),
              {1, 5, 15, 8});
  // K = 0: an empty sum.
  expect_near(run_op("MatMul", {{{2, 0}, {}}, {{0, 3}, {}}}, {2, 3}), {0, 0, 0, 0, 0, 0});
  expect_near(run_op("MatMul", {{{2, 0}, {}}, {{3, 0}, {}}}, {2, 3}, {int_attr("transB", 1)}), {0, 0, 0, 0, 0, 0});
}

// A product by B in panels of 32 columns (as the compiler lays out a constant B) is the product:
// 1 to 100 rows (in passes of at most 12 rows with AVX-512; with AVX2 of 3 over whole panels for
// up to 3 rows, else of 6 over half panels), N = 517 (16 full panels and one 5 wide, in four
// blocks on two threads), 40 (one full, one 8 wide) and 5 (one narrow panel), B laid out from
// [N, K] and from [K, N], and by PanelWeight at run time from either. The tests also run it as CPUs
// of lower levels do (ONEDNN_MAX_CPU_ISA, tests/CMakeLists.txt).
TEST(RuntimeKernels, ProductsByBInPanelsAreTheProduct) {
  if (const char* level = std::getenv("ONEDNN_MAX_CPU_ISA")) {
    std::string lower(level);
    std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
    ASSERT_EQ(runtime::onednn::level(), lower);
  }
  const int64_t k = 300;
  std::vector<float> a(static_cast<size_t>(100 * k)), b(static_cast<size_t>(517 * k));  // b [N, K]
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(static_cast<int>(i * 7 % 13) - 6) / 8;
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(static_cast<int>(i * 5 % 11) - 5) / 4;
  const auto relu_product_of = [&](int64_t rows, int64_t cols) {
    std::vector<float> relu_product;
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) {
        double sum = 0;
        for (int64_t p = 0; p < k; ++p) sum += static_cast<double>(a[static_cast<size_t>(i * k + p)]) * b[static_cast<size_t>(j * k + p)];
        relu_product.push_back(std::max(static_cast<float>(sum), 0.0f));
      }
    return relu_product;
  };
  for (const int64_t cols : {int64_t{517}, int64_t{40}, int64_t{5}}) {
    const std::vector<float> b_nk(b.begin(), b.begin() + cols * k);
    std::vector<float> b_kn(b_nk.size());
    for (int64_t j = 0; j < cols; ++j)
      for (int64_t p = 0; p < k; ++p) b_kn[static_cast<size_t>(p * cols + j)] = b_nk[static_cast<size_t>(j * k + p)];
    const Bytes from_nk = f32(b_nk), from_kn = f32(b_kn);
    const MadeBytes laid = runtime::panels_of(from_nk.data(), static_cast<size_t>(k), static_cast<size_t>(cols), true);
    ASSERT_EQ(Bytes(laid.begin(), laid.end()), [&] {
      const MadeBytes again = runtime::panels_of(from_kn.data(), static_cast<size_t>(k), static_cast<size_t>(cols), false);
      return Bytes(again.begin(), again.end());
    }());
    for (const int64_t rows : {int64_t{1}, int64_t{3}, int64_t{7}, int64_t{12}, int64_t{13}, int64_t{32}, int64_t{100}}) {
      const std::vector<float> relu_product = relu_product_of(rows, cols);
      const std::vector<float> a_rows(a.begin(), a.begin() + rows * k);
      for (const runtime::ParallelFor& parallel : {runtime::ParallelFor{}, two_threads})
        for (const bool gemm : {false, true}) {
          SCOPED_TRACE(std::to_string(rows) + " rows by a B of " + std::to_string(cols) + " columns" + (gemm ? ", Gemm" : ", MatMul"));
          ProgramBuilder p;
          const int32_t x = p.input({rows, k}), w = p.weight({cols, k}, 0), y = p.output({rows, cols});
          std::vector<ref::Attr> attrs = gemm ? gemm_attrs(0, 1, 1, 1) : std::vector<ref::Attr>{int_attr("transB", 1)};
          attrs.push_back(int_attr("panels", 1));
          attrs.push_back(int_attr("act", static_cast<int64_t>(Activation::kRelu)));
          p.op(gemm ? "Gemm" : "MatMul", gemm ? std::vector<int32_t>{x, w, -1} : std::vector<int32_t>{x, w}, y, attrs);
          expect_near(values_of<float>(run_bytes(p.program(), {f32(a_rows)}, {Bytes(laid.begin(), laid.end())}, parallel)[0]),
                      relu_product, 1e-3f);
        }
    }
    // B as it comes, [K, N] and [N, K] (transB), laid out by PanelWeight; two products of
    // different rows read the first, one the second.
    ProgramBuilder p;
    const int32_t w = p.input({k, cols}), wt = p.input({cols, k}), x7 = p.input({7, k}), x13 = p.input({13, k});
    const int32_t laid_w = p.arena({cols, k}), laid_wt = p.arena({cols, k});
    const int32_t y7 = p.output({7, cols}), y13 = p.output({13, cols}), y13t = p.output({13, cols});
    p.op("PanelWeight", {w}, laid_w);
    p.op("PanelWeight", {wt}, laid_wt, {int_attr("transB", 1)});
    const std::vector<ref::Attr> attrs = {int_attr("transB", 1), int_attr("panels", 1), int_attr("act", static_cast<int64_t>(Activation::kRelu))};
    p.op("MatMul", {x7, laid_w}, y7, attrs);
    p.op("MatMul", {x13, laid_w}, y13, attrs);
    p.op("MatMul", {x13, laid_wt}, y13t, attrs);
    const std::vector<float> a7(a.begin(), a.begin() + 7 * k), a13(a.begin(), a.begin() + 13 * k);
    const auto outputs = run_bytes(p.program(), {from_kn, from_nk, f32(a7), f32(a13)}, {}, two_threads);
    expect_near(values_of<float>(outputs[0]), relu_product_of(7, cols), 1e-3f);
    expect_near(values_of<float>(outputs[1]), relu_product_of(13, cols), 1e-3f);
    expect_near(values_of<float>(outputs[2]), relu_product_of(13, cols), 1e-3f);
  }
}

// Kernels that share their work out over the caller's threads (elementwise, unary, LayerNorm,
// Softmax, batched MatMul with a fused activation, Gemm with C and an activation) write what they
// write on one thread, with pieces that do not divide the work evenly.
TEST(RuntimeKernels, KernelsSplitOverThreadsWriteWhatOneThreadWrites) {
  std::mt19937 random(3);
  std::uniform_real_distribution<float> uniform(-2.0f, 2.0f);
  auto values = [&](size_t n) {
    std::vector<float> v(n);
    for (float& e : v) e = uniform(random);
    return v;
  };
  struct Case {
    std::string type;
    std::vector<In> inputs;
    Dims out;
    std::vector<ref::Attr> attrs;
  };
  const Dims big = {7, 131, 97};  // 88949 elements, 7 rows of 12707
  const std::vector<Case> cases = {
      {"Add", {{big, f32(values(88949))}, {big, f32(values(88949))}}, big, {}},
      {"Sigmoid", {{big, f32(values(88949))}}, big, {}},
      {"LayerNormalization", {{{131, 679}, f32(values(88949))}, {{679}, f32(values(679))}, {{679}, f32(values(679))}},
       {131, 679}, {int_attr("axis", 1), float_attr("epsilon", 1e-5f), int_attr("output", 0)}},
      {"Softmax", {{big, f32(values(88949))}}, big, {int_attr("axis", 2), int_attr("coerce_2d", 0)}},
      {"MatMul", {{{5, 33, 40}, f32(values(5 * 33 * 40))}, {{5, 40, 29}, f32(values(5 * 40 * 29))}}, {5, 33, 29},
       {act(Activation::kRelu)}},
      {"Gemm", {{{64, 96}, f32(values(64 * 96))}, {{96, 101}, f32(values(96 * 101))}, {{101}, f32(values(101))}}, {64, 101},
       {int_attr("transA", 0), int_attr("transB", 0), float_attr("alpha", 0.5f), float_attr("beta", 2.0f),
        act(Activation::kTanh)}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.type);
    ProgramBuilder p;
    std::vector<int32_t> ids;
    std::vector<Bytes> inputs;
    for (const In& i : c.inputs) {
      ids.push_back(p.input(i.dims, i.dtype));
      inputs.push_back(i.data);
    }
    p.op(c.type, ids, p.output(c.out), c.attrs);
    const auto one = values_of<float>(run_bytes(p.program(), inputs)[0]);
    const auto two = values_of<float>(run_bytes(p.program(), inputs, {}, two_threads)[0]);
    expect_near(two, one, 1e-6f);
  }
}

// Concat on the channels of channels-last images ([N, 1, H, W, C]) interleaves the inputs at every
// position, in blocks of 128, 64 and 20 bytes here (the first two copied 16 bytes at a time), the
// positions split over the caller's threads.
TEST(RuntimeKernels, ConcatOfChannelsLastImagesInterleavesEachPosition) {
  const Dims channels = {32, 16, 5};
  const int64_t positions = 33 * 31, total = 53;
  ProgramBuilder p;
  std::vector<int32_t> ids;
  std::vector<Bytes> inputs;
  std::vector<float> expected(static_cast<size_t>(positions * total));
  int64_t first = 0;  // the input's first channel in the output
  for (int64_t c : channels) {
    std::vector<float> v(static_cast<size_t>(positions * c));
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(first * 100000 + static_cast<int64_t>(i));
    for (int64_t at = 0; at < positions; ++at)
      for (int64_t k = 0; k < c; ++k)
        expected[static_cast<size_t>(at * total + first + k)] = v[static_cast<size_t>(at * c + k)];
    ids.push_back(p.input({1, 1, 33, 31, c}));
    inputs.push_back(f32(v));
    first += c;
  }
  p.op("Concat", ids, p.output({1, 1, 33, 31, total}), {int_attr("axis", 4)});
  for (const runtime::ParallelFor& parallel : {runtime::ParallelFor{}, two_threads})
    EXPECT_EQ(values_of<float>(run_bytes(p.program(), inputs, {}, parallel)[0]), expected);
}

std::vector<ref::Attr> resize_attrs(int64_t mode, std::vector<float> scales, Dims sizes) {
  return {int_attr("mode", mode), int_attr("coord", 0), int_attr("nearest_mode", 0),
          ref::floats_attr("scales", std::move(scales)), ints_attr("sizes", std::move(sizes))};
}

// Half-pixel coordinates, worked by hand: input i of an axis doubled sits at output 2i + 0.5.
TEST(RuntimeKernels, ResizeLinearAndNearestAnyRank) {
  expect_near(run_op("Resize", {{{4}, f32({1, 2, 3, 4})}}, {8}, resize_attrs(1, {2}, {8})),
              {1, 1.25f, 1.75f, 2.25f, 2.75f, 3.25f, 3.75f, 4});
  expect_near(run_op("Resize", {{{2, 2}, f32({1, 2, 3, 4})}}, {4, 4}, resize_attrs(1, {2, 2}, {4, 4})),
              {1, 1.25f, 1.75f, 2, 1.5f, 1.75f, 2.25f, 2.5f, 2.5f, 2.75f, 3.25f, 3.5f, 3, 3.25f, 3.75f, 4});
  // The last axis kept: only the rows blend.
  expect_near(run_op("Resize", {{{2, 2}, f32({1, 2, 3, 4})}}, {4, 2}, resize_attrs(1, {2, 1}, {4, 2})),
              {1, 2, 1.5f, 2.5f, 2.5f, 3.5f, 3, 4});
  // Nearest, round_prefer_floor: -0.25 0.25 0.75 1.25 1.75 2.25 -> 0 0 1 1 2 2.
  expect_near(run_op("Resize", {{{3}, f32({1, 2, 3})}}, {6}, resize_attrs(0, {2}, {6})), {1, 1, 2, 2, 3, 3});
  expect_near(run_op("Resize", {{{}, f32({5})}}, {}, resize_attrs(1, {}, {})), {5});  // a scalar stays
}

// Images of several planes whose rows the resize reads as gathered rows (the last axis neither
// channels nor kept): the values, bit for bit, of half-pixel coordinates and the corner-by-corner
// sum worked out here, upsampling and downsampling, bilinear and nearest.
TEST(RuntimeKernels, ResizeOfPlanesGivesTheCornerByCornerSum) {
  const Dims in = {2, 3, 5, 7};
  std::vector<float> x(2 * 3 * 5 * 7);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(static_cast<float>(i) * 0.7f) * 10.0f;
  struct Tap {
    int64_t lo, hi;
    float w_lo, w_hi;
  };
  const auto tap = [](int64_t o, float scale, int64_t len) {
    const float at = std::max(0.0f, std::min((static_cast<float>(o) + 0.5f) / scale - 0.5f, static_cast<float>(len - 1)));
    const int64_t lo = std::min(static_cast<int64_t>(at), len - 1), hi = std::min(lo + 1, len - 1);
    return lo == hi ? Tap{lo, hi, 1.0f, 0.0f} : Tap{lo, hi, std::fabs(at - static_cast<float>(hi)), std::fabs(at - static_cast<float>(lo))};
  };
  for (const auto& [out_h, out_w] : {std::pair<int64_t, int64_t>{9, 12}, std::pair<int64_t, int64_t>{3, 4}}) {
    const float sh = static_cast<float>(out_h) / 5.0f, sw = static_cast<float>(out_w) / 7.0f;
    std::vector<float> want, nearest;
    for (int64_t plane = 0; plane < 6; ++plane)
      for (int64_t h = 0; h < out_h; ++h)
        for (int64_t w = 0; w < out_w; ++w) {
          const Tap th = tap(h, sh, 5), tw = tap(w, sw, 7);
          const auto at = [&](int64_t r, int64_t c) { return x[static_cast<size_t>(plane * 35 + r * 7 + c)]; };
          want.push_back((((th.w_lo * tw.w_lo) * at(th.lo, tw.lo) + (th.w_hi * tw.w_lo) * at(th.hi, tw.lo)) +
                          (th.w_lo * tw.w_hi) * at(th.lo, tw.hi)) +
                         (th.w_hi * tw.w_hi) * at(th.hi, tw.hi));
          // Nearest, round_prefer_floor: half-pixel coordinates rounded, halves down.
          const auto near = [](int64_t o, float scale, int64_t len) {
            const float c = (static_cast<float>(o) + 0.5f) / scale - 0.5f;
            const auto i = static_cast<int64_t>(c == std::floor(c) + 0.5f ? std::floor(c) : std::round(c));
            return std::clamp<int64_t>(i, 0, len - 1);
          };
          nearest.push_back(at(near(h, sh, 5), near(w, sw, 7)));
        }
    const Dims out = {2, 3, out_h, out_w};
    EXPECT_EQ(run_op("Resize", {{in, f32(x)}}, out, resize_attrs(1, {1, 1, sh, sw}, out)), want) << out_h << "x" << out_w;
    EXPECT_EQ(run_op("Resize", {{in, f32(x)}}, out, resize_attrs(0, {1, 1, sh, sw}, out)), nearest) << out_h << "x" << out_w;
  }
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

// How many representable floats lie between a and b, across zero too.
int64_t ulps_apart(float a, float b) {
  const auto ordered = [](float f) {
    int32_t i;
    std::memcpy(&i, &f, sizeof i);
    return i < 0 ? int64_t{INT32_MIN} - i : int64_t{i};
  };
  return std::abs(ordered(a) - ordered(b));
}

// exp_approx (Softmax, Sigmoid, Exp) is within 2 units in the last place of std::exp wherever
// std::exp gives a normal float, and keeps its specials.
TEST(RuntimeKernels, ExpApproxIsWithinTwoUlpOfTheLibrary) {
  int64_t worst = 0;
  float worst_at = 0;
  for (double x = -87.33; x <= 88.72; x += 1e-4) {
    const auto xf = static_cast<float>(x);
    const int64_t d = ulps_apart(runtime::exp_approx(xf), std::exp(xf));
    if (d > worst) worst = d, worst_at = xf;
  }
  EXPECT_LE(worst, 2) << "at x = " << worst_at;
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(runtime::exp_approx(0.0f), 1.0f);
  EXPECT_EQ(runtime::exp_approx(-inf), 0.0f);  // a masked attention score
  EXPECT_EQ(runtime::exp_approx(-200.0f), 0.0f);
  EXPECT_EQ(runtime::exp_approx(inf), inf);
  EXPECT_EQ(runtime::exp_approx(89.0f), inf);
  EXPECT_TRUE(std::isnan(runtime::exp_approx(std::numeric_limits<float>::quiet_NaN())));
}

// Erf and Tanh (ops, and Tanh fused into another op) stay within 2 ulp of the C library over a
// sample of every float and a fine sweep of [-5, 5]; NaN stays NaN, infinities give +-1, zeros
// keep their sign. An odd count: the last values go through the vector call padded.
TEST(RuntimeKernels, ErfAndTanhAreWithinTwoUlpOfTheLibrary) {
  std::vector<float> x;
  for (uint64_t bits = 0; bits <= 0xFFFFFFFFu; bits += 65537) {
    float v;
    const auto b = static_cast<uint32_t>(bits);
    std::memcpy(&v, &b, sizeof v);
    if (!std::isnan(v)) x.push_back(v);
  }
  for (double v = -5; v <= 5; v += 1e-4) x.push_back(static_cast<float>(v));
  const float inf = std::numeric_limits<float>::infinity();
  const size_t specials = x.size();  // +inf, -inf, +0, -0, NaN
  for (float v : {inf, -inf, 0.0f, -0.0f, std::numeric_limits<float>::quiet_NaN()}) x.push_back(v);
  if (x.size() % 4 == 0) x.push_back(0.5f);
  const auto n = static_cast<int64_t>(x.size());
  std::vector<float> fused = x;
  runtime::FusedActivation{Activation::kTanh, 0.0f, 0.0f, std::nullopt, std::nullopt, std::nullopt, std::nullopt}.apply(fused.data(), n);
  for (const auto& [op, f] : std::vector<std::pair<std::string, float (*)(float)>>{
           {"Erf", [](float v) { return std::erf(v); }}, {"Tanh", [](float v) { return std::tanh(v); }}}) {
    SCOPED_TRACE(op);
    const auto got = run_op(op, {{{n}, f32(x)}}, {n}, {});
    ASSERT_EQ(got.size(), x.size());
    int64_t worst = 0;
    size_t worst_at = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      if (op == "Tanh" && std::memcmp(&fused[i], &got[i], sizeof got[i]) != 0)
        ADD_FAILURE() << "fused Tanh differs at x = " << x[i];
      if (i == specials + 4) continue;  // NaN
      const int64_t d = ulps_apart(got[i], f(x[i]));
      if (d > worst) worst = d, worst_at = i;
    }
    EXPECT_LE(worst, 2) << "at x = " << x[worst_at];
    EXPECT_EQ(got[specials], 1.0f);
    EXPECT_EQ(got[specials + 1], -1.0f);
    EXPECT_TRUE(got[specials + 2] == 0.0f && !std::signbit(got[specials + 2]));
    EXPECT_TRUE(got[specials + 3] == 0.0f && std::signbit(got[specials + 3]));
    EXPECT_TRUE(std::isnan(got[specials + 4]));
  }
}

// A packed Conv (its weight laid out for oneDNN's convolution on this CPU) computes what the
// plain one (im2col + GEMM) does, over the shapes convolutions take: 1 to 3 spatial dims, groups
// and depthwise, strides, uneven pads, dilations, batches, with and without bias, and every fused
// activation (those oneDNN applies itself and those applied after it).
TEST(RuntimeKernels, PackedConvMatchesThePlainOne) {
  struct Case {
    Dims x, w, kernel, strides, pads, dilations;
    int64_t group;
    bool bias;
    std::vector<ref::Attr> act;
  };
  const std::vector<Case> cases = {
      {{1, 3, 9, 9}, {8, 3, 3, 3}, {3, 3}, {1, 1}, {1, 1, 1, 1}, {1, 1}, 1, true, {act(Activation::kRelu)}},
      {{2, 16, 7, 6}, {24, 16, 3, 3}, {3, 3}, {2, 2}, {0, 1, 2, 1}, {1, 1}, 1, false, {}},
      {{1, 8, 10, 10}, {16, 4, 3, 3}, {3, 3}, {1, 2}, {1, 1, 1, 1}, {2, 2}, 2, true,
       {act(Activation::kLeakyRelu), float_attr("act_alpha", 0.1f)}},
      {{1, 16, 8, 8}, {16, 1, 3, 3}, {3, 3}, {1, 1}, {1, 1, 1, 1}, {1, 1}, 16, true,
       {act(Activation::kClip), float_attr("act_alpha", -0.5f), float_attr("act_beta", 0.5f)}},
      {{1, 32, 5, 5}, {8, 32, 1, 1}, {1, 1}, {1, 1}, {0, 0, 0, 0}, {1, 1}, 1, true, {act(Activation::kSigmoid)}},
      {{1, 4, 11}, {6, 4, 5}, {5}, {2}, {2, 1}, {1}, 1, true, {act(Activation::kHardSwish)}},
      {{1, 2, 4, 5, 6}, {3, 2, 2, 3, 2}, {2, 3, 2}, {1, 2, 1}, {0, 1, 1, 1, 0, 0}, {1, 1, 2}, 1, false,
       {act(Activation::kTanh)}},
      // Large enough to be cut into 2 and 4 pieces along its output channels, with and without bias.
      {{1, 32, 20, 20}, {64, 32, 3, 3}, {3, 3}, {1, 1}, {1, 1, 1, 1}, {1, 1}, 1, true, {act(Activation::kRelu)}},
      {{1, 24, 18, 18}, {128, 24, 3, 3}, {3, 3}, {2, 2}, {1, 0, 1, 0}, {1, 1}, 1, false, {act(Activation::kSigmoid)}},
      // Cut into bands of rows when computed channels last: dilated, padded unevenly, odd rows.
      {{1, 16, 23, 24}, {32, 16, 3, 3}, {3, 3}, {1, 1}, {2, 0, 3, 1}, {2, 1}, 1, true, {act(Activation::kRelu)}},
      {{1, 8, 40, 13}, {16, 8, 5, 3}, {5, 3}, {3, 1}, {0, 1, 4, 1}, {1, 1}, 1, true, {}},
      // A first convolution (UltraFace's): read from its planes when its output is channels last.
      {{1, 3, 30, 41}, {16, 3, 3, 3}, {3, 3}, {2, 2}, {1, 1, 1, 1}, {1, 1}, 1, true, {act(Activation::kRelu)}},
      {{1, 3, 17, 20}, {16, 3, 3, 3}, {3, 3}, {2, 3}, {0, 1, 1, 0}, {1, 1}, 1, false, {act(Activation::kSigmoid)}},
  };
  std::mt19937 random(7);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  auto values = [&](const Dims& d) {
    int64_t n = 1;
    for (int64_t e : d) n *= e;
    std::vector<float> v(static_cast<size_t>(n));
    for (float& e : v) e = uniform(random);
    return v;
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    auto attrs = conv_attrs(c.kernel, c.strides, c.pads, c.dilations, c.group, c.act);
    // The output dims, from the rule itself.
    const ref::Value xv{ref::DType::kFloat32, c.x}, wv{ref::DType::kFloat32, c.w};
    ref::Op plain_op;
    plain_op.type = "Conv";
    plain_op.attrs = attrs;
    const Dims y = runtime::infer_output(plain_op, {&xv, &wv}, "conv").dims;
    const auto x = values(c.x), w = values(c.w), b = values({c.w[0]});
    In bias = c.bias ? In{{c.w[0]}, f32(b)} : In{};
    const auto plain = run_op("Conv", {{c.x, f32(x)}, {c.w, f32(w)}, bias}, y, attrs);

    ref::Op packed_op = plain_op;
    packed_op.attrs.push_back(int_attr("packed", 1));
    packed_op.attrs.push_back(ints_attr("weight_shape", c.w));
    packed_op.attrs.push_back(ints_attr("weight_layout", runtime::conv_weight_layout(packed_op, c.x, c.w, y, c.bias)));
    const auto packed_w = runtime::pack_conv_weight(packed_op, reinterpret_cast<const uint8_t*>(w.data()));
    SCOPED_TRACE("case " + std::to_string(i));
    // These layouts are dense: the product of the padded dims, which the layout begins with.
    const auto layout = packed_op.get_ints("weight_layout");
    const size_t rank = runtime::onednn_weight_dims(c.w, c.group, false).size();
    const Dims padded(layout.begin(), layout.begin() + static_cast<long>(rank));
    EXPECT_EQ(static_cast<size_t>(runtime::product(padded)) * sizeof(float), packed_w.size());
    EXPECT_EQ(runtime::packed_conv_weight_bytes(packed_op), packed_w.size());
    ProgramBuilder p;
    std::vector<int32_t> ids = {p.input(c.x), p.input({static_cast<int64_t>(packed_w.size() / sizeof(float))})};
    std::vector<Bytes> inputs = {f32(x), Bytes(packed_w.begin(), packed_w.end())};
    if (c.bias) {
      ids.push_back(p.input({c.w[0]}));
      inputs.push_back(f32(b));
    }
    p.op("Conv", ids, p.output(y), packed_op.attrs);
    for (const runtime::ParallelFor& parallel : {runtime::ParallelFor{}, two_threads})
      expect_near(values_of<float>(run_bytes(p.program(), inputs, {}, parallel)[0]), plain, 1e-4f);  // sums of up to 288 terms near 10
    // ConvWeight lays the plain weight out at run time exactly as the compiler packs it.
    ProgramBuilder lay;
    lay.op("ConvWeight", {lay.input(c.w)}, lay.output({static_cast<int64_t>(packed_w.size() / sizeof(float))}),
           {ints_attr("weight_shape", c.w), int_attr("group", c.group), ints_attr("weight_layout", layout)});
    EXPECT_EQ(run_bytes(lay.program(), {f32(w)})[0], Bytes(packed_w.begin(), packed_w.end()));

    // Computed channels last, its images given row-major or channels last ([N, 1, H, W, C]).
    if (!runtime::conv_runs_channels_last(packed_op, c.x, c.w, y, c.bias)) continue;
    ref::Op last_op = packed_op;
    last_op.attrs.push_back(int_attr("channels_last", 1));
    for (auto& a : last_op.attrs)
      if (a.name == "weight_layout") a.ints = runtime::conv_weight_layout(last_op, c.x, c.w, y, c.bias);
    const auto last_w = runtime::pack_conv_weight(last_op, reinterpret_cast<const uint8_t*>(w.data()));
    const auto to_last = [](const std::vector<float>& v, const Dims& d) {  // [N, C, H, W] -> [N, 1, H, W, C]
      std::vector<float> t(v.size());
      for (int64_t n = 0; n < d[0]; ++n)
        for (int64_t ch = 0; ch < d[1]; ++ch)
          for (int64_t i = 0; i < d[2] * d[3]; ++i)
            t[static_cast<size_t>((n * d[2] * d[3] + i) * d[1] + ch)] = v[static_cast<size_t>((n * d[1] + ch) * d[2] * d[3] + i)];
      return t;
    };
    // Images given row-major, the output alone channels last (a first convolution), both.
    for (const auto& [src_last, dst_last] : {std::pair{false, false}, {false, true}, {true, true}}) {
      SCOPED_TRACE(std::string("channels-last source ") + (src_last ? "yes" : "no") + ", output " + (dst_last ? "yes" : "no"));
      ref::Op op = last_op;
      if (src_last) op.attrs.push_back(int_attr("src_channels_last", 1));
      if (dst_last) op.attrs.push_back(int_attr("dst_channels_last", 1));
      const Dims xd = src_last ? Dims{c.x[0], 1, c.x[2], c.x[3], c.x[1]} : c.x;
      const Dims yd = dst_last ? Dims{y[0], 1, y[2], y[3], y[1]} : y;
      ProgramBuilder q;
      std::vector<int32_t> last_ids = {q.input(xd), q.input({static_cast<int64_t>(last_w.size() / sizeof(float))})};
      std::vector<Bytes> last_inputs = {f32(src_last ? to_last(x, c.x) : x), Bytes(last_w.begin(), last_w.end())};
      if (c.bias) {
        last_ids.push_back(q.input({c.w[0]}));
        last_inputs.push_back(f32(b));
      }
      q.op("Conv", last_ids, q.output(yd), op.attrs);
      for (const runtime::ParallelFor& parallel : {runtime::ParallelFor{}, two_threads})
        expect_near(values_of<float>(run_bytes(q.program(), last_inputs, {}, parallel)[0]), dst_last ? to_last(plain, y) : plain,
                    1e-4f);
    }
  }
}

// A packed ConvTranspose (its weight laid out for oneDNN's deconvolution) computes what the plain
// scatter loop does: 1 to 3 spatial dims, strides, uneven pads, output_padding within the end
// padding, dilations, groups, batches, with and without bias; ConvWeight (transposed) lays a plain
// weight out as the compiler packs it.
TEST(RuntimeKernels, PackedConvTransposeMatchesTheScatterLoop) {
  struct Case {
    Dims x, w, kernel, strides, pads, extra, dilations;
    int64_t group;
    bool bias;
  };
  const std::vector<Case> cases = {
      {{1, 96, 8, 8}, {96, 24, 2, 2}, {2, 2}, {2, 2}, {0, 0, 0, 0}, {0, 0}, {1, 1}, 1, true},
      {{1, 24, 9, 7}, {24, 1, 2, 2}, {2, 2}, {2, 2}, {0, 0, 0, 0}, {0, 0}, {1, 1}, 1, false},
      {{2, 8, 5, 6}, {8, 6, 3, 3}, {3, 3}, {2, 2}, {1, 1, 1, 1}, {1, 1}, {1, 1}, 1, true},
      {{1, 8, 6, 5}, {8, 3, 3, 2}, {3, 2}, {2, 3}, {0, 1, 2, 2}, {1, 2}, {2, 1}, 2, true},
      {{1, 16, 7, 7}, {16, 1, 3, 3}, {3, 3}, {1, 1}, {1, 1, 1, 1}, {0, 0}, {1, 1}, 16, false},
      {{1, 4, 11}, {4, 6, 5}, {5}, {3}, {2, 2}, {1}, {1}, 1, true},
      {{1, 3, 3, 4, 5}, {3, 4, 2, 3, 2}, {2, 3, 2}, {2, 1, 2}, {0, 1, 0, 1, 1, 1}, {0, 0, 1}, {1, 1, 1}, 1, false},
  };
  std::mt19937 random(13);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  auto values = [&](const Dims& d) {
    std::vector<float> v(static_cast<size_t>(runtime::product(d)));
    for (float& e : v) e = uniform(random);
    return v;
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE("case " + std::to_string(i));
    const Case& c = cases[i];
    std::vector<ref::Attr> attrs = {ints_attr("kernel_shape", c.kernel), ints_attr("strides", c.strides),
                                    ints_attr("pads", c.pads), ints_attr("dilations", c.dilations),
                                    ints_attr("output_padding", c.extra), int_attr("group", c.group)};
    ref::Op op;
    op.type = "ConvTranspose";
    op.attrs = attrs;
    const ref::Value xv{ref::DType::kFloat32, c.x}, wv{ref::DType::kFloat32, c.w};
    const Dims y = runtime::infer_output(op, {&xv, &wv}, "conv_transpose").dims;
    const auto x = values(c.x), w = values(c.w), b = values({y[1]});
    const auto plain = run_op("ConvTranspose", {{c.x, f32(x)}, {c.w, f32(w)}, c.bias ? In{{y[1]}, f32(b)} : In{}}, y, attrs);

    op.attrs.push_back(int_attr("packed", 1));
    op.attrs.push_back(ints_attr("weight_shape", c.w));
    EXPECT_FALSE(runtime::conv_runs_channels_last(op, c.x, c.w, y, c.bias));
    const auto layout = runtime::conv_weight_layout(op, c.x, c.w, y, c.bias);
    op.attrs.push_back(ints_attr("weight_layout", layout));
    const auto packed = runtime::pack_conv_weight(op, reinterpret_cast<const uint8_t*>(w.data()));
    EXPECT_EQ(runtime::packed_conv_weight_bytes(op), packed.size());
    const int64_t packed_size = static_cast<int64_t>(packed.size() / sizeof(float));
    ProgramBuilder p;
    std::vector<int32_t> ids = {p.input(c.x), p.input({packed_size})};
    std::vector<Bytes> inputs = {f32(x), Bytes(packed.begin(), packed.end())};
    if (c.bias) {
      ids.push_back(p.input({y[1]}));
      inputs.push_back(f32(b));
    }
    p.op("ConvTranspose", ids, p.output(y), op.attrs);
    for (const runtime::ParallelFor& parallel : {runtime::ParallelFor{}, two_threads})
      expect_near(values_of<float>(run_bytes(p.program(), inputs, {}, parallel)[0]), plain, 1e-4f);

    ProgramBuilder lay;
    lay.op("ConvWeight", {lay.input(c.w)}, lay.output({packed_size}),
           {ints_attr("weight_shape", c.w), int_attr("group", c.group), ints_attr("weight_layout", layout),
            int_attr("transposed", 1)});
    EXPECT_EQ(run_bytes(lay.program(), {f32(w)})[0], Bytes(packed.begin(), packed.end()));
  }
}

// The process keeps the plans of packed Convs (kernels_conv.cc, planned()): the same Conv planned
// again takes the plan made before, while a Conv that differs only in its activation, its pads, its
// image's height or its bias gets a plan of its own, so each still computes what the plain one does.
TEST(RuntimeKernels, PackedConvPlansAreSharedOnlyByEqualConvs) {
  const Dims w = {16, 8, 3, 3};
  std::mt19937 random(11);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  const auto values = [&](int64_t n) {
    std::vector<float> v(static_cast<size_t>(n));
    for (float& e : v) e = uniform(random);
    return v;
  };
  const auto ws = values(runtime::product(w)), bs = values(w[0]);
  struct Variant {
    int64_t height;
    Dims pads;
    std::vector<ref::Attr> act;
    bool bias;
  };
  const std::vector<Variant> variants = {
      {19, {1, 1, 1, 1}, {act(Activation::kRelu)}, false}, {19, {1, 1, 1, 1}, {}, false},
      {19, {0, 1, 2, 1}, {act(Activation::kRelu)}, false}, {23, {1, 1, 1, 1}, {act(Activation::kRelu)}, false},
      {19, {1, 1, 1, 1}, {act(Activation::kRelu)}, true},
  };
  for (const bool last : {false, true}) {
    for (int round = 0; round < 2; ++round) {
      for (size_t v = 0; v < variants.size(); ++v) {
        SCOPED_TRACE(std::string(last ? "channels last" : "oneDNN's layout") + ", round " + std::to_string(round) +
                     ", variant " + std::to_string(v));
        const Variant& c = variants[v];
        const Dims x = {1, 8, c.height, 17};
        const auto xs = values(runtime::product(x));
        const auto attrs = conv_attrs({3, 3}, {1, 1}, c.pads, {1, 1}, 1, c.act);
        ref::Op op;
        op.type = "Conv";
        op.attrs = attrs;
        const ref::Value xv{ref::DType::kFloat32, x}, wv{ref::DType::kFloat32, w};
        const Dims y = runtime::infer_output(op, {&xv, &wv}, "conv").dims;
        const auto plain = run_op("Conv", {{x, f32(xs)}, {w, f32(ws)}, c.bias ? In{{w[0]}, f32(bs)} : In{}}, y, attrs);
        op.attrs.push_back(int_attr("packed", 1));
        op.attrs.push_back(ints_attr("weight_shape", w));
        if (last) {
          ASSERT_TRUE(runtime::conv_runs_channels_last(op, x, w, y, c.bias));
          op.attrs.push_back(int_attr("channels_last", 1));
        }
        op.attrs.push_back(ints_attr("weight_layout", runtime::conv_weight_layout(op, x, w, y, c.bias)));
        const auto packed = runtime::pack_conv_weight(op, reinterpret_cast<const uint8_t*>(ws.data()));
        ProgramBuilder p;
        std::vector<int32_t> ids = {p.input(x), p.input({static_cast<int64_t>(packed.size() / sizeof(float))})};
        std::vector<Bytes> inputs = {f32(xs), Bytes(packed.begin(), packed.end())};
        if (c.bias) {
          ids.push_back(p.input({w[0]}));
          inputs.push_back(f32(bs));
        }
        p.op("Conv", ids, p.output(y), op.attrs);
        const uint64_t before = runtime::conv_plans_made();
        expect_near(values_of<float>(run_bytes(p.program(), inputs, {}, two_threads)[0]), plain, 1e-4f);
        // Made in the first round, unless an earlier test of this process planned the same Conv.
        EXPECT_LE(runtime::conv_plans_made() - before, round == 0 ? 1u : 0u);
      }
    }
  }
}

// A packed weight of another size than its recorded layout spans is refused when the op is
// planned, with both sizes named, not read out of bounds (one smaller than the layout reaches is
// refused by the rule: RuntimeValidate.PackedConvLayoutStaysInsideItsWeight).
TEST(RuntimeKernels, PackedConvOfAnotherLayoutIsRefused) {
  const Dims x = {1, 3, 9, 9}, w = {8, 3, 3, 3}, y = {1, 8, 9, 9};
  auto attrs = conv_attrs({3, 3}, {1, 1}, {1, 1, 1, 1}, {1, 1}, 1,
                          {int_attr("packed", 1), ints_attr("weight_shape", w), ints_attr("weight_layout", {8, 3, 3, 3, 27, 9, 3, 1})});
  ProgramBuilder p;
  const int32_t in = p.input(x), weight = p.input({300}), out = p.output(y);
  p.op("Conv", {in, weight}, out, attrs);
  try {
    run_bytes(p.program(), {f32(std::vector<float>(243)), f32(std::vector<float>(300))});
    FAIL() << "a packed weight of 1200 bytes ran";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidBinary);
    const std::string what = e.what();
    EXPECT_NE(what.find("packed weight of 1200 bytes, its recorded layout (weight_layout) spans 864"), std::string::npos) << what;
  }
}

std::vector<ref::Attr> pool_attrs(Dims kernel, Dims strides, Dims pads, std::vector<ref::Attr> more) {
  std::vector<ref::Attr> a = {ints_attr("kernel_shape", kernel), ints_attr("strides", strides), ints_attr("pads", pads)};
  a.insert(a.end(), more.begin(), more.end());
  return a;
}

TEST(RuntimeKernels, MaxPoolClipsWindowsAndIgnoresPadding) {
  // ceil_mode output (3, not 2): the last window runs past the input and is clipped.
  expect_near(run_op("MaxPool", {{{1, 1, 1, 5}, f32({1, 5, 2, 4, 3})}}, {1, 1, 1, 3},
                     pool_attrs({1, 2}, {1, 2}, {0, 0, 0, 0}, {ints_attr("dilations", {1, 1}), int_attr("ceil_mode", 1)})),
              {5, 4, 3});
  // The same without ceil_mode (explicit 0 or absent): floor, the partial window is not produced.
  expect_near(run_op("MaxPool", {{{1, 1, 1, 5}, f32({1, 5, 2, 4, 3})}}, {1, 1, 1, 2},
                     pool_attrs({1, 2}, {1, 2}, {0, 0, 0, 0}, {ints_attr("dilations", {1, 1}), int_attr("ceil_mode", 0)})),
              {5, 4});
  expect_near(run_op("MaxPool", {{{1, 1, 1, 5}, f32({1, 5, 2, 4, 3})}}, {1, 1, 1, 2},
                     pool_attrs({1, 2}, {1, 2}, {0, 0, 0, 0}, {ints_attr("dilations", {1, 1})})),
              {5, 4});
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
                       pool_attrs({1, 3}, {1, 2}, {0, 0, 0, 0},
                                  {int_attr("count_include_pad", include), int_attr("ceil_mode", 1)})),
                {2, 4, 5.5f});
  // ceil_mode with padding: windows start at -1, 1, 3; a fourth would start at 5, inside the end
  // padding, and is dropped as ONNX Runtime does (3 outputs, not 4). The count stops at the
  // padded edge: [pad, 1] / 2, [2, 3] / 2, [4, 5] / 2.
  expect_near(run_op("AveragePool", {{{1, 1, 1, 5}, f32({1, 2, 3, 4, 5})}}, {1, 1, 1, 3},
                     pool_attrs({1, 2}, {1, 2}, {0, 1, 0, 1}, {int_attr("count_include_pad", 1), int_attr("ceil_mode", 1)})),
              {0.5f, 2.5f, 4.5f});
}

// Images without dilation take a path of their own; it gives what the any-rank windows give for
// the same pooling seen with a depth of 1 (pads on every side, strides, ceil_mode, both counts,
// NaN), on one thread and on two.
TEST(RuntimeKernels, PoolingOfImagesMatchesTheAnyRankWindows) {
  std::mt19937 random(5);
  std::uniform_real_distribution<float> uniform(-3.0f, 3.0f);
  std::vector<float> x(2 * 3 * 9 * 11);
  for (float& e : x) e = uniform(random);
  x[40] = std::numeric_limits<float>::quiet_NaN();
  struct Case {
    Dims kernel, strides, pads;
    int64_t ceil;
  };
  for (const Case& c : {Case{{2, 2}, {2, 2}, {0, 0, 0, 0}, 0}, Case{{3, 2}, {2, 3}, {1, 0, 2, 1}, 1},
                        Case{{4, 4}, {4, 4}, {0, 0, 0, 0}, 1}, Case{{3, 3}, {1, 1}, {1, 0, 2, 1}, 0},
                        // clipped columns on both sides; a last column wholly in the padding
                        Case{{3, 3}, {2, 2}, {1, 2, 1, 1}, 0}, Case{{2, 2}, {2, 2}, {0, 0, 1, 3}, 0}}) {
    for (const char* type : {"MaxPool", "AveragePool"}) {
      for (int64_t include : {0, 1}) {
        std::vector<ref::Attr> more = {int_attr("ceil_mode", c.ceil)};
        if (std::string(type) == "MaxPool") more.push_back(ints_attr("dilations", {1, 1}));
        else more.push_back(int_attr("count_include_pad", include));
        auto attrs2 = pool_attrs(c.kernel, c.strides, c.pads, more);
        const ref::Value image{ref::DType::kFloat32, {2, 3, 9, 11}};
        const Dims y = runtime::infer_output(ref::Op{type, attrs2, {}, {}}, {&image}, "pool").dims;
        std::vector<ref::Attr> more3 = {int_attr("ceil_mode", c.ceil)};
        if (std::string(type) == "MaxPool") more3.push_back(ints_attr("dilations", {1, 1, 1}));
        else more3.push_back(int_attr("count_include_pad", include));
        auto attrs3 = pool_attrs({1, c.kernel[0], c.kernel[1]}, {1, c.strides[0], c.strides[1]},
                                 {0, c.pads[0], c.pads[1], 0, c.pads[2], c.pads[3]}, more3);
        SCOPED_TRACE(std::string(type) + " kernel " + std::to_string(c.kernel[0]) + " include " + std::to_string(include));
        const auto any_rank = run_op(type, {{{2, 3, 1, 9, 11}, f32(x)}}, {y[0], y[1], 1, y[2], y[3]}, attrs3);
        ProgramBuilder p;
        p.op(type, {p.input({2, 3, 9, 11})}, p.output(y), attrs2);
        for (const runtime::ParallelFor& parallel : {runtime::ParallelFor{}, two_threads}) {
          const auto images = values_of<float>(run_bytes(p.program(), {f32(x)}, {}, parallel)[0]);
          ASSERT_EQ(images.size(), any_rank.size());
          for (size_t i = 0; i < images.size(); ++i)
            if (std::isnan(any_rank[i])) EXPECT_TRUE(std::isnan(images[i])) << "element " << i;
            else EXPECT_EQ(images[i], any_rank[i]) << "element " << i;
        }
        if (std::string(type) == "MaxPool") break;  // no count to choose
      }
    }
  }
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

// A row whose spread is tiny beside its mean (1000 +- 0.001) keeps its digits: each result is
// within a few float ulps of the double computation from the same inputs, which rounding the mean
// to float before subtracting would miss by ~0.04. 1031 elements: whole groups of 8 and a tail.
TEST(RuntimeKernels, LayerNormalizationOfARowFarFromZero) {
  const int64_t n = 1031;
  std::vector<float> x(n), scale(n), bias(n);
  for (int64_t i = 0; i < n; ++i) {
    x[static_cast<size_t>(i)] = static_cast<float>(1000.0 + 0.001 * std::sin(0.37 * static_cast<double>(i)));
    scale[static_cast<size_t>(i)] = 1.0f + 0.25f * static_cast<float>(i % 3);
    bias[static_cast<size_t>(i)] = 0.5f * static_cast<float>(i % 2);
  }
  double mean = 0, var = 0;
  for (float v : x) mean += v;
  mean /= n;
  for (float v : x) var += (v - mean) * (v - mean);
  const double inv = 1.0 / std::sqrt(var / n + 1e-12);
  std::vector<float> want(n);
  for (size_t i = 0; i < want.size(); ++i) want[i] = static_cast<float>((x[i] - mean) * inv * scale[i] + bias[i]);
  const auto got = run_op("LayerNormalization", {{{1, n}, f32(x)}, {{n}, f32(scale)}, {{n}, f32(bias)}}, {1, n},
                          {int_attr("axis", 1), float_attr("epsilon", 1e-12f)});
  expect_near(got, want, 2e-6f);
  // Rows a float difference would overflow, or whose spread is subnormal: computed in double.
  expect_near(run_op("LayerNormalization", {{{2, 3}, f32({3e38f, -3e38f, -3e38f, 1e-40f, 0.0f, 0.0f})},
                                            {{3}, f32({1, 1, 1})}, {}},
                     {2, 3}, {int_attr("axis", 1), float_attr("epsilon", 0)}),
              {1.41421354f, -0.70710677f, -0.70710677f, 1.41421354f, -0.70710677f, -0.70710677f});
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

// Rows reduced whole (a global pool over H x W) fold into partial results joined at the end: the
// same values as one running result, a NaN still winning a max or min, a product still a product.
// Rows shorter than the lanes (all in the tail), with a tail, and of several rounds of lanes.
TEST(RuntimeKernels, WholeRowReductionsMatchOneRunningResult) {
  for (const int64_t n : {16, 37, 100, 200}) {
    SCOPED_TRACE("rows of " + std::to_string(n));
    const int64_t rows = 3;
    std::vector<float> x(static_cast<size_t>(rows * n));
    for (size_t i = 0; i < x.size(); ++i) x[i] = 0.5f + 0.03125f * static_cast<float>((i * 7) % 23);
    x[static_cast<size_t>(2 * n - 3)] = std::numeric_limits<float>::quiet_NaN();  // row 1, past the first lanes
    const auto reduce = [&](const std::string& type) {
      return run_op(type, {{{rows, n}, f32(x)}}, {rows}, {ints_attr("axes", {1}), int_attr("keepdims", 0)});
    };
    const auto sum = reduce("ReduceSum"), prod = reduce("ReduceProd"), max = reduce("ReduceMax"), min = reduce("ReduceMin");
    for (int64_t r = 0; r < rows; ++r) {
      double s = 0, p = 1;
      float hi = -INFINITY, lo = INFINITY;
      for (int64_t i = 0; i < n; ++i) {
        const float v = x[static_cast<size_t>(r * n + i)];
        s += v, p *= v, hi = std::max(hi, v), lo = std::min(lo, v);
      }
      const auto at = static_cast<size_t>(r);
      if (r == 1) {
        EXPECT_TRUE(std::isnan(sum[at]) && std::isnan(prod[at]) && std::isnan(max[at]) && std::isnan(min[at]));
        continue;
      }
      EXPECT_NEAR(sum[at], s, 1e-5 * std::fabs(s));
      EXPECT_NEAR(prod[at], p, 1e-5 * std::fabs(p));
      EXPECT_EQ(max[at], hi);
      EXPECT_EQ(min[at], lo);
    }
  }
}

// A transpose that moves the input's contiguous axis copies in tiles: every permutation of a 4-D
// tensor whose sides are not multiples of the tile gives what index arithmetic gives.
TEST(RuntimeKernels, TransposeInTilesMatchesIndexArithmetic) {
  // Every order of the axes: last axes of 2, 3 and 4 (a shuffle within a pixel) among them.
  for (const Dims& x : {Dims{2, 19, 3, 37}, Dims{5, 4, 19, 2}}) {
    std::vector<float> values(static_cast<size_t>(runtime::product(x)));
    for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i);
    Dims perm = {0, 1, 2, 3};
    do {
      Dims y;
      for (int64_t a : perm) y.push_back(x[static_cast<size_t>(a)]);
      const auto got = run_op("Transpose", {{x, f32(values)}}, y, {ints_attr("perm", perm)});
      const Dims xs = runtime::strides_of(x);
      std::vector<float> want;
      for (int64_t i0 = 0; i0 < y[0]; ++i0)
        for (int64_t i1 = 0; i1 < y[1]; ++i1)
          for (int64_t i2 = 0; i2 < y[2]; ++i2)
            for (int64_t i3 = 0; i3 < y[3]; ++i3) {
              const int64_t at[4] = {i0, i1, i2, i3};
              int64_t offset = 0;
              for (size_t a = 0; a < 4; ++a) offset += at[a] * xs[static_cast<size_t>(perm[a])];
              want.push_back(values[static_cast<size_t>(offset)]);
            }
      EXPECT_EQ(got, want) << "perm " << perm[0] << perm[1] << perm[2] << perm[3];
    } while (std::next_permutation(perm.begin(), perm.end()));
  }
}

TEST(RuntimeKernels, TransposeConcatReshape) {
  expect_near(run_op("Transpose", {{{2, 3}, f32({1, 2, 3, 4, 5, 6})}}, {3, 2}, {ints_attr("perm", {1, 0})}),
              {1, 4, 2, 5, 3, 6});
  // [2,1,3] -> perm [2,0,1] -> [3,2,1].
  expect_near(run_op("Transpose", {{{2, 1, 3}, f32({1, 2, 3, 4, 5, 6})}}, {3, 2, 1}, {ints_attr("perm", {2, 0, 1})}),
              {1, 4, 2, 5, 3, 6});
  expect_near(run_op("Concat", {{{2, 1}, f32({1, 2})}, {{2, 2}, f32({3, 4, 5, 6})}}, {2, 3}, {int_attr("axis", 1)}),
              {1, 3, 4, 2, 5, 6});
  expect_near(run_op("Reshape", {{{2, 2}, f32({1, 2, 3, 4})}}, {4}, {ints_attr("shape", {4})}), {1, 2, 3, 4});
  // Data movement is a byte copy for every element type.
  EXPECT_EQ(run_op_as<int64_t>("Reshape", {{{2, 2}, i64({1, -2, 3, -4}), ref::DType::kInt64}}, {1, 4},
                               {ints_attr("shape", {1, 4})}),
            (std::vector<int64_t>{1, -2, 3, -4}));
  EXPECT_EQ(run_op_as<uint8_t>("Transpose", {{{2, 3}, b8({1, 0, 0, 0, 1, 1}), ref::DType::kBool}}, {3, 2},
                               {ints_attr("perm", {1, 0})}),
            (std::vector<uint8_t>{1, 0, 0, 1, 0, 1}));
  EXPECT_EQ(run_op_as<int32_t>("Concat", {{{1, 2}, i32({1, 2}), ref::DType::kInt32}, {{2, 2}, i32({3, 4, 5, 6}), ref::DType::kInt32}},
                               {3, 2}, {int_attr("axis", 0)}),
            (std::vector<int32_t>{1, 2, 3, 4, 5, 6}));
}

// An empty weight may come without bytes (a null address): it is bound to a dummy one, so a
// kernel copying its zero bytes never passes memcpy a null pointer (UBSan in the sanitizer build).
TEST(RuntimeKernels, AnEmptyWeightWithoutBytesConcatenates) {
  ProgramBuilder b;
  int32_t x = b.input({2, 1}), w = b.weight({2, 0}, 0), y = b.output({2, 1});
  b.op("Concat", {w, x}, y, {int_attr("axis", 1)});
  expect_near(values_of<float>(run_bytes(b.program(), {f32({1, 2})}, {Bytes{}})[0]), {1, 2});
}

TEST(RuntimeKernels, SliceWithNegativeSteps) {
  In x{{2, 4}, f32({0, 1, 2, 3, 4, 5, 6, 7})};
  // Rows 1, 0; columns 3, 1.
  expect_near(run_op("Slice", {x}, {2, 2},
                     {ints_attr("starts", {1, 3}), ints_attr("steps", {-1, -2}), ints_attr("sizes", {2, 2})}),
              {7, 5, 3, 1});
  // A single-element axis may carry any step.
  expect_near(run_op("Slice", {x}, {1, 2},
                     {ints_attr("starts", {1, 1}), ints_attr("steps", {INT64_MAX, 2}), ints_attr("sizes", {1, 2})}),
              {5, 7});
  // Fewer elements than the axis holds: `sizes` says how many; int64 data.
  EXPECT_EQ(run_op_as<int64_t>("Slice", {{{5}, i64({10, 11, 12, 13, 14}), ref::DType::kInt64}}, {2},
                               {ints_attr("starts", {1}), ints_attr("steps", {2}), ints_attr("sizes", {2})}),
            (std::vector<int64_t>{11, 13}));
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

TEST(RuntimeKernels, GatherInt32IndicesAndIntegerData) {
  In data{{3, 2}, f32({1, 2, 3, 4, 5, 6})};
  expect_near(run_op("Gather", {data, {{3}, i32({2, -3, 1}), ref::DType::kInt32}}, {3, 2}, {int_attr("axis", 0)}),
              {5, 6, 1, 2, 3, 4});
  expect_error([&] { run_op("Gather", {data, {{1}, i32({3}), ref::DType::kInt32}}, {1, 2}, {int_attr("axis", 0)}); },
               ErrorCode::kRuntime, "Gather index 3 out of range [-3, 3)");
  // int64 data along axis 1, scalar index: the axis is removed.
  EXPECT_EQ(run_op_as<int64_t>("Gather", {{{2, 3}, i64({1, 2, 3, 4, 5, 6}), ref::DType::kInt64},
                                          {{}, i32({-1}), ref::DType::kInt32}},
                               {2}, {int_attr("axis", 1)}),
            (std::vector<int64_t>{3, 6}));
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

// ---- integer, bool and generated tensors ---------------------------------------------------------

constexpr ref::DType kF32 = ref::DType::kFloat32, kI32 = ref::DType::kInt32, kI64 = ref::DType::kInt64,
                     kBool = ref::DType::kBool;

ref::Attr dtype_attr(const std::string& name, ref::DType dtype) { return int_attr(name, static_cast<int64_t>(dtype)); }

TEST(RuntimeKernels, IntegerArithmeticIsExactAndWraps) {
  // int32 [2,2] + [2], broadcast along rows.
  EXPECT_EQ(run_op_as<int32_t>("Add", {{{2, 2}, i32({1, 2, 3, 4}), kI32}, {{2}, i32({10, -20}), kI32}}, {2, 2}),
            (std::vector<int32_t>{11, -18, 13, -16}));
  EXPECT_EQ(run_op_as<int64_t>("Sub", {{{2}, i64({5, -5}), kI64}, {{}, i64({7}), kI64}}, {2}),
            (std::vector<int64_t>{-2, -12}));
  EXPECT_EQ(run_op_as<int64_t>("Mul", {{{2}, i64({3, -4}), kI64}, {{2}, i64({-5, 6}), kI64}}, {2}),
            (std::vector<int64_t>{-15, -24}));
  // Beyond 2^53 (where a float or double round trip would lose it) and two's complement wrap.
  const int64_t big = (int64_t{1} << 53) + 1, max64 = std::numeric_limits<int64_t>::max();
  EXPECT_EQ(run_op_as<int64_t>("Add", {{{2}, i64({big, max64}), kI64}, {{2}, i64({2, 1}), kI64}}, {2}),
            (std::vector<int64_t>{big + 2, std::numeric_limits<int64_t>::min()}));
  EXPECT_EQ(run_op_as<int32_t>("Max", {{{2}, i32({1, 5}), kI32}, {{2}, i32({3, 2}), kI32}}, {2}),
            (std::vector<int32_t>{3, 5}));
  EXPECT_EQ(run_op_as<int64_t>("Min", {{{2}, i64({1, 5}), kI64}, {{1}, i64({3}), kI64}}, {2}),
            (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(run_op_as<int64_t>("Neg", {{{2}, i64({5, -3}), kI64}}, {2}), (std::vector<int64_t>{-5, 3}));
  EXPECT_EQ(run_op_as<int32_t>("Abs", {{{3}, i32({-7, 7, 0}), kI32}}, {3}), (std::vector<int32_t>{7, 7, 0}));
}

TEST(RuntimeKernels, IntegerDivisionTruncatesTowardZero) {
  EXPECT_EQ(run_op_as<int32_t>("Div", {{{4}, i32({7, -7, 7, -7}), kI32}, {{4}, i32({2, 2, -2, -2}), kI32}}, {4}),
            (std::vector<int32_t>{3, -3, -3, 3}));
  EXPECT_EQ(run_op_as<int64_t>("Div", {{{3}, i64({-9, 9, 1}), kI64}, {{3}, i64({4, -4, 3}), kI64}}, {3}),
            (std::vector<int64_t>{-2, -2, 0}));
  // INT_MIN / -1 overflows; it wraps instead of trapping.
  const int32_t min32 = std::numeric_limits<int32_t>::min();
  EXPECT_EQ(run_op_as<int32_t>("Div", {{{1}, i32({min32}), kI32}, {{1}, i32({-1}), kI32}}, {1}),
            (std::vector<int32_t>{min32}));
  // Integer division by zero is an error naming the op; float division by zero is inf.
  expect_error([] { run_op_as<int64_t>("Div", {{{2}, i64({4, 5}), kI64}, {{2}, i64({2, 0}), kI64}}, {2}); },
               ErrorCode::kRuntime, "integer division by zero");
  expect_error([] { run_op_as<int32_t>("Div", {{{2}, i32({4, 5}), kI32}, {{}, i32({0}), kI32}}, {2}); },
               ErrorCode::kRuntime, "op 0 (Div)");
  auto inf = run_op("Div", {{{1}, f32({1})}, {{1}, f32({0})}}, {1});
  EXPECT_EQ(inf[0], std::numeric_limits<float>::infinity());
}

TEST(RuntimeKernels, CastTruncatesAndConverts) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const int64_t min64 = std::numeric_limits<int64_t>::min();
  // float -> int64 truncates toward zero; NaN and out-of-range values give the lowest value.
  EXPECT_EQ(run_op_as<int64_t>("Cast", {{{6}, f32({2.7f, -2.7f, 0.5f, -0.5f, 1e20f, nan})}}, {6},
                               {dtype_attr("to", kI64)}),
            (std::vector<int64_t>{2, -2, 0, 0, min64, min64}));
  EXPECT_EQ(run_op_as<int32_t>("Cast", {{{2}, f32({-3.9f, 100000.5f})}}, {2}, {dtype_attr("to", kI32)}),
            (std::vector<int32_t>{-3, 100000}));
  // int64 -> float rounds to nearest: 2^53 + 1 becomes 2^53.
  EXPECT_EQ(run_op("Cast", {{{4}, i64({-3, 0, int64_t{1} << 40, (int64_t{1} << 53) + 1}), kI64}}, {4},
                   {dtype_attr("to", kF32)}),
            (std::vector<float>{-3, 0, 1099511627776.0f, 9007199254740992.0f}));
  // int32 -> int64 keeps the sign; anything -> bool is "not zero"; bool -> float is 0 or 1.
  EXPECT_EQ(run_op_as<int64_t>("Cast", {{{2}, i32({-1, 7}), kI32}}, {2}, {dtype_attr("to", kI64)}),
            (std::vector<int64_t>{-1, 7}));
  EXPECT_EQ(run_op_as<uint8_t>("Cast", {{{4}, f32({0, -0.0f, 0.1f, nan})}}, {4}, {dtype_attr("to", kBool)}),
            (std::vector<uint8_t>{0, 0, 1, 1}));
  EXPECT_EQ(run_op("Cast", {{{2}, b8({1, 0}), kBool}}, {2}, {dtype_attr("to", kF32)}), (std::vector<float>{1, 0}));
}

TEST(RuntimeKernels, ComparisonsAndLogicGiveBool) {
  EXPECT_EQ(run_op_as<uint8_t>("Equal", {{{3}, f32({1, 2, 1})}, {{1}, f32({1})}}, {3}), (std::vector<uint8_t>{1, 0, 1}));
  EXPECT_EQ(run_op_as<uint8_t>("Equal", {{{2}, b8({1, 0}), kBool}, {{2}, b8({1, 1}), kBool}}, {2}),
            (std::vector<uint8_t>{1, 0}));
  // int64 [2,1] < [3]: rows {1, 5} against {2, 5, 7}.
  EXPECT_EQ(run_op_as<uint8_t>("Less", {{{2, 1}, i64({1, 5}), kI64}, {{3}, i64({2, 5, 7}), kI64}}, {2, 3}),
            (std::vector<uint8_t>{1, 1, 1, 0, 0, 1}));
  In a{{3}, i32({1, 2, 3}), kI32}, two{{}, i32({2}), kI32};
  EXPECT_EQ(run_op_as<uint8_t>("Greater", {a, two}, {3}), (std::vector<uint8_t>{0, 0, 1}));
  EXPECT_EQ(run_op_as<uint8_t>("LessOrEqual", {a, two}, {3}), (std::vector<uint8_t>{1, 1, 0}));
  EXPECT_EQ(run_op_as<uint8_t>("GreaterOrEqual", {a, two}, {3}), (std::vector<uint8_t>{0, 1, 1}));
  In p{{4}, b8({0, 0, 1, 1}), kBool}, q{{4}, b8({0, 1, 0, 1}), kBool};
  EXPECT_EQ(run_op_as<uint8_t>("And", {p, q}, {4}), (std::vector<uint8_t>{0, 0, 0, 1}));
  EXPECT_EQ(run_op_as<uint8_t>("Or", {p, q}, {4}), (std::vector<uint8_t>{0, 1, 1, 1}));
  EXPECT_EQ(run_op_as<uint8_t>("Xor", {p, q}, {4}), (std::vector<uint8_t>{0, 1, 1, 0}));
  EXPECT_EQ(run_op_as<uint8_t>("Not", {p}, {4}), (std::vector<uint8_t>{1, 1, 0, 0}));
}

TEST(RuntimeKernels, WhereBroadcastsAllThreeInputs) {
  // cond [2,1], x [1,3], y scalar -> [2,3]: row 0 from x, row 1 all y.
  In cond{{2, 1}, b8({1, 0}), kBool};
  expect_near(run_op("Where", {cond, {{1, 3}, f32({1, 2, 3})}, {{}, f32({-1})}}, {2, 3}), {1, 2, 3, -1, -1, -1});
  // int64 values, cond [3] against x [2,3] and y [2,1].
  EXPECT_EQ(run_op_as<int64_t>("Where", {{{3}, b8({0, 1, 0}), kBool}, {{2, 3}, i64({1, 2, 3, 4, 5, 6}), kI64},
                                         {{2, 1}, i64({-7, -8}), kI64}},
                               {2, 3}),
            (std::vector<int64_t>{-7, 2, -7, -8, 5, -8}));
}

TEST(RuntimeKernels, ConstantOfShapeAndRange) {
  EXPECT_EQ(run_op_as<int64_t>("ConstantOfShape", {}, {2, 3},
                               {dtype_attr("dtype", kI64), int_attr("value", 7), ints_attr("shape", {2, 3})}),
            (std::vector<int64_t>(6, 7)));
  expect_near(run_op("ConstantOfShape", {}, {2}, {dtype_attr("dtype", kF32), float_attr("value", 0.5f), ints_attr("shape", {2})}),
              {0.5f, 0.5f});
  EXPECT_EQ(run_op_as<uint8_t>("ConstantOfShape", {}, {3},
                               {dtype_attr("dtype", kBool), int_attr("value", 1), ints_attr("shape", {3})}),
            (std::vector<uint8_t>{1, 1, 1}));
  // Range: start, start + delta, ... `count` elements.
  EXPECT_EQ(run_op_as<int64_t>("Range", {}, {4},
                               {dtype_attr("dtype", kI64), int_attr("start", 10), int_attr("delta", -3), int_attr("count", 4)}),
            (std::vector<int64_t>{10, 7, 4, 1}));
  EXPECT_EQ(run_op_as<int32_t>("Range", {}, {3},
                               {dtype_attr("dtype", kI32), int_attr("start", -1), int_attr("delta", 2), int_attr("count", 3)}),
            (std::vector<int32_t>{-1, 1, 3}));
  expect_near(run_op("Range", {}, {3},
                     {dtype_attr("dtype", kF32), float_attr("start", 0.5f), float_attr("delta", 0.25f), int_attr("count", 3)}),
              {0.5f, 0.75f, 1.0f});
  EXPECT_TRUE(run_op_as<int64_t>("Range", {}, {0},
                                 {dtype_attr("dtype", kI64), int_attr("start", 0), int_attr("delta", 1), int_attr("count", 0)})
                  .empty());
}

TEST(RuntimeKernels, ExpandAndTile) {
  // [3,1] expanded with shape [2,1,2]: the output is the broadcast of both, [2,3,2].
  expect_near(run_op("Expand", {{{3, 1}, f32({1, 2, 3})}}, {2, 3, 2}, {ints_attr("shape", {2, 1, 2})}),
              {1, 1, 2, 2, 3, 3, 1, 1, 2, 2, 3, 3});
  EXPECT_EQ(run_op_as<int64_t>("Expand", {{{1}, i64({9}), kI64}}, {2, 2}, {ints_attr("shape", {2, 2})}),
            (std::vector<int64_t>{9, 9, 9, 9}));
  In x{{2, 2}, f32({1, 2, 3, 4})};
  expect_near(run_op("Tile", {x}, {2, 4}, {ints_attr("repeats", {1, 2})}), {1, 2, 1, 2, 3, 4, 3, 4});
  expect_near(run_op("Tile", {x}, {4, 2}, {ints_attr("repeats", {2, 1})}), {1, 2, 3, 4, 1, 2, 3, 4});
  EXPECT_EQ(run_op_as<uint8_t>("Tile", {{{2}, b8({1, 0}), kBool}}, {6}, {ints_attr("repeats", {3})}),
            (std::vector<uint8_t>{1, 0, 1, 0, 1, 0}));
}

TEST(RuntimeKernels, TriluUpperAndLowerWithK) {
  In m{{3, 3}, i32({1, 2, 3, 4, 5, 6, 7, 8, 9}), kI32};
  auto trilu = [&](int64_t upper, int64_t k) {
    return run_op_as<int32_t>("Trilu", {m}, {3, 3}, {int_attr("upper", upper), int_attr("k", k)});
  };
  EXPECT_EQ(trilu(1, 0), (std::vector<int32_t>{1, 2, 3, 0, 5, 6, 0, 0, 9}));
  EXPECT_EQ(trilu(1, 1), (std::vector<int32_t>{0, 2, 3, 0, 0, 6, 0, 0, 0}));
  EXPECT_EQ(trilu(1, -1), (std::vector<int32_t>{1, 2, 3, 4, 5, 6, 0, 8, 9}));
  EXPECT_EQ(trilu(0, 0), (std::vector<int32_t>{1, 0, 0, 4, 5, 0, 7, 8, 9}));
  EXPECT_EQ(trilu(0, -1), (std::vector<int32_t>{0, 0, 0, 4, 0, 0, 7, 8, 0}));
  EXPECT_EQ(trilu(0, 1), (std::vector<int32_t>{1, 2, 0, 4, 5, 6, 7, 8, 9}));
  // Extreme k: nothing or everything kept, no overflow.
  EXPECT_EQ(trilu(1, std::numeric_limits<int64_t>::max()), (std::vector<int32_t>(9, 0)));
  EXPECT_EQ(trilu(1, std::numeric_limits<int64_t>::min()), (std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7, 8, 9}));
  // Batched, non-square: each [2,3] matrix separately.
  expect_near(run_op("Trilu", {{{2, 2, 3}, f32({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12})}}, {2, 2, 3},
                     {int_attr("upper", 1), int_attr("k", 1)}),
              {0, 2, 3, 0, 0, 6, 0, 8, 9, 0, 0, 12});
}

TEST(RuntimeKernels, PadConstantReflectEdge) {
  In x{{3}, f32({1, 2, 3})};
  auto pad = [&](int64_t mode, Dims pads, Dims out, float value = 0) {
    return run_op("Pad", {x}, out, {ints_attr("pads", pads), int_attr("mode", mode), float_attr("value", value)});
  };
  // Two before, one after.
  expect_near(pad(0, {2, 1}, {6}, 9), {9, 9, 1, 2, 3, 9});
  expect_near(pad(1, {2, 1}, {6}), {3, 2, 1, 2, 3, 2});  // mirror without repeating the edge
  expect_near(pad(2, {2, 1}, {6}), {1, 1, 1, 2, 3, 3});  // repeat the edge
  expect_near(pad(0, {-1, 0}, {2}), {2, 3});             // a negative pad crops
  // 2-D: one row before, one column after.
  expect_near(run_op("Pad", {{{2, 2}, f32({1, 2, 3, 4})}}, {3, 3},
                     {ints_attr("pads", {1, 0, 0, 1}), int_attr("mode", 0), float_attr("value", 0)}),
              {0, 0, 0, 1, 2, 0, 3, 4, 0});
  expect_near(run_op("Pad", {{{2, 2}, f32({1, 2, 3, 4})}}, {4, 3},
                     {ints_attr("pads", {1, 1, 1, 0}), int_attr("mode", 2), float_attr("value", 0)}),
              {1, 1, 2, 1, 1, 2, 3, 3, 4, 3, 3, 4});
  // int64 data: the constant is an int attribute, exact beyond float's 24 bits.
  EXPECT_EQ(run_op_as<int64_t>("Pad", {{{2}, i64({7, 8}), kI64}}, {4},
                               {ints_attr("pads", {1, 1}), int_attr("mode", 0), int_attr("value", 16777217)}),
            (std::vector<int64_t>{16777217, 7, 8, 16777217}));
}

// Every mode with pads and crops on every axis of a 3-D tensor, rows enough to be split over
// threads: each element as the ONNX definition places it, worked out here element by element.
TEST(RuntimeKernels, PadRowsMatchTheElementByElementDefinition) {
  const Dims xd = {3, 4, 37};
  std::vector<float> x(3 * 4 * 37);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i);
  for (int64_t mode : {0, 1, 2})
    for (const Dims& pads : {Dims{1, 2, 3, 2, 1, 5}, Dims{0, -1, -2, 1, 2, 0}, Dims{2, 0, 0, 0, 3, -3}}) {
      Dims yd(3);
      for (size_t a = 0; a < 3; ++a) yd[a] = xd[a] + pads[a] + pads[a + 3];
      std::vector<float> want;
      for (int64_t i = 0; i < yd[0]; ++i)
        for (int64_t j = 0; j < yd[1]; ++j)
          for (int64_t k = 0; k < yd[2]; ++k) {
            const int64_t at[3] = {i, j, k};
            int64_t offset = 0;
            bool inside = true;
            for (size_t a = 0; a < 3; ++a) {
              int64_t in = at[a] - pads[a];
              const int64_t n = xd[a];
              if (in < 0 || in >= n) {
                if (mode == 0) inside = false;
                in = mode == 2 ? std::clamp<int64_t>(in, 0, n - 1) : (in < 0 ? -in : 2 * (n - 1) - in);
              }
              offset = offset * n + in;
            }
            want.push_back(inside ? x[static_cast<size_t>(offset)] : -7.0f);
          }
      EXPECT_EQ(run_op("Pad", {{xd, f32(x)}}, yd, {ints_attr("pads", pads), int_attr("mode", mode), float_attr("value", -7.0f)}),
                want)
          << "mode " << mode << ", pads " << pads[0] << " " << pads[1] << " " << pads[2];
    }
}

// BatchNormalization with a fused Relu, on row-major images and on the same images channels last
// ([N, 1, H, W, C]): each value is Relu(x * s + (B - mean * s)), s = scale / sqrt(var + epsilon).
TEST(RuntimeKernels, BatchNormalizationWithItsReluInEitherLayoutIsTheDefinition) {
  const int64_t n = 2, c = 3, h = 4, w = 5;
  std::vector<float> x(static_cast<size_t>(n * c * h * w));
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.7f * static_cast<float>(i));
  const std::vector<float> scale = {1.5f, -0.5f, 2.0f}, bias = {0.1f, -0.2f, 0.3f}, mean = {0.3f, -0.4f, 0.0f},
                           var = {0.8f, 2.0f, 0.25f};
  const float eps = 1e-3f;
  std::vector<float> want(x.size()), last(x.size()), want_last(x.size());
  for (int64_t b = 0; b < n; ++b)
    for (int64_t k = 0; k < c; ++k) {
      const auto ck = static_cast<size_t>(k);
      const auto s = static_cast<float>(scale[ck] / std::sqrt(static_cast<double>(var[ck]) + eps));
      const float shift = bias[ck] - mean[ck] * s;
      for (int64_t i = 0; i < h * w; ++i) {
        const auto at = static_cast<size_t>((b * c + k) * h * w + i), at_last = static_cast<size_t>((b * h * w + i) * c + k);
        want[at] = std::max(x[at] * s + shift, 0.0f);
        last[at_last] = x[at];
        want_last[at_last] = want[at];
      }
    }
  const std::vector<In> params = {{{c}, f32(scale)}, {{c}, f32(bias)}, {{c}, f32(mean)}, {{c}, f32(var)}};
  const auto run = [&](const Dims& dims, const std::vector<float>& image, int64_t channels_last) {
    std::vector<In> in = {{dims, f32(image)}};
    in.insert(in.end(), params.begin(), params.end());
    return run_op("BatchNormalization", in, dims,
                  {float_attr("epsilon", eps), int_attr("act", static_cast<int64_t>(ref::Activation::kRelu)),
                   int_attr("channels_last", channels_last)});
  };
  EXPECT_EQ(run({n, c, h, w}, x, 0), want);
  EXPECT_EQ(run({n, 1, h, w, c}, last, 1), want_last);
}

// Rows of a few values, as a detector decodes its boxes ([1, 4420, 2] and 4): a Mul by a scalar,
// by a row of 2 and by a column, and a Concat along the last axis of rows of 1, 2 and 4 floats,
// against index arithmetic, on one thread and on two.
TEST(RuntimeKernels, ShortRowsMatchIndexArithmetic) {
  const int64_t boxes = 4420;
  std::vector<float> x(static_cast<size_t>(boxes * 2)), column(static_cast<size_t>(boxes));
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 97) * 0.25f - 3.0f;
  for (size_t i = 0; i < column.size(); ++i) column[i] = static_cast<float>(i % 5) + 0.5f;
  const std::vector<float> scalar = {0.1f}, pair = {0.1f, 0.2f};
  for (const runtime::ParallelFor& parallel : {runtime::ParallelFor{}, two_threads}) {
    for (const auto& [by, dims] : {std::pair{scalar, Dims{}}, std::pair{pair, Dims{1, 1, 2}}, std::pair{column, Dims{boxes, 1}}}) {
      ProgramBuilder p;
      const int32_t a = p.input({1, boxes, 2}), b = p.input(dims), y = p.output({1, boxes, 2});
      p.op("Mul", {a, b}, y);
      const auto got = values_of<float>(run_bytes(p.program(), {f32(x), f32(by)}, {}, parallel)[0]);
      std::vector<float> want(x.size());
      for (size_t i = 0; i < x.size(); ++i)
        want[i] = x[i] * (by.size() == 1 ? by[0] : by.size() == 2 ? by[i % 2] : by[i / 2]);
      EXPECT_EQ(got, want) << "by " << by.size() << " values";
    }
    ProgramBuilder p;
    const int32_t a = p.input({1, boxes, 1}), b = p.input({1, boxes, 2}), c = p.input({1, boxes, 4});
    const int32_t y = p.output({1, boxes, 7});
    p.op("Concat", {a, b, c}, y, {int_attr("axis", 2)});
    std::vector<float> four(static_cast<size_t>(boxes * 4));
    for (size_t i = 0; i < four.size(); ++i) four[i] = -static_cast<float>(i);
    const auto got = values_of<float>(run_bytes(p.program(), {f32(column), f32(x), f32(four)}, {}, parallel)[0]);
    std::vector<float> want;
    for (int64_t r = 0; r < boxes; ++r) {
      want.push_back(column[static_cast<size_t>(r)]);
      for (int64_t j = 0; j < 2; ++j) want.push_back(x[static_cast<size_t>(r * 2 + j)]);
      for (int64_t j = 0; j < 4; ++j) want.push_back(four[static_cast<size_t>(r * 4 + j)]);
    }
    EXPECT_EQ(got, want);
  }
}

TEST(RuntimeKernels, ReduceMaxAndMin) {
  In x{{2, 3}, f32({1, 5, -2, 4, 0, 3})};
  expect_near(run_op("ReduceMax", {x}, {2}, {ints_attr("axes", {1}), int_attr("keepdims", 0)}), {5, 4});
  expect_near(run_op("ReduceMin", {x}, {1, 3}, {ints_attr("axes", {0}), int_attr("keepdims", 1)}), {1, 0, -2});
  expect_near(run_op("ReduceMax", {x}, {}, {ints_attr("axes", {}), int_attr("keepdims", 0)}), {5});
  expect_near(run_op("ReduceMin", {x}, {1, 1}, {ints_attr("axes", {0, 1}), int_attr("keepdims", 1)}), {-2});
  // All-negative rows (the initial value is -inf, not 0) and a NaN, which wins.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  auto got = run_op("ReduceMax", {{{2, 2}, f32({-3, -1, nan, 7})}}, {2}, {ints_attr("axes", {1}), int_attr("keepdims", 0)});
  EXPECT_EQ(got[0], -1);
  EXPECT_TRUE(std::isnan(got[1]));
  got = run_op("ReduceMin", {{{3}, f32({2, nan, -1})}}, {1}, {ints_attr("axes", {0}), int_attr("keepdims", 1)});
  EXPECT_TRUE(std::isnan(got[0]));
}

TEST(RuntimeKernels, LogSoftmax) {
  // log(softmax({0, ln 3})) = {ln 1/4, ln 3/4}.
  expect_near(run_op("LogSoftmax", {{{2}, f32({0, std::log(3.0f)})}}, {2}, {int_attr("axis", 0), int_attr("coerce_2d", 0)}),
              {-1.38629436f, -0.28768207f});
  // Along axis 0 of [2,2]: columns {0, ln 3} and {5, 5}; large values stay finite.
  expect_near(run_op("LogSoftmax", {{{2, 2}, f32({0, 5, std::log(3.0f), 5})}}, {2, 2},
                     {int_attr("axis", 0), int_attr("coerce_2d", 0)}),
              {-1.38629436f, -0.69314718f, -0.28768207f, -0.69314718f});
  expect_near(run_op("LogSoftmax", {{{2}, f32({1000, 1000})}}, {2}, {int_attr("axis", 0), int_attr("coerce_2d", 0)}),
              {-0.69314718f, -0.69314718f});
  // coerce_2d: one log-softmax over the flattened [2,2] block (exps 1, 1, 3, 1; sum 6).
  expect_near(run_op("LogSoftmax", {{{1, 2, 2}, f32({0, 0, std::log(3.0f), 0})}}, {1, 2, 2},
                     {int_attr("axis", 1), int_attr("coerce_2d", 1)}),
              {-1.79175947f, -1.79175947f, -0.69314718f, -1.79175947f});
}

// One channel per group: InstanceNormalization, as the compiler lowers it.
TEST(RuntimeKernels, GroupNormalizationOneChannelPerGroup) {
  // [N=2, C=2, L=2], scale {2, 1}, bias {0.5, -1}. Every (n, c) pair has values m -+ s, so it
  // normalises to {-1, 1}: channel 0 gives {-1.5, 2.5}, channel 1 gives {-2, 0}.
  In scale{{2}, f32({2, 1})}, bias{{2}, f32({0.5f, -1})};
  expect_near(run_op("GroupNormalization", {{{2, 2, 2}, f32({1, 3, 0, 4, -1, 1, 2, 8})}, scale, bias}, {2, 2, 2},
                     {int_attr("groups", 2), float_attr("epsilon", 0)}),
              {-1.5f, 2.5f, -2, 0, -1.5f, 2.5f, -2, 0});
  // epsilon counted: {1, 3} has variance 1; with epsilon 3, (x - 2) / 2.
  expect_near(run_op("GroupNormalization", {{{1, 1, 2}, f32({1, 3})}, {{1}, f32({1})}, {{1}, f32({0})}}, {1, 1, 2},
                     {int_attr("groups", 1), float_attr("epsilon", 3)}),
              {-0.5f, 0.5f});
  // Two channels in one group: normalised together over {1, 3, 5, 7} (mean 4, variance 5).
  float inv = 1.0f / std::sqrt(5.0f);
  expect_near(run_op("GroupNormalization", {{{1, 2, 2}, f32({1, 3, 5, 7})}, {{2}, f32({1, 1})}, {{2}, f32({0, 0})}},
                     {1, 2, 2}, {int_attr("groups", 1), float_attr("epsilon", 0)}),
              {-3 * inv, -inv, inv, 3 * inv});
}

TEST(RuntimeKernels, MoreUnaryOps) {
  auto x = f32({-2, -0.5f, 0, 1, 4});
  auto unary = [&](const std::string& type, std::vector<ref::Attr> attrs = {}) {
    return run_op(type, {{{5}, x}}, {5}, std::move(attrs));
  };
  // log(1 + e^x).
  expect_near(unary("Softplus"), {0.12692801f, 0.47407698f, 0.69314718f, 1.31326169f, 4.01814993f});
  // Large inputs neither overflow nor lose the tiny tail.
  auto tails = run_op("Softplus", {{{2}, f32({100, -20})}}, {2});
  EXPECT_FLOAT_EQ(tails[0], 100);
  EXPECT_FLOAT_EQ(tails[1], std::exp(-20.0f));
  // alpha * (e^x - 1) below 0.
  expect_near(unary("Elu", {float_attr("alpha", 0.5f)}), {-0.43233236f, -0.19673467f, 0, 1, 4});
  // gamma * x above 0, gamma * alpha * (e^x - 1) at or below.
  expect_near(unary("Selu", {float_attr("alpha", 2), float_attr("gamma", 3)}), {-5.18798830f, -2.36081604f, 0, 3, 12});
  expect_near(run_op("Log", {{{3}, f32({1, std::exp(1.0f), 0.5f})}}, {3}), {0, 1, -0.69314718f});
  expect_near(run_op("Sin", {{{2}, f32({0, 1.57079633f})}}, {2}), {0, 1});
  expect_near(run_op("Cos", {{{2}, f32({0, 3.14159265f})}}, {2}), {1, -1});
  expect_near(run_op("Reciprocal", {{{3}, f32({2, -4, 0.5f})}}, {3}), {0.5f, -0.25f, 2});
  // PRelu: slope [2] broadcast along the last axis.
  expect_near(run_op("PRelu", {{{2, 2}, f32({-1, 2, -3, 4})}, {{2}, f32({0.5f, 0.25f})}}, {2, 2}), {-0.5f, 2, -1.5f, 4});
  expect_near(run_op("Max", {{{3}, f32({1, -2, 3})}, {{1}, f32({0})}}, {3}), {1, 0, 3});
  expect_near(run_op("Min", {{{3}, f32({1, -2, 3})}, {{1}, f32({0})}}, {3}), {0, -2, 0});
}

TEST(RuntimeKernels, ShapeAndSizeReadDimsOnly) {
  In x{{2, 3, 4}, f32(std::vector<float>(24, 0))};
  auto shape = [&](int64_t start, int64_t end, Dims out) {
    return run_op_as<int64_t>("Shape", {x}, out, {int_attr("start", start), int_attr("end", end)});
  };
  EXPECT_EQ(shape(0, 3, {3}), (std::vector<int64_t>{2, 3, 4}));
  EXPECT_EQ(shape(1, 2, {1}), (std::vector<int64_t>{3}));
  EXPECT_EQ(shape(2, 3, {1}), (std::vector<int64_t>{4}));
  EXPECT_TRUE(shape(2, 2, {0}).empty());
  EXPECT_EQ(run_op_as<int64_t>("Size", {x}, {}), (std::vector<int64_t>{24}));
  // Any element type.
  EXPECT_EQ(run_op_as<int64_t>("Shape", {{{5}, b8({0, 1, 0, 1, 0}), kBool}}, {1}, {int_attr("start", 0), int_attr("end", 1)}),
            (std::vector<int64_t>{5}));
  EXPECT_EQ(run_op_as<int64_t>("Size", {{{2, 2}, i64({1, 2, 3, 4}), kI64}}, {}), (std::vector<int64_t>{4}));
}

// Integer values flowing through several ops: Shape -> Gather -> Mul -> Cast, as exported models
// compute shapes; the arena holds int64 values of other sizes than float.
TEST(RuntimeKernels, IntegerShapeArithmeticThroughTheArena) {
  ProgramBuilder b;
  int32_t x = b.input({2, 3, 4});
  int32_t idx = b.weight({2}, 0, kI32);
  int32_t shape = b.arena({3}, -1, kI64);
  int32_t picked = b.arena({2}, -1, kI64);
  int32_t doubled = b.arena({2}, -1, kI64);
  int32_t y = b.output({2});
  b.op("Shape", {x}, shape, {int_attr("start", 0), int_attr("end", 3)});
  b.op("Gather", {shape, idx}, picked, {int_attr("axis", 0)});
  b.op("Add", {picked, picked}, doubled);
  b.op("Cast", {doubled}, y, {dtype_attr("to", kF32)});
  // Indices {2, 0}: dims 4 and 2, doubled.
  auto out = run(b.program(), {f32(std::vector<float>(24, 0))}, {i32({2, 0})});
  EXPECT_EQ(out[0], (std::vector<float>{8, 4}));
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
  auto no_weights = [](uint32_t) -> const uint8_t* { return nullptr; };
  expect_error([&] { runtime::execute(b.program(), no_weights, {}, {&out}); }, ErrorCode::kRuntime,
               "0 input buffers given, the graph has 1");
  expect_error([&] { runtime::execute(b.program(), no_weights, {&in}, {}); }, ErrorCode::kRuntime,
               "0 output buffers given, the graph has 1");
  expect_error([&] { runtime::execute(b.program(), no_weights, {nullptr}, {&out}); }, ErrorCode::kRuntime,
               "no buffer for input 0");
}

TEST(RuntimeKernels, SupportedOpsListsEveryKernel) {
  auto ops = runtime::supported_ops();
  // The ref op set of this contract (more may be added; none of these may go).
  for (const char* type : {"Add", "Sub", "Mul", "Div", "Pow", "Neg", "Abs", "Sqrt", "Exp", "Erf", "Relu", "Sigmoid",
                           "Tanh", "HardSwish", "LeakyRelu", "HardSigmoid", "Clip", "Softmax", "MatMul", "Gemm", "Conv",
                           "MaxPool", "AveragePool", "BatchNormalization", "LayerNormalization", "ReduceMean",
                           "ReduceSum", "Transpose", "Reshape", "Concat", "Slice", "Gather", "Min", "Max", "PRelu",
                           "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "And", "Or", "Xor", "Not",
                           "Where", "Cast", "Log", "Sin", "Cos", "Reciprocal", "Softplus", "Elu", "Selu",
                           "ConstantOfShape", "Range", "LogSoftmax", "GroupNormalization", "ReduceMax", "ReduceMin",
                           "Expand", "Tile", "Trilu", "Pad", "Shape", "Size"})
    EXPECT_NE(std::find(ops.begin(), ops.end(), type), ops.end()) << type;
  EXPECT_GE(ops.size(), 65u);
  for (const char* type : {"Floor", "Round", "Det"})
    EXPECT_EQ(std::find(ops.begin(), ops.end(), type), ops.end()) << type;
  // Every listed op has a rule: infer_output may refuse the empty op, but never as unknown.
  for (const auto& type : ops) {
    ref::Op op;
    op.type = type;
    try {
      runtime::infer_output(op, {}, "probe");
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()).find("unknown op type"), std::string::npos) << e.what();
    }
  }
  expect_error([] { ref::Op op; op.type = "Round"; runtime::infer_output(op, {}, "probe"); }, ErrorCode::kInvalidBinary,
               "probe: unknown op type 'Round'");
  auto sorted = ops;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(std::adjacent_find(sorted.begin(), sorted.end()), sorted.end()) << "an op is listed twice";
}

}  // namespace
}  // namespace ctxgen::testing

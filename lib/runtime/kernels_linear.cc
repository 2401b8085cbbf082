// MatMul and Gemm, reduced to one row-major GEMM (which Conv uses too).

#include <algorithm>
#include <array>
#include <cstring>
#include <exception>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <oneapi/dnnl/dnnl.hpp>

#include "ctxgen/error.h"
#include "kept.h"
#include "kernels.h"
#include "onednn.h"

namespace ctxgen::runtime {

// Through oneDNN's GEMM (docs/benchmarks.md, "Kernel library": the fastest Debian offers on every shape
// measured). A large product is cut into blocks of y's columns that the caller's threads share;
// each block runs on its thread alone, so the thread count is the caller's (ONNX Runtime's
// intra-op pool in the plugin EP), not OpenMP's.
namespace {

// The width of the blocks of y's columns a product is cut into for the caller's threads (n: one).
int64_t column_width(int64_t m, int64_t n, int64_t k) {
  // Multiply-adds below which threads cost more than they give: a single row by a 256 x 256 weight
  // (a 256-wide transformer's decode step) gains from two (0.33-0.38 -> 0.30-0.33 ms a step).
  constexpr int64_t kMinParallelWork = int64_t{1} << 16;
  constexpr int64_t kMaxBlocks = 4;
  // Each call of sgemm costs more the narrower its block: 16 rows x 1024 x 256 took 326 µs in 4
  // blocks of 64 columns against 154 in 2 of 128 (weights out of cache, one thread), and a
  // 16-row transformer's projections paid it on every layer, on one thread as on two.
  constexpr int64_t kMinWidth = 128;
  if (m * n * k < kMinParallelWork) return n;
  return std::min(n, std::max<int64_t>(kMinWidth, ((n + kMaxBlocks - 1) / kMaxBlocks + 15) / 16 * 16));
}

}  // namespace

void gemm_rowmajor(int64_t m, int64_t n, int64_t k, const float* a, const float* b, float* y, const ParallelFor* parallel,
                   bool trans_a, bool trans_b, const Epilogue& after, float* few_rows) {
  const int64_t width = parallel && *parallel ? column_width(m, n, k) : n;
  const int64_t blocks = (n + width - 1) / width;
  if (k == 0) {  // an empty sum, whatever a library makes of K = 0
    std::fill(y, y + m * n, 0.0f);
    if (after) after(0, n);
    return;
  }
  const auto block = [&](size_t index) {
    const int64_t j0 = static_cast<int64_t>(index) * width, cols = std::min(width, n - j0);
    onednn::OneThread one;
    dnnl_status_t status;
    if (few_rows && trans_b && !trans_a && m <= kFewRows) {
      // oneDNN streams a weight [N, K] read as B transposed at half the speed it streams it as A:
      // a 16-row transformer's 16 x 256 x 1024 took 114 µs so, and half as long as the
      // transposed product (B·Aᵀ) and a transpose of its 16 x 1024 result (transformer_256_seq16
      // 1.52 -> 1.04 x ONNX Runtime on one thread).
      float* t = few_rows + j0 * m;
      status = dnnl_sgemm('N', 'T', cols, m, k, 1.0f, b + j0 * k, k, a, k, 0.0f, t, m);
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < cols; ++j) y[i * n + j0 + j] = t[j * m + i];
    } else {
      status = dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, cols, k, 1.0f, a, trans_a ? m : k,
                          trans_b ? b + j0 * k : b + j0, trans_b ? k : n, 0.0f, y + j0, n);
    }
    if (status != dnnl_success)
      throw Error(ErrorCode::kRuntime, "oneDNN's sgemm failed (status " + std::to_string(static_cast<int>(status)) +
                                           ") on " + std::to_string(m) + " x " + std::to_string(k) + " x " +
                                           std::to_string(cols));
    if (after) after(j0, cols);
  };
  if (blocks == 1)
    block(0);
  else
    (*parallel)(static_cast<size_t>(blocks), std::cref(block));
}

// oneDNN's reorder transposes at about three times the speed of a tiled loop (16 MB on two
// threads: 5 vs 15 ms), and packing is most of what compiling a large model costs. A large matrix
// is cut into two column halves, each on a thread of its own: OpenMP's idle workers would spin
// between weights, taking the core the kernel's writeback of the output needs.
MadeBytes transpose_matrix(const uint8_t* from, size_t rows, size_t cols) {
  constexpr size_t kThreadedBytes = size_t{1} << 22;
  MadeBytes to(rows * cols * sizeof(float));
  if (to.empty()) return to;
  const auto r = static_cast<int64_t>(rows);
  // Columns [c0, c1) of `from` into rows [c0, c1) of `to`.
  const auto columns = [&](int64_t c0, int64_t c1) {
    const dnnl::memory::dims dims{r, c1 - c0};
    const dnnl::memory::desc src_desc(dims, dnnl::memory::data_type::f32, dnnl::memory::dims{static_cast<int64_t>(cols), 1});
    const dnnl::memory::desc dst_desc(dims, dnnl::memory::data_type::f32, dnnl::memory::dims{1, r});
    onednn::OneThread one;
    dnnl::memory src(src_desc, onednn::engine(), const_cast<uint8_t*>(from) + c0 * sizeof(float));
    dnnl::memory dst(dst_desc, onednn::engine(), to.data() + c0 * r * sizeof(float));
    dnnl::reorder(src, dst).execute(onednn::stream(), src, dst);
    onednn::stream().wait();
  };
  const auto c = static_cast<int64_t>(cols);
  try {
    if (to.size() < kThreadedBytes || cols < 2) {
      columns(0, c);
    } else {
      std::exception_ptr failed;
      std::thread other([&] {
        try {
          columns(c / 2, c);
        } catch (...) {
          failed = std::current_exception();
        }
      });
      try {
        columns(0, c / 2);
      } catch (...) {
        other.join();
        throw;
      }
      other.join();
      if (failed) std::rethrow_exception(failed);
    }
  } catch (const dnnl::error& e) {
    throw Error(ErrorCode::kInternal, std::string("oneDNN cannot transpose a ") + std::to_string(rows) + " x " +
                                          std::to_string(cols) + " matrix: " + e.what());
  }
  return to;
}

namespace {

// A product of 2 to 32 rows by a constant B stored [N, K] with 256 < K <= 512, on oneDNN's matmul
// with B laid out for it once a session (in blocks of columns the caller's threads share, as
// gemm_rowmajor cuts them): there its blocked layout streams B faster than sgemm reads the plain
// one (16 x 512 x 2048 out of cache: 6.3 against 8.5 ms for 12 of them on one thread, side by
// side; the 512-wide transformer's 16-token step 1.17-1.34 -> 1.07-1.11 of ONNX Runtime's time).
// Elsewhere it was not: K = 256 as fast, K = 1024 and a single row slower, and laying B out costs
// session creation ~0.3 ms a MB. A block writes its columns densely (a strided destination takes
// oneDNN's slower GEMM), into y when it is the only one, else into the run's scratch, whence
// they are copied.
struct PackedProduct {
  struct Block {
    int64_t j0 = 0, cols = 0;
    dnnl::primitive primitive;
    dnnl::memory::desc src, dst;
    dnnl::memory weights;
  };
  std::vector<Block> blocks;
};

std::shared_ptr<const PackedProduct> pack_product(int64_t m, int64_t n, int64_t k, const float* b) {
  using Desc = dnnl::memory::desc;
  constexpr auto f32 = dnnl::memory::data_type::f32;
  auto packed = std::make_shared<PackedProduct>();
  onednn::OneThread one;
  const int64_t width = column_width(m, n, k);
  try {
    for (int64_t j0 = 0; j0 < n; j0 += width) {
      const int64_t cols = std::min(width, n - j0);
      const Desc src({m, k}, f32, dnnl::memory::format_tag::ab), dst({m, cols}, f32, dnnl::memory::format_tag::ab);
      const dnnl::matmul::primitive_desc pd(
          dnnl::matmul::desc(src, Desc({k, cols}, f32, dnnl::memory::format_tag::any), dst), onednn::engine());
      if (std::string(pd.impl_info_str()).starts_with("ref")) return nullptr;  // sgemm then
      dnnl::memory weights(pd.weights_desc(), onednn::engine());
      // Rows [j0, j0 + cols) of B [N, K] are B's columns as [K, cols].
      dnnl::memory from(Desc({k, cols}, f32, dnnl::memory::dims{1, k}), onednn::engine(), const_cast<float*>(b + j0 * k));
      onednn::reorder(dnnl::reorder(from, weights), from, weights);
      packed->blocks.push_back({j0, cols, dnnl::matmul(pd), src, dst, std::move(weights)});
    }
  } catch (const dnnl::error& e) {
    throw Error(ErrorCode::kRuntime, std::string("oneDNN cannot lay out a ") + std::to_string(k) + " x " +
                                         std::to_string(n) + " weight for its product: " + e.what());
  }
  return packed;
}

// The sessions of a process holding the same B share its layout.
KeptWhileUsed<PackedProduct>& packed_products() {
  static KeptWhileUsed<PackedProduct> kept;
  return kept;
}

// A packed product's oneDNN memory objects in a run state: each block's source and destination.
struct ProductMemories final : OpState, onednn::MemorySlots {
  explicit ProductMemories(size_t blocks) : MemorySlots(2 * blocks) {}
};

void run_packed(const PackedProduct& p, int64_t m, int64_t n, const float* a, float* y, const Output& out,
                const Epilogue& after) {
  std::optional<ProductMemories> own;  // called without a run state (a test): kept for this run alone
  auto& memories = out.state ? static_cast<ProductMemories&>(*out.state) : own.emplace(p.blocks.size());
  auto* scratch = reinterpret_cast<float*>(out.scratch);
  const bool whole = p.blocks.size() == 1;
  const auto block = [&](size_t i) {
    const PackedProduct::Block& b = p.blocks[i];
    onednn::OneThread one;
    float* dst = whole ? y : scratch + b.j0 * m;
    const dnnl_exec_arg_t args[] = {{DNNL_ARG_SRC, memories.at(2 * i, b.src, a).get()},
                                    {DNNL_ARG_WEIGHTS, b.weights.get()},
                                    {DNNL_ARG_DST, memories.at(2 * i + 1, b.dst, dst).get()}};
    onednn::execute(b.primitive, args, 3);
    if (!whole)
      for (int64_t r = 0; r < m; ++r) std::memcpy(y + r * n + b.j0, dst + r * b.cols, static_cast<size_t>(b.cols) * sizeof(float));
    if (after) after(b.j0, b.cols);
  };
  if (!whole && out.parallel && *out.parallel)
    (*out.parallel)(p.blocks.size(), std::cref(block));
  else
    for (size_t i = 0; i < p.blocks.size(); ++i) block(i);
}

}  // namespace

namespace kernels {

// MatMul's and Gemm's attributes, and how a batched MatMul steps through its operands.
struct Product final : OpPlan {
  Product(const ref::Op& op, const std::vector<const ref::Value*>& in, const ref::Value& out)
      : trans_a(op.get_int("transA", 0) != 0), trans_b(op.get_int("transB", 0) != 0),
        alpha(op.get_float("alpha", 1.0f)), beta(op.get_float("beta", 1.0f)), act(fused_activation_of(op)) {
    // C keeps its own dims (scalar, [N], [1, N], [M, 1], [M, N] ...): broadcast to [M, N].
    if (op.type == "Gemm" && in.size() > 2 && in[2]) c_strides = broadcast_strides(in[2]->dims, out.dims);
    // One product of few rows by a weight stored [N, K] (gemm_rowmajor).
    const bool whole = op.type == "Gemm" || in[1]->dims.size() == 2;
    const int64_t rows = out.dims.empty() ? 1 : product(out.dims, 0, out.dims.size() - 1);
    if (whole && trans_b && !trans_a && rows <= kFewRows) {
      scratch_bytes = static_cast<uint64_t>(product(out.dims)) * sizeof(float);
      few_rows = {rows, in[1]->dims[0], in[1]->dims[1]};
    }
    if (op.type != "MatMul" || in[1]->dims.size() == 2) return;
    // Vectors seen as [1, K] (A) and [K, 1] (B), as the rule defines; B's logical dims with transB.
    const Dims& a0 = in[0]->dims;
    const Dims& b0 = in[1]->dims;
    const Dims ad = a0.size() == 1 ? Dims{1, a0[0]} : a0;
    Dims bd = b0.size() == 1 ? Dims{b0[0], 1} : b0;
    if (trans_b) std::swap(bd[bd.size() - 2], bd.back());
    m = ad[ad.size() - 2];
    n = bd.back();
    k = ad.back();
    // Batch offsets through broadcast strides over the batch dims, in units of whole matrices.
    batch = *broadcast({ad.begin(), ad.end() - 2}, {bd.begin(), bd.end() - 2});
    a_strides = broadcast_strides(Dims(ad.begin(), ad.end() - 2), batch);
    b_strides = broadcast_strides(Dims(bd.begin(), bd.end() - 2), batch);
  }
  std::unique_ptr<OpState> make_state() const override {
    return packed ? std::make_unique<ProductMemories>(packed->blocks.size()) : nullptr;
  }
  void take_constants(const std::vector<const void*>& data) override {
    const int64_t m = few_rows[0], n = few_rows[1], k = few_rows[2];  // clang 14 lambdas capture no bindings
    if (m < 2 || k <= 256 || k > 512 || !data[1] || n == 0) return;
    // Keyed by where B lies: while an entry lives, the session holding it keeps B's bytes there,
    // so no other B can be at that address (hashing 32 MB of a transformer's weights cost 1.6 ms).
    std::string key(reinterpret_cast<const char*>(&data[1]), sizeof data[1]);
    for (int64_t d : few_rows) key.append(reinterpret_cast<const char*>(&d), sizeof d);
    packed = packed_products().find(key, [&] { return pack_product(m, n, k, static_cast<const float*>(data[1])); });
  }
  bool trans_a, trans_b;
  std::array<int64_t, 3> few_rows{};             // m, n, k of a product of few rows by a B stored [N, K]
  std::shared_ptr<const PackedProduct> packed;  // when that B is constant (and oneDNN runs it)
  float alpha, beta;  // Gemm's
  FusedActivation act;
  Dims c_strides;                    // Gemm's C, over [M, N]
  int64_t m = 0, n = 0, k = 0;       // of each product of a batched MatMul
  Dims batch, a_strides, b_strides;  // a batched MatMul's batch dims and its operands' strides over them
};
const Planner plan_product = plan_as<Product>;

void matmul(Ins in, const Output& out) {
  const auto& p = plan_of<Product>(out);
  float* y = out.f32();
  const FusedActivation& act = p.act;
  // A 2-D B serves every row of A alike, whatever A's batch dims: one GEMM over all of them.
  if (in[1].dims().size() == 2) {
    const Dims& ad = in[0].dims();
    const Dims& bd = in[1].dims();
    const int64_t k = p.trans_b ? bd[1] : bd[0], n = p.trans_b ? bd[0] : bd[1], m = product(ad, 0, ad.size() - 1);
    const auto epilogue = [&](int64_t j0, int64_t cols) {
      if (!act.empty())
        for (int64_t i = 0; i < m; ++i) act.apply(y + i * n + j0, cols);
    };
    if (p.packed) return run_packed(*p.packed, m, n, in[0].f32(), y, out, epilogue);
    gemm_rowmajor(m, n, k, in[0].f32(), in[1].f32(), y, out.parallel, false, p.trans_b, epilogue,
                  p.scratch_bytes > 0 ? reinterpret_cast<float*>(out.scratch) : nullptr);
    return;
  }
  const int64_t m = p.m, n = p.n, k = p.k;
  const Dims &batch = p.batch, &sa = p.a_strides, &sb = p.b_strides;
  // Many small products (attention heads): the threads share out whole matrices.
  parallel_ranges(out.parallel, product(batch), m * n * k, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      int64_t oa = 0, ob = 0;
      for (size_t d = batch.size(), rest = static_cast<size_t>(t); d-- > 0;) {
        const auto at = static_cast<int64_t>(rest % static_cast<size_t>(batch[d]));
        rest /= static_cast<size_t>(batch[d]);
        oa += at * sa[d];
        ob += at * sb[d];
      }
      gemm_rowmajor(m, n, k, in[0].f32() + oa * m * k, in[1].f32() + ob * k * n, y + t * m * n, nullptr, false, p.trans_b);
      act.apply(y + t * m * n, m * n);
    }
  });
}

void gemm(Ins in, const Output& out) {
  const auto& p = plan_of<Product>(out);
  const Dims& ad = in[0].dims();
  const bool trans_a = p.trans_a, trans_b = p.trans_b;
  int64_t m = out.dims()[0], n = out.dims()[1], k = trans_a ? ad[0] : ad[1];
  float* y = out.f32();
  const float alpha = p.alpha, beta = p.beta;
  const bool has_c = in.size() > 2 && in[2].present();
  const Dims& sc = p.c_strides;
  const float* c = has_c ? in[2].f32() : nullptr;
  const FusedActivation& act = p.act;
  const auto epilogue = [&](int64_t j0, int64_t cols) {
    for (int64_t i = 0; i < m; ++i) {
      float* row = y + i * n;
      if (has_c)
        for (int64_t j = j0; j < j0 + cols; ++j) row[j] = alpha * row[j] + beta * c[i * sc[0] + j * sc[1]];
      else if (alpha != 1.0f)
        for (int64_t j = j0; j < j0 + cols; ++j) row[j] *= alpha;
      act.apply(row + j0, cols);
    }
  };
  if (p.packed) return run_packed(*p.packed, m, n, in[0].f32(), y, out, epilogue);
  gemm_rowmajor(m, n, k, in[0].f32(), in[1].f32(), y, out.parallel, trans_a, trans_b, epilogue,
                p.scratch_bytes > 0 ? reinterpret_cast<float*>(out.scratch) : nullptr);
}

}  // namespace kernels
}  // namespace ctxgen::runtime

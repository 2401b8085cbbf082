// MatMul and Gemm, reduced to one row-major GEMM (which Conv uses too).

#include <algorithm>
#include <array>
#include <cstring>
#include <exception>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <immintrin.h>

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

// Runs block(j0, cols) over y's columns cut into blocks of `width`, the caller's threads sharing them.
void column_blocks(int64_t n, int64_t width, const ParallelFor* parallel, FunctionRef<void(int64_t, int64_t)> block) {
  const int64_t blocks = (n + width - 1) / width;
  const auto one = [&](size_t index) {
    const int64_t j0 = static_cast<int64_t>(index) * width;
    block(j0, std::min(width, n - j0));
  };
  if (blocks == 1)
    one(0);
  else
    (*parallel)(static_cast<size_t>(blocks), std::cref(one));
}

}  // namespace

void gemm_rowmajor(int64_t m, int64_t n, int64_t k, const float* a, const float* b, float* y, const ParallelFor* parallel,
                   bool trans_a, bool trans_b, const Epilogue& after, float* few_rows) {
  if (k == 0) {  // an empty sum, whatever a library makes of K = 0
    std::fill(y, y + m * n, 0.0f);
    if (after) after(0, n);
    return;
  }
  column_blocks(n, parallel && *parallel ? column_width(m, n, k) : n, parallel, [&](int64_t j0, int64_t cols) {
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
  });
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

// A product of 2 to 32 rows by a constant B stored [N, K] with 256 < K <= 512 (AVX-512 only): B
// laid out once a session in panels of 32 columns, each [K][32], so a panel streams from memory
// in one pass while up to 12 rows of A, broadcast, accumulate into 24 registers; the next panel
// is prefetched into L2 as one is consumed (a transformer's weights come from L3 or memory, not
// L2). In the 512-wide transformer's 16-token step, its 16 x 512 x 2048 product took 286-305 µs
// so against 441-565 on oneDNN's matmul over its blocked B and 425-447 in ONNX Runtime, the
// 16 x 512 x 512 ones 76 against 126-143 and 117-120. Every K gained (K = 256 .. 4096: the
// 1024-wide step 0.96 -> 0.80 of ONNX Runtime's time) but laying B out costs session creation
// ~0.3 ms a MB, hence the window. The last panel is zero-filled past N.
constexpr int64_t kPanel = 32;
constexpr int64_t kPanelRows = 12;

struct PanelB {
  int64_t n = 0, k = 0;
  Laid data;
  float* panel(int64_t p) const { return reinterpret_cast<float*>(data.get()) + p * k * kPanel; }
};

// Each panel of B [N, K] is a transposition of 32 of its rows: oneDNN's reorder transposes at
// about three times a plain loop's speed (transpose_matrix), and laying out a 512-wide
// transformer's 32 MB of B took 20 ms a session with the loop.
std::shared_ptr<const PanelB> pack_panels(int64_t n, int64_t k, const float* b) {
  using Desc = dnnl::memory::desc;
  constexpr auto f32 = dnnl::memory::data_type::f32;
  auto packed = std::make_shared<PanelB>();
  const int64_t full = n / kPanel, tail = n % kPanel, panels = full + (tail ? 1 : 0);
  packed->data = laid_bytes(static_cast<size_t>(panels * k * kPanel) * sizeof(float));
  packed->n = n;
  packed->k = k;
  // Panels [p0, p0 + count) of `width` columns, as a [count, K, width] view of each side.
  const auto lay = [&](int64_t p0, int64_t count, int64_t width) {
    const dnnl::memory::dims dims{count, k, width};
    dnnl::memory from(Desc(dims, f32, {kPanel * k, 1, k}), onednn::engine(), const_cast<float*>(b + p0 * kPanel * k));
    dnnl::memory to(Desc(dims, f32, {kPanel * k, kPanel, 1}), onednn::engine(), packed->panel(p0));
    onednn::reorder(dnnl::reorder(from, to), from, to);
  };
  onednn::OneThread one;
  try {
    if (full) lay(0, full, kPanel);
    if (tail) {
      std::fill(packed->panel(full), packed->panel(panels), 0.0f);
      lay(full, 1, tail);
    }
  } catch (const dnnl::error& e) {
    throw Error(ErrorCode::kRuntime, std::string("oneDNN cannot lay out a ") + std::to_string(k) + " x " +
                                         std::to_string(n) + " weight in panels: " + e.what());
  }
  return packed;
}

// Rows [0, R) of A times one panel into y's columns [0, cols) (cols <= 32).
template <int R>
__attribute__((target("avx512f"))) void panel_rows(int64_t k, const float* a, int64_t lda, const float* panel,
                                                   const float* next, float* y, int64_t ldy, int64_t cols) {
  // Unrolled, so that the accumulators stay in registers (-O2 kept them on the stack).
  __m512 c0[R], c1[R];
#pragma GCC unroll 12
  for (int r = 0; r < R; ++r) c0[r] = c1[r] = _mm512_setzero_ps();
  constexpr int64_t kAhead = 32;  // steps of K ahead the L1 prefetch reads (4 KB)
  for (int64_t i = 0; i < k; ++i) {
    const float* q = panel + i * kPanel;
    if (next) {
      _mm_prefetch(reinterpret_cast<const char*>(next + i * kPanel), _MM_HINT_T1);
      _mm_prefetch(reinterpret_cast<const char*>(next + i * kPanel + 16), _MM_HINT_T1);
    }
    _mm_prefetch(reinterpret_cast<const char*>(q + kAhead * kPanel), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(q + kAhead * kPanel + 16), _MM_HINT_T0);
    const __m512 b0 = _mm512_load_ps(q), b1 = _mm512_load_ps(q + 16);
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r) {
      const __m512 x = _mm512_set1_ps(a[r * lda + i]);
      c0[r] = _mm512_fmadd_ps(x, b0, c0[r]);
      c1[r] = _mm512_fmadd_ps(x, b1, c1[r]);
    }
  }
  const auto low = static_cast<__mmask16>(cols >= 16 ? 0xFFFF : (1u << cols) - 1);
  const auto high = static_cast<__mmask16>(cols >= 32 ? 0xFFFF : cols <= 16 ? 0 : (1u << (cols - 16)) - 1);
#pragma GCC unroll 12
  for (int r = 0; r < R; ++r) {
    _mm512_mask_storeu_ps(y + r * ldy, low, c0[r]);
    _mm512_mask_storeu_ps(y + r * ldy + 16, high, c1[r]);
  }
}

template <int... R>
constexpr std::array<decltype(&panel_rows<1>), sizeof...(R)> row_kernels(std::integer_sequence<int, R...>) {
  return {&panel_rows<R + 1>...};
}

// y's columns [j0, j0 + cols) (j0 a multiple of 32) of A [m, k] times the panels.
void run_panels(const PanelB& b, int64_t m, const float* a, float* y, int64_t j0, int64_t cols) {
  static constexpr auto kernels = row_kernels(std::make_integer_sequence<int, kPanelRows>{});
  const int64_t n = b.n, k = b.k, p1 = (j0 + cols + kPanel - 1) / kPanel;
  for (int64_t p = j0 / kPanel; p < p1; ++p) {
    const int64_t width = std::min(kPanel, n - p * kPanel);
    for (int64_t i = 0; i < m; i += kPanelRows) {
      const int64_t rows = std::min(kPanelRows, m - i);
      // The first pass over a panel reads it from afar and fetches the next; the others find it in L2.
      const float* next = i == 0 && p + 1 < p1 ? b.panel(p + 1) : nullptr;
      kernels[static_cast<size_t>(rows - 1)](k, a + i * k, k, b.panel(p), next, y + i * n + p * kPanel, n, width);
    }
  }
}

// The sessions of a process holding the same B share its panels.
KeptWhileUsed<PanelB>& packed_products() {
  static KeptWhileUsed<PanelB> kept;
  return kept;
}

void run_packed(const PanelB& b, int64_t m, const float* a, float* y, const Output& out, const Epilogue& after) {
  const int64_t n = b.n;
  const bool threads = out.parallel && *out.parallel;
  const int64_t width = threads ? (column_width(m, n, b.k) + kPanel - 1) / kPanel * kPanel : n;  // whole panels
  column_blocks(n, width, out.parallel, [&](int64_t j0, int64_t cols) {
    run_panels(b, m, a, y, j0, cols);
    if (after) after(j0, cols);
  });
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
  void take_constants(const std::vector<const void*>& data) override {
    const int64_t m = few_rows[0], n = few_rows[1], k = few_rows[2];  // clang 14 lambdas capture no bindings
    if (m < 2 || k <= 256 || k > 512 || !data[1] || n == 0 || !onednn::avx512()) return;
    // Keyed by where B lies and its dims (the panels do not depend on A's rows): while an entry
    // lives, the session holding it keeps B's bytes there, so no other B can be at that address
    // (hashing 32 MB of a transformer's weights cost 1.6 ms).
    std::string key;
    put(key, data[1]);
    put(key, n);
    put(key, k);
    packed = packed_products().find(key, [&] { return pack_panels(n, k, static_cast<const float*>(data[1])); });
  }
  bool trans_a, trans_b;
  std::array<int64_t, 3> few_rows{};             // m, n, k of a product of few rows by a B stored [N, K]
  std::shared_ptr<const PanelB> packed;          // when that B is constant (and the CPU has AVX-512)
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
    if (p.packed) return run_packed(*p.packed, m, in[0].f32(), y, out, epilogue);
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
  if (p.packed) return run_packed(*p.packed, m, in[0].f32(), y, out, epilogue);
  gemm_rowmajor(m, n, k, in[0].f32(), in[1].f32(), y, out.parallel, trans_a, trans_b, epilogue,
                p.scratch_bytes > 0 ? reinterpret_cast<float*>(out.scratch) : nullptr);
}

}  // namespace kernels
}  // namespace ctxgen::runtime

// MatMul and Gemm, reduced to one row-major GEMM (which Conv uses too).

#include <algorithm>
#include <array>
#include <cstring>
#include <exception>
#include <span>
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

namespace {

// Runs part(begin, end) over [0, count): on two threads of its own when there are `bytes` worth it
// (OpenMP's idle workers would spin between weights, taking the core the kernel's writeback of the
// output needs).
void in_halves(size_t bytes, int64_t count, FunctionRef<void(int64_t, int64_t)> part) {
  constexpr size_t kThreadedBytes = size_t{1} << 22;
  if (bytes < kThreadedBytes || count < 2) return part(0, count);
  std::exception_ptr failed;
  std::thread other([&] {
    try {
      part(count / 2, count);
    } catch (...) {
      failed = std::current_exception();
    }
  });
  try {
    part(0, count / 2);
  } catch (...) {
    other.join();
    throw;
  }
  other.join();
  if (failed) std::rethrow_exception(failed);
}

}  // namespace

// oneDNN's reorder transposes at about three times the speed of a tiled loop (16 MB on two
// threads: 5 vs 15 ms), and laying weights out is most of what compiling a large model costs.
MadeBytes transpose_matrix(const uint8_t* from, size_t rows, size_t cols) {
  MadeBytes to(rows * cols * sizeof(float));
  if (to.empty()) return to;
  const auto r = static_cast<int64_t>(rows);
  try {
    // Columns [c0, c1) of `from` into rows [c0, c1) of `to`.
    in_halves(to.size(), static_cast<int64_t>(cols), [&](int64_t c0, int64_t c1) {
      const dnnl::memory::dims dims{r, c1 - c0};
      const dnnl::memory::desc src_desc(dims, dnnl::memory::data_type::f32, dnnl::memory::dims{static_cast<int64_t>(cols), 1});
      const dnnl::memory::desc dst_desc(dims, dnnl::memory::data_type::f32, dnnl::memory::dims{1, r});
      onednn::OneThread one;
      dnnl::memory src(src_desc, onednn::engine(), const_cast<uint8_t*>(from) + c0 * sizeof(float));
      dnnl::memory dst(dst_desc, onednn::engine(), to.data() + c0 * r * sizeof(float));
      onednn::reorder(dnnl::reorder(src, dst), src, dst);
    });
  } catch (const dnnl::error& e) {
    throw Error(ErrorCode::kInternal, std::string("oneDNN cannot transpose a ") + std::to_string(rows) + " x " +
                                          std::to_string(cols) + " matrix: " + e.what());
  }
  return to;
}

// ---- B in panels ----------------------------------------------------------------------------
//
// A constant B of a product is laid out in panels of 32 columns: panel p holds B's columns
// [32p, 32p + w) (w = 32, or what is left for the last), K rows of w floats. A panel streams from
// memory in one pass while up to 12 rows of A, broadcast, accumulate into 24 registers, and the
// next panel is prefetched into L2 meanwhile (a transformer's weights come from L3 or memory, not
// L2). On the 512-wide transformer's 16-token step, its 16 x 512 x 2048 product took 286-305 µs
// so against 441-565 on oneDNN's matmul over its blocked B and 425-447 in ONNX Runtime, and whole
// transformers gained at every size, 1 to 128 rows, on AVX-512 (docs/benchmarks.md, "Weight
// layout"). The layout holds exactly B's bytes, in another order, on every CPU level.

namespace {

constexpr int64_t kPanel = 32;

int64_t panel_count(int64_t n) { return (n + kPanel - 1) / kPanel; }

// Panels [p0, p1) of B [K, N] (or [N, K] when `nk`) at `from` (any alignment) into `to`.
void lay_panels(const uint8_t* from, int64_t k, int64_t n, bool nk, float* to, int64_t p0, int64_t p1) {
  using Desc = dnnl::memory::desc;
  constexpr auto f32 = dnnl::memory::data_type::f32;
  // Panels [first, first + count) of `width` columns, as a [count, K, width] view of each side: B
  // stored [N, K] is transposed a panel at a time, B stored [K, N] copied in strips.
  const auto lay = [&](int64_t first, int64_t count, int64_t width) {
    const dnnl::memory::dims dims{count, k, width};
    const Desc from_desc = nk ? Desc(dims, f32, {kPanel * k, 1, k}) : Desc(dims, f32, {kPanel, n, 1});
    const uint8_t* at = from + (nk ? first * kPanel * k : first * kPanel) * static_cast<int64_t>(sizeof(float));
    dnnl::memory src(from_desc, onednn::engine(), const_cast<uint8_t*>(at));
    dnnl::memory dst(Desc(dims, f32, {width * k, width, 1}), onednn::engine(), to + first * kPanel * k);
    onednn::reorder(dnnl::reorder(src, dst), src, dst);
  };
  const int64_t full = n / kPanel, end = std::min(p1, full);
  onednn::OneThread one;
  try {
    if (end > p0) lay(p0, end - p0, kPanel);
    if (p1 > full && n % kPanel) lay(full, 1, n % kPanel);
  } catch (const dnnl::error& e) {
    throw Error(ErrorCode::kInternal, std::string("oneDNN cannot lay out a ") + std::to_string(k) + " x " +
                                          std::to_string(n) + " weight in panels: " + e.what());
  }
}

// Rows [0, R) of A times columns [0, cols) of a panel (rows `width` apart) into y's columns
// [0, cols): AVX-512, all 32 columns, 12 rows at most. Only the last panel of a B whose N 32 does
// not divide is Narrow: masked loads take a port the products need (a 16-row step ran 4-10%
// slower with them).
template <int R, bool Narrow>
__attribute__((target("avx512f"))) void panel_rows_avx512(int64_t k, const float* a, int64_t lda, const float* panel,
                                                          int64_t width, int64_t cols, const float* next, float* y,
                                                          int64_t ldy) {
  // Unrolled, so that the accumulators stay in registers (-O2 kept them on the stack).
  __m512 c0[R], c1[R];
#pragma GCC unroll 12
  for (int r = 0; r < R; ++r) c0[r] = c1[r] = _mm512_setzero_ps();
  const auto low = static_cast<__mmask16>(cols >= 16 ? 0xFFFF : (1u << cols) - 1);
  const auto high = static_cast<__mmask16>(cols >= 32 ? 0xFFFF : cols <= 16 ? 0 : (1u << (cols - 16)) - 1);
  constexpr int64_t kAhead = 32;  // steps of K ahead the L1 prefetch reads (4 KB)
  for (int64_t i = 0; i < k; ++i) {
    const float* q = panel + i * width;
    if (next) {
      _mm_prefetch(reinterpret_cast<const char*>(next + i * kPanel), _MM_HINT_T1);
      _mm_prefetch(reinterpret_cast<const char*>(next + i * kPanel + 16), _MM_HINT_T1);
    }
    _mm_prefetch(reinterpret_cast<const char*>(q + kAhead * width), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(q + kAhead * width + 16), _MM_HINT_T0);
    const __m512 b0 = Narrow ? _mm512_maskz_loadu_ps(low, q) : _mm512_loadu_ps(q);
    const __m512 b1 = Narrow ? _mm512_maskz_loadu_ps(high, q + 16) : _mm512_loadu_ps(q + 16);
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r) {
      const __m512 x = _mm512_set1_ps(a[r * lda + i]);
      c0[r] = _mm512_fmadd_ps(x, b0, c0[r]);
      c1[r] = _mm512_fmadd_ps(x, b1, c1[r]);
    }
  }
#pragma GCC unroll 12
  for (int r = 0; r < R; ++r) {
    _mm512_mask_storeu_ps(y + r * ldy, low, c0[r]);
    _mm512_mask_storeu_ps(y + r * ldy + 16, high, c1[r]);
  }
}

// The same with AVX2 and FMA over V registers of 8 columns a row (cols <= 8 V): 16 registers hold
// R x V accumulators, V of B and the broadcast. Over half a panel (V = 2) 6 rows fit, over all of
// it (V = 4) 3: a 16-row product took 1.2 times as long as oneDNN's sgemm in passes of 3 rows, a
// 1-row one 1.4 times as long over half panels (each pass a chain of dependent FMAs).
template <int R, int V, bool Narrow>
__attribute__((target("avx2,fma"))) void panel_rows_avx2(int64_t k, const float* a, int64_t lda, const float* panel,
                                                         int64_t width, int64_t cols, const float* next, float* y,
                                                         int64_t ldy) {
  __m256 c[R][V];
  __m256i mask[V];
#pragma GCC unroll 4
  for (int v = 0; v < V; ++v) {
    mask[v] = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(cols) - 8 * v), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) c[r][v] = _mm256_setzero_ps();
  }
  for (int64_t i = 0; i < k; ++i) {
    const float* q = panel + i * width;
    if (next) {
      _mm_prefetch(reinterpret_cast<const char*>(next + i * kPanel), _MM_HINT_T1);
      _mm_prefetch(reinterpret_cast<const char*>(next + i * kPanel + 16), _MM_HINT_T1);
    }
    __m256 b[V];
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) b[v] = Narrow ? _mm256_maskload_ps(q + 8 * v, mask[v]) : _mm256_loadu_ps(q + 8 * v);
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      const __m256 x = _mm256_broadcast_ss(a + r * lda + i);
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) c[r][v] = _mm256_fmadd_ps(x, b[v], c[r][v]);
    }
  }
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) _mm256_maskstore_ps(y + r * ldy + 8 * v, mask[v], c[r][v]);
}

using PanelKernel = void (*)(int64_t, const float*, int64_t, const float*, int64_t, int64_t, const float*, float*, int64_t);

// The kernels for 1 to R rows of A at a time over `columns` of a panel, for full and narrow panels.
struct PanelKernels {
  std::vector<PanelKernel> by_rows[2];  // [narrow][r - 1]
  int64_t columns = kPanel;
};
PanelKernels kernels_of(std::span<const PanelKernel> full, std::span<const PanelKernel> narrow, int64_t columns) {
  PanelKernels made;
  made.by_rows[0].assign(full.begin(), full.end());
  made.by_rows[1].assign(narrow.begin(), narrow.end());
  made.columns = columns;
  return made;
}
template <int... R>
PanelKernels avx512_kernels(std::integer_sequence<int, R...>) {
  const std::array<PanelKernel, sizeof...(R)> full = {&panel_rows_avx512<R + 1, false>...},
                                              narrow = {&panel_rows_avx512<R + 1, true>...};
  return kernels_of(full, narrow, kPanel);
}
template <int V, int... R>
PanelKernels avx2_kernels(std::integer_sequence<int, R...>) {
  const std::array<PanelKernel, sizeof...(R)> full = {&panel_rows_avx2<R + 1, V, false>...},
                                              narrow = {&panel_rows_avx2<R + 1, V, true>...};
  return kernels_of(full, narrow, 8 * V);
}

// The kernels of the CPU's level (oneDNN's effective one, which the tests lower to play older
// CPUs) for a product of m rows; none below AVX2, where oneDNN's sgemm reads the panels.
const PanelKernels& panel_kernels(int64_t m) {
  static const PanelKernels none, avx512 = avx512_kernels(std::make_integer_sequence<int, 12>{}),
                                  avx2_half = avx2_kernels<2>(std::make_integer_sequence<int, 6>{}),
                                  avx2_whole = avx2_kernels<4>(std::make_integer_sequence<int, 3>{});
  static const bool has_avx512 = onednn::avx512(), has_avx2 = onednn::avx2();
  if (has_avx512) return avx512;
  if (has_avx2) return m <= 3 ? avx2_whole : avx2_half;
  return none;
}

// y's columns [j0, j0 + cols) (j0 a multiple of 32) of A [m, k] times B [n, k] in panels.
void product_of_panels(const float* b, int64_t n, int64_t k, int64_t m, const float* a, float* y, int64_t j0, int64_t cols) {
  const PanelKernels& kernels = panel_kernels(m);
  const auto most = static_cast<int64_t>(kernels.by_rows[0].size());
  const int64_t p1 = (j0 + cols + kPanel - 1) / kPanel;
  for (int64_t p = j0 / kPanel; p < p1; ++p) {
    const int64_t width = std::min(kPanel, n - p * kPanel);
    const float* panel = b + p * kPanel * k;
    if (most == 0) {
      const dnnl_status_t status =
          dnnl_sgemm('N', 'N', m, width, k, 1.0f, a, k, panel, width, 0.0f, y + p * kPanel, n);
      if (status != dnnl_success)
        throw Error(ErrorCode::kRuntime, "oneDNN's sgemm failed (status " + std::to_string(static_cast<int>(status)) +
                                             ") on " + std::to_string(m) + " x " + std::to_string(k) + " x " +
                                             std::to_string(width));
      continue;
    }
    const std::vector<PanelKernel>& by_rows = kernels.by_rows[width < kPanel ? 1 : 0];
    for (int64_t c = 0; c < width; c += kernels.columns)
      for (int64_t i = 0; i < m; i += most) {
        const int64_t rows = std::min(most, m - i);
        // The first pass over a panel reads it from afar and fetches the next; the others find it in L2.
        const float* next = i == 0 && c == 0 && p + 1 < p1 ? panel + kPanel * k : nullptr;
        by_rows[static_cast<size_t>(rows - 1)](k, a + i * k, k, panel + c, width, std::min(kernels.columns, width - c), next,
                                               y + i * n + p * kPanel + c, n);
      }
  }
}

// y [m, n] = A [m, k] x B, B [n, k] in panels, the caller's threads sharing out whole panels.
void run_panels(const float* b, int64_t n, int64_t k, int64_t m, const float* a, float* y, const Output& out,
                const Epilogue& after) {
  if (k == 0) std::fill(y, y + m * n, 0.0f);  // an empty sum
  const bool threads = out.parallel && *out.parallel;
  const int64_t width = threads ? (column_width(m, n, k) + kPanel - 1) / kPanel * kPanel : n;
  column_blocks(n, width, out.parallel, [&](int64_t j0, int64_t cols) {
    if (k > 0) {
      onednn::OneThread one;
      product_of_panels(b, n, k, m, a, y, j0, cols);
    }
    if (after) after(j0, cols);
  });
}

}  // namespace

MadeBytes panels_of(const uint8_t* from, size_t k, size_t n, bool nk) {
  MadeBytes to(k * n * sizeof(float));
  const auto kk = static_cast<int64_t>(k), nn = static_cast<int64_t>(n);
  if (!to.empty())
    in_halves(to.size(), panel_count(nn), [&](int64_t p0, int64_t p1) {
      lay_panels(from, kk, nn, nk, reinterpret_cast<float*>(to.data()), p0, p1);
    });
  return to;
}

namespace kernels {

// MatMul's and Gemm's attributes, and how a batched MatMul steps through its operands.
struct Product final : OpPlan {
  Product(const ref::Op& op, const std::vector<const ref::Value*>& in, const ref::Value& out)
      : trans_a(op.get_int("transA", 0) != 0), trans_b(op.get_int("transB", 0) != 0),
        panels(op.get_int("panels", 0) != 0), alpha(op.get_float("alpha", 1.0f)), beta(op.get_float("beta", 1.0f)),
        act(fused_activation_of(op)) {
    // C keeps its own dims (scalar, [N], [1, N], [M, 1], [M, N] ...): broadcast to [M, N].
    if (op.type == "Gemm" && in.size() > 2 && in[2]) c_strides = broadcast_strides(in[2]->dims, out.dims);
    // A product of few rows by a B stored [N, K], not in panels, runs as B·Aᵀ in scratch (gemm_rowmajor).
    const bool whole = op.type == "Gemm" || in[1]->dims.size() == 2;
    const int64_t rows = out.dims.empty() ? 1 : product(out.dims, 0, out.dims.size() - 1);
    if (!panels && whole && trans_b && !trans_a && rows <= kFewRows)
      scratch_bytes = static_cast<uint64_t>(product(out.dims)) * sizeof(float);
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
  bool trans_a, trans_b;
  bool panels;        // B [N, K] laid out in panels of 32 columns
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
    if (p.panels) return run_panels(in[1].f32(), n, k, m, in[0].f32(), y, out, epilogue);
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
  const int64_t m = out.dims()[0], n = out.dims()[1], k = trans_a ? ad[0] : ad[1];
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
  if (p.panels) return run_panels(in[1].f32(), n, k, m, in[0].f32(), y, out, epilogue);
  gemm_rowmajor(m, n, k, in[0].f32(), in[1].f32(), y, out.parallel, trans_a, trans_b, epilogue,
                p.scratch_bytes > 0 ? reinterpret_cast<float*>(out.scratch) : nullptr);
}

// PanelWeight: a constant B computed at run time (widened, dequantized, or read where a weightless
// binary's model stores it) laid out in panels, once a session like any value made of weights.
struct PanelLayout final : OpPlan {
  PanelLayout(const ref::Op& op, const std::vector<const ref::Value*>& /*in*/, const ref::Value& /*out*/)
      : nk(op.get_int("transB", 0) != 0) {}
  bool nk;  // B stored [N, K]
};
const Planner plan_panel_weight = plan_as<PanelLayout>;

void panel_weight(Ins in, const Output& out) {
  const int64_t n = out.dims()[0], k = out.dims()[1];
  if (n == 0 || k == 0) return;
  const bool nk = plan_of<PanelLayout>(out).nk;
  parallel_ranges(out.parallel, panel_count(n), k * kPanel, [&](int64_t p0, int64_t p1) {
    lay_panels(in[0].bytes(), k, n, nk, out.f32(), p0, p1);
  });
}

}  // namespace kernels
}  // namespace ctxgen::runtime

// MatMul, Gemm and Conv, all reduced to one row-major GEMM.

#include <algorithm>
#include <cstring>
#include <vector>

#include <omp.h>
#include <oneapi/dnnl/dnnl.h>

#include "ctxgen/error.h"
#include "kernels.h"

namespace ctxgen::runtime {
namespace {

// y [m, n] = op(A) [m, k] x op(B) [k, n], all dense row-major (op: transposed when asked), through
// oneDNN's GEMM (docs/benchmarks.md, "Kernel library": the fastest Debian offers on every shape
// measured). A large product is cut into blocks of y's columns that the caller's threads share;
// each block runs on its thread alone, so the thread count is the caller's (ONNX Runtime's
// intra-op pool in the plugin EP), not OpenMP's.
void gemm_rowmajor(int64_t m, int64_t n, int64_t k, const float* a, const float* b, float* y, const ParallelFor* parallel,
                   bool trans_a = false, bool trans_b = false) {
  constexpr int64_t kMinParallelWork = int64_t{1} << 18;  // multiply-adds below which threads cost more than they give
  constexpr int64_t kMaxBlocks = 4;
  int64_t width = n;
  if (parallel && *parallel && m * n * k >= kMinParallelWork)
    width = std::max<int64_t>(32, ((n + kMaxBlocks - 1) / kMaxBlocks + 15) / 16 * 16);
  const int64_t blocks = (n + width - 1) / width;
  if (k == 0) {  // an empty sum, whatever a library makes of K = 0
    std::fill(y, y + m * n, 0.0f);
    return;
  }
  const auto block = [&](size_t index) {
    const int64_t j0 = static_cast<int64_t>(index) * width, cols = std::min(width, n - j0);
    // One thread inside a block; the caller's OpenMP setting comes back afterwards.
    struct OneOmpThread {
      int before = omp_get_max_threads();
      OneOmpThread() { omp_set_num_threads(1); }
      ~OneOmpThread() { omp_set_num_threads(before); }
    } one;
    const dnnl_status_t status = dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, cols, k, 1.0f, a, trans_a ? m : k,
                                            trans_b ? b + j0 * k : b + j0, trans_b ? k : n, 0.0f, y + j0, n);
    if (status != dnnl_success)
      throw Error(ErrorCode::kRuntime, "oneDNN's sgemm failed (status " + std::to_string(static_cast<int>(status)) +
                                           ") on " + std::to_string(m) + " x " + std::to_string(k) + " x " +
                                           std::to_string(cols));
  };
  if (blocks == 1)
    block(0);
  else
    (*parallel)(static_cast<size_t>(blocks), block);
}

// im2col for images, the common case: a row of the output at a time, its inside span in one loop
// without the per-element index arithmetic of any-rank windows.
void im2col_2d(const float* x, const Dims& in, int64_t channels, const Dims& kernel, const Dims& out, const Dims& strides,
               const Dims& pads, const Dims& dilations, float* col) {
  const int64_t ih = in[0], iw = in[1], oh = out[0], ow = out[1], sh = strides[0], sw = strides[1];
  for (int64_t c = 0; c < channels; ++c) {
    const float* plane = x + c * ih * iw;
    for (int64_t ky = 0; ky < kernel[0]; ++ky)
      for (int64_t kx = 0; kx < kernel[1]; ++kx) {
        const int64_t dy = ky * dilations[0] - pads[0], dx = kx * dilations[1] - pads[1];
        // Output columns whose input column lands inside: ox in [first, last).
        const int64_t first = std::clamp<int64_t>((-dx + sw - 1) / sw, 0, ow);
        const int64_t last = std::clamp<int64_t>((iw - dx + sw - 1) / sw, first, ow);
        for (int64_t oy = 0; oy < oh; ++oy, col += ow) {
          const int64_t y = oy * sh + dy;
          if (y < 0 || y >= ih) {
            std::fill(col, col + ow, 0.0f);
            continue;
          }
          const float* row = plane + y * iw;
          std::fill(col, col + first, 0.0f);
          for (int64_t ox = first; ox < last; ++ox) col[ox] = row[ox * sw + dx];
          std::fill(col + last, col + ow, 0.0f);
        }
      }
  }
}

// Writes the im2col matrix of one group of one image: row (c, kernel position), column (output
// position), zero where the window reads padding.
void im2col(const float* x, const Dims& in_spatial, int64_t channels, const Dims& kernel, const Dims& out_spatial,
            const Dims& strides, const Dims& pads, const Dims& dilations, float* col) {
  size_t n = in_spatial.size();
  if (n == 2) return im2col_2d(x, in_spatial, channels, kernel, out_spatial, strides, pads, dilations, col);
  int64_t kernel_size = product(kernel), out_size = product(out_spatial), in_size = product(in_spatial);
  Dims in_strides = strides_of(in_spatial);
  std::vector<int64_t> kpos(n), opos(n);
  for (int64_t c = 0; c < channels; ++c) {
    const float* plane = x + c * in_size;
    for (int64_t kk = 0; kk < kernel_size; ++kk, col += out_size) {
      for (int64_t rem = kk, a = static_cast<int64_t>(n); a-- > 0;) {
        kpos[static_cast<size_t>(a)] = rem % kernel[static_cast<size_t>(a)];
        rem /= kernel[static_cast<size_t>(a)];
      }
      std::fill(opos.begin(), opos.end(), 0);
      for (int64_t o = 0; o < out_size; ++o) {
        int64_t offset = 0;
        bool inside = true;
        for (size_t a = 0; a < n && inside; ++a) {
          int64_t at = opos[a] * strides[a] - pads[a] + kpos[a] * dilations[a];
          inside = at >= 0 && at < in_spatial[a];
          offset += at * in_strides[a];
        }
        col[o] = inside ? plane[offset] : 0.0f;
        for (size_t a = n; a-- > 0;) {
          if (++opos[a] < out_spatial[a]) break;
          opos[a] = 0;
        }
      }
    }
  }
}

bool is_pointwise(const ref::Op& op) {
  for (const char* name : {"kernel_shape", "strides", "dilations"})
    for (int64_t v : op.get_ints(name))
      if (v != 1) return false;
  for (int64_t v : op.get_ints("pads"))
    if (v != 0) return false;
  return true;
}

}  // namespace

namespace kernels {

void matmul(const ref::Op& op, const std::vector<Tensor>& in, const Output& out) {
  // Vectors seen as [1, K] (A) and [K, 1] (B), as the rule defines.
  const Dims ad = in[0].dims().size() == 1 ? Dims{1, in[0].dims()[0]} : in[0].dims();
  const Dims bd = in[1].dims().size() == 1 ? Dims{in[1].dims()[0], 1} : in[1].dims();
  int64_t m = ad[ad.size() - 2], n = bd.back(), k = ad.back();
  // Batch offsets through broadcast strides over the batch dims, in units of whole matrices.
  Dims batch = *broadcast({ad.begin(), ad.end() - 2}, {bd.begin(), bd.end() - 2});
  Dims a_batch(ad.begin(), ad.end() - 2), b_batch(bd.begin(), bd.end() - 2);
  Dims sa = broadcast_strides(a_batch, batch), sb = broadcast_strides(b_batch, batch);
  int64_t batches = product(batch);
  std::vector<int64_t> idx(batch.size(), 0);
  for (int64_t t = 0; t < batches; ++t) {
    int64_t oa = 0, ob = 0;
    for (size_t d = 0; d < batch.size(); ++d) {
      oa += idx[d] * sa[d];
      ob += idx[d] * sb[d];
    }
    gemm_rowmajor(m, n, k, in[0].f32() + oa * m * k, in[1].f32() + ob * k * n, out.f32() + t * m * n, out.parallel);
    for (size_t d = batch.size(); d-- > 0;) {
      if (++idx[d] < batch[d]) break;
      idx[d] = 0;
    }
  }
  apply_activation(op, out.f32(), out.size());
}

void gemm(const ref::Op& op, const std::vector<Tensor>& in, const Output& out) {
  const Dims& ad = in[0].dims();
  bool trans_a = op.get_int("transA", 0) != 0, trans_b = op.get_int("transB", 0) != 0;
  int64_t m = out.dims()[0], n = out.dims()[1], k = trans_a ? ad[0] : ad[1];
  float* y = out.f32();
  gemm_rowmajor(m, n, k, in[0].f32(), in[1].f32(), y, out.parallel, trans_a, trans_b);
  float alpha = op.get_float("alpha", 1.0f), beta = op.get_float("beta", 1.0f);
  if (in.size() > 2 && in[2].present()) {
    // C keeps its own dims (scalar, [N], [1, N], [M, 1], [M, N] ...); broadcast it to [M, N].
    const Dims mn = {m, n};
    Dims sc = broadcast_strides(in[2].dims(), mn);
    const float* c = in[2].f32();
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) y[i * n + j] = alpha * y[i * n + j] + beta * c[i * sc[0] + j * sc[1]];
  } else if (alpha != 1.0f) {
    for (int64_t i = 0; i < m * n; ++i) y[i] *= alpha;
  }
  apply_activation(op, y, m * n);
}

void conv(const ref::Op& op, const std::vector<Tensor>& in, const Output& out) {
  const Dims& xd = in[0].dims();
  const Dims& wd = in[1].dims();
  const Dims& yd = out.dims();
  int64_t group = op.get_int("group", 1);
  int64_t batch = xd[0], c_per_group = wd[1], m_per_group = wd[0] / group;
  Dims in_spatial(xd.begin() + 2, xd.end()), out_spatial(yd.begin() + 2, yd.end());
  Dims kernel(wd.begin() + 2, wd.end());
  int64_t in_size = product(in_spatial), out_size = product(out_spatial);
  int64_t rows = c_per_group * product(kernel);  // K of the GEMM
  bool pointwise = is_pointwise(op);
  std::vector<float> col(pointwise ? 0 : static_cast<size_t>(rows * out_size));
  Dims strides = op.get_ints("strides"), pads = op.get_ints("pads"), dilations = op.get_ints("dilations");
  const float* w = in[1].f32();
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t g = 0; g < group; ++g) {
      const float* x = in[0].f32() + (b * xd[1] + g * c_per_group) * in_size;
      if (!pointwise) im2col(x, in_spatial, c_per_group, kernel, out_spatial, strides, pads, dilations, col.data());
      float* y = out.f32() + (b * wd[0] + g * m_per_group) * out_size;
      gemm_rowmajor(m_per_group, out_size, rows, w + g * m_per_group * rows, pointwise ? x : col.data(), y, out.parallel);
    }
  }
  if (in.size() > 2 && in[2].present()) {
    const float* bias = in[2].f32();
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t m = 0; m < wd[0]; ++m) {
        float* plane = out.f32() + (b * wd[0] + m) * out_size;
        for (int64_t i = 0; i < out_size; ++i) plane[i] += bias[m];
      }
  }
  apply_activation(op, out.f32(), out.size());
}

}  // namespace kernels
}  // namespace ctxgen::runtime

// MatMul, Gemm and Conv, all reduced to one row-major GEMM loop (i-k-j: the innermost loop walks
// a row of B and a row of Y contiguously).

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels.h"

namespace ctxgen::runtime {
namespace {

// y [m, n] = A [m, k] x B [k, n], all dense row-major.
void gemm_rowmajor(int64_t m, int64_t n, int64_t k, const float* a, const float* b, float* y) {
  std::memset(y, 0, static_cast<size_t>(m * n) * sizeof(float));
  for (int64_t i = 0; i < m; ++i) {
    float* row = y + i * n;
    for (int64_t p = 0; p < k; ++p) {
      const float av = a[i * k + p];
      const float* brow = b + p * n;
      for (int64_t j = 0; j < n; ++j) row[j] += av * brow[j];
    }
  }
}

// A transposed copy of the row-major [rows, cols] matrix `src`.
std::vector<float> transposed(const float* src, int64_t rows, int64_t cols) {
  std::vector<float> t(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) t[static_cast<size_t>(c * rows + r)] = src[r * cols + c];
  return t;
}

// Writes the im2col matrix of one group of one image: row (c, kernel position), column (output
// position), zero where the window reads padding.
void im2col(const float* x, const Dims& in_spatial, int64_t channels, const Dims& kernel, const Dims& out_spatial,
            const Dims& strides, const Dims& pads, const Dims& dilations, float* col) {
  size_t n = in_spatial.size();
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
    gemm_rowmajor(m, n, k, in[0].f32() + oa * m * k, in[1].f32() + ob * k * n, out.f32() + t * m * n);
    for (size_t d = batch.size(); d-- > 0;) {
      if (++idx[d] < batch[d]) break;
      idx[d] = 0;
    }
  }
  apply_activation(op, out.f32(), out.size());
}

void gemm(const ref::Op& op, const std::vector<Tensor>& in, const Output& out) {
  const Dims& ad = in[0].dims();
  const Dims& bd = in[1].dims();
  bool trans_a = op.get_int("transA", 0) != 0, trans_b = op.get_int("transB", 0) != 0;
  int64_t m = out.dims()[0], n = out.dims()[1], k = trans_a ? ad[0] : ad[1];
  std::vector<float> a_t, b_t;
  const float* a = in[0].f32();
  const float* b = in[1].f32();
  if (trans_a) a = (a_t = transposed(a, ad[0], ad[1])).data();
  if (trans_b) b = (b_t = transposed(b, bd[0], bd[1])).data();
  float* y = out.f32();
  gemm_rowmajor(m, n, k, a, b, y);
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
      gemm_rowmajor(m_per_group, out_size, rows, w + g * m_per_group * rows, pointwise ? x : col.data(), y);
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

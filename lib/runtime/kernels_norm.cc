// Softmax, the normalisations and the reductions. Sums are accumulated in double so long rows
// do not lose precision.

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels.h"

namespace ctxgen::runtime {
namespace {

// Sums every input element into its output slot (reduced axes map to stride 0), walking the input
// in memory order so reads are contiguous whichever axes are reduced.
std::vector<double> reduce_sums(const ref::Op& op, const Tensor& x, const Output& y, int64_t* reduced_count) {
  const Dims& xd = x.dims();
  Dims axes = op.get_ints("axes");
  if (axes.empty())
    for (size_t a = 0; a < xd.size(); ++a) axes.push_back(static_cast<int64_t>(a));
  // Output strides in the input's rank (keepdims or not, the kept axes are in the same order).
  Dims kept;
  for (size_t a = 0; a < xd.size(); ++a)
    kept.push_back(std::binary_search(axes.begin(), axes.end(), static_cast<int64_t>(a)) ? 1 : xd[a]);
  Dims out_strides = strides_of(kept);
  *reduced_count = 1;
  for (int64_t a : axes) {
    out_strides[static_cast<size_t>(a)] = 0;
    *reduced_count *= xd[static_cast<size_t>(a)];
  }
  std::vector<double> sums(static_cast<size_t>(y.size()), 0.0);
  const Dims strides[2] = {strides_of(xd), out_strides};
  int64_t inner = xd.empty() ? 1 : xd.back(), so = xd.empty() ? 0 : out_strides.back();
  const float* data = x.f32();
  for_each_row(xd, strides, [&](const int64_t* at) {
    const float* row = data + at[0];
    double* dst = sums.data() + at[1];
    for (int64_t i = 0; i < inner; ++i) dst[i * so] += row[i];
  });
  return sums;
}

void store(const std::vector<double>& values, double scale, const Output& y) {
  for (size_t i = 0; i < values.size(); ++i) y.f32()[i] = static_cast<float>(values[i] * scale);
}

// Softmax of `n` values spaced `stride` apart, for `inner` adjacent such columns at once so the
// loops walk memory contiguously.
void softmax_columns(const float* x, float* y, int64_t n, int64_t inner, std::vector<float>& peak,
                     std::vector<double>& sum) {
  peak.assign(static_cast<size_t>(inner), -std::numeric_limits<float>::infinity());
  sum.assign(static_cast<size_t>(inner), 0.0);
  for (int64_t k = 0; k < n; ++k)
    for (int64_t j = 0; j < inner; ++j) peak[j] = std::max(peak[j], x[k * inner + j]);
  for (int64_t k = 0; k < n; ++k)
    for (int64_t j = 0; j < inner; ++j) {
      float e = std::exp(x[k * inner + j] - peak[j]);
      y[k * inner + j] = e;
      sum[j] += e;
    }
  for (int64_t k = 0; k < n; ++k)
    for (int64_t j = 0; j < inner; ++j) y[k * inner + j] = static_cast<float>(y[k * inner + j] / sum[j]);
}

}  // namespace

namespace kernels {

void softmax(const ref::Op& op, const std::vector<Tensor>& in, const Output& out) {
  const Dims& d = in[0].dims();
  auto axis = static_cast<size_t>(op.get_int("axis", 0));
  // coerce_2d (opset < 13): one softmax over all of dims[axis:]; otherwise along `axis` alone.
  bool flat = op.get_int("coerce_2d", 0) != 0;
  int64_t outer = product(d, 0, axis);
  int64_t n = flat ? product(d, axis, d.size()) : d[axis];
  int64_t inner = flat ? 1 : product(d, axis + 1, d.size());
  std::vector<float> peak;
  std::vector<double> sum;
  for (int64_t o = 0; o < outer; ++o)
    softmax_columns(in[0].f32() + o * n * inner, out.f32() + o * n * inner, n, inner, peak, sum);
}

void batch_normalization(const ref::Op& op, const std::vector<Tensor>& in, const Output& out) {
  const Dims& d = in[0].dims();
  int64_t channels = d[1], inner = product(d, 2, d.size());
  double eps = op.get_float("epsilon", 1e-5f);
  const float *scale = in[1].f32(), *bias = in[2].f32(), *mean = in[3].f32(), *var = in[4].f32();
  for (int64_t b = 0; b < d[0]; ++b)
    for (int64_t c = 0; c < channels; ++c) {
      auto s = static_cast<float>(scale[c] / std::sqrt(static_cast<double>(var[c]) + eps));
      float shift = bias[c] - mean[c] * s;
      const float* x = in[0].f32() + (b * channels + c) * inner;
      float* y = out.f32() + (b * channels + c) * inner;
      for (int64_t i = 0; i < inner; ++i) y[i] = x[i] * s + shift;
    }
}

void layer_normalization(const ref::Op& op, const std::vector<Tensor>& in, const Output& out) {
  const Dims& d = in[0].dims();
  auto axis = static_cast<size_t>(op.get_int("axis", 0));
  int64_t outer = product(d, 0, axis), inner = product(d, axis, d.size());
  double eps = op.get_float("epsilon", 1e-5f);
  const float* scale = in[1].f32();
  const float* bias = in.size() > 2 && in[2].present() ? in[2].f32() : nullptr;
  for (int64_t o = 0; o < outer; ++o) {
    const float* x = in[0].f32() + o * inner;
    float* y = out.f32() + o * inner;
    double sum = 0, sq = 0;
    for (int64_t i = 0; i < inner; ++i) sum += x[i];
    double mean = sum / static_cast<double>(inner);
    for (int64_t i = 0; i < inner; ++i) sq += (x[i] - mean) * (x[i] - mean);
    double inv = 1.0 / std::sqrt(sq / static_cast<double>(inner) + eps);
    for (int64_t i = 0; i < inner; ++i)
      y[i] = static_cast<float>((x[i] - mean) * inv) * scale[i] + (bias ? bias[i] : 0.0f);
  }
}

void reduce_mean(const ref::Op& op, const std::vector<Tensor>& in, const Output& out) {
  int64_t count = 1;
  auto sums = reduce_sums(op, in[0], out, &count);
  store(sums, count > 0 ? 1.0 / static_cast<double>(count) : std::numeric_limits<double>::quiet_NaN(), out);
}

void reduce_sum(const ref::Op& op, const std::vector<Tensor>& in, const Output& out) {
  int64_t count = 1;
  store(reduce_sums(op, in[0], out, &count), 1.0, out);
}

}  // namespace kernels
}  // namespace ctxgen::runtime

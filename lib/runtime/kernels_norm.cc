// Softmax, the normalisations and the reductions. Sums are accumulated in double so long rows
// do not lose precision.

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>

#include "ctxgen/error.h"
#include "kernels.h"

namespace ctxgen::runtime {
namespace {

// Folds every input element into its output slot with `combine` (reduced axes map to stride 0),
// walking the input in memory order so reads are contiguous whichever axes are reduced.
template <typename Acc, typename Combine>
std::vector<Acc> reduce_into(const ref::Op& op, const Tensor& x, const Output& y, Acc initial, int64_t* reduced_count,
                             Combine combine) {
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
  std::vector<Acc> acc(static_cast<size_t>(y.size()), initial);
  const Dims strides[2] = {strides_of(xd), out_strides};
  int64_t inner = xd.empty() ? 1 : xd.back(), so = xd.empty() ? 0 : out_strides.back();
  const float* data = x.f32();
  for_each_row(xd, strides, [&](const int64_t* at) {
    const float* row = data + at[0];
    Acc* dst = acc.data() + at[1];
    for (int64_t i = 0; i < inner; ++i) dst[i * so] = combine(dst[i * so], row[i]);
  });
  return acc;
}

std::vector<double> reduce_sums(const ref::Op& op, const Tensor& x, const Output& y, int64_t* reduced_count) {
  return reduce_into<double>(op, x, y, 0.0, reduced_count, [](double a, float b) { return a + b; });
}

// Max or min of the reduced elements; a NaN among them wins, as in ONNX Runtime.
template <typename Better>
void reduce_extreme(const ref::Op& op, const Tensor& x, const Output& y, float initial, Better better) {
  int64_t count = 0;
  auto values = reduce_into<float>(op, x, y, initial, &count, [&](float a, float b) {
    return std::isnan(a) || (!std::isnan(b) && !better(b, a)) ? a : b;
  });
  std::copy(values.begin(), values.end(), y.f32());
}

void store(const std::vector<double>& values, double scale, const Output& y) {
  for (size_t i = 0; i < values.size(); ++i) y.f32()[i] = static_cast<float>(values[i] * scale);
}

// Softmax of `n` values spaced `stride` apart, for `inner` adjacent such columns at once so the
// loops walk memory contiguously.
void softmax_columns(const float* x, float* y, int64_t n, int64_t inner, bool log, std::vector<float>& peak,
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
  if (log) {
    // x - max - log(sum): exact for the largest element, no exp/log round trip.
    for (int64_t k = 0; k < n; ++k)
      for (int64_t j = 0; j < inner; ++j)
        y[k * inner + j] = x[k * inner + j] - peak[j] - static_cast<float>(std::log(sum[j]));
    return;
  }
  for (int64_t k = 0; k < n; ++k)
    for (int64_t j = 0; j < inner; ++j) y[k * inner + j] = static_cast<float>(y[k * inner + j] / sum[j]);
}

// How Softmax, LogSoftmax and Hardmax see their input: `outer` blocks of `n` x `inner`, each of
// the `inner` columns normalised over its `n` values.
struct Columns {
  int64_t outer, n, inner;
};

Columns columns_of(const ref::Op& op, const Dims& d) {
  auto axis = static_cast<size_t>(op.get_int("axis", 0));
  // coerce_2d (opset < 13): one softmax over all of dims[axis:]; otherwise along `axis` alone.
  bool flat = op.get_int("coerce_2d", 0) != 0;
  return {product(d, 0, axis), flat ? product(d, axis, d.size()) : d[axis], flat ? 1 : product(d, axis + 1, d.size())};
}

void softmax_of(const ref::Op& op, const std::vector<Tensor>& in, const Output& out, bool log) {
  const Columns c = columns_of(op, in[0].dims());
  parallel_ranges(out.parallel, c.outer, 8 * c.n * c.inner, [&](int64_t begin, int64_t end) {
    std::vector<float> peak;
    std::vector<double> sum;
    for (int64_t o = begin; o < end; ++o)
      softmax_columns(in[0].f32() + o * c.n * c.inner, out.f32() + o * c.n * c.inner, c.n, c.inner, log, peak, sum);
  });
}

}  // namespace

namespace kernels {

void softmax(const ref::Op& op, const std::vector<Tensor>& in, const Output& out) { softmax_of(op, in, out, false); }
void log_softmax(const ref::Op& op, const std::vector<Tensor>& in, const Output& out) { softmax_of(op, in, out, true); }

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
  int64_t which = op.get_int("output", 0);
  const float* scale = in[1].f32();
  const float* bias = in.size() > 2 && in[2].present() ? in[2].f32() : nullptr;
  parallel_ranges(out.parallel, outer, 4 * inner, [&](int64_t begin, int64_t end) {
    for (int64_t o = begin; o < end; ++o) {
      const float* x = in[0].f32() + o * inner;
      double sum = 0, sq = 0;
      for (int64_t i = 0; i < inner; ++i) sum += x[i];
      double mean = sum / static_cast<double>(inner);
      for (int64_t i = 0; i < inner; ++i) sq += (x[i] - mean) * (x[i] - mean);
      double inv = 1.0 / std::sqrt(sq / static_cast<double>(inner) + eps);
      if (which != 0) {
        out.f32()[o] = static_cast<float>(which == 1 ? mean : inv);
        continue;
      }
      float* y = out.f32() + o * inner;
      for (int64_t i = 0; i < inner; ++i)
        y[i] = static_cast<float>((x[i] - mean) * inv) * scale[i] + (bias ? bias[i] : 0.0f);
    }
  });
}

// One 1 per softmax column, at its first largest element (flattened at axis before opset 13).
void hardmax(const ref::Op& op, const std::vector<Tensor>& in, const Output& out) {
  auto [outer, n, inner] = columns_of(op, in[0].dims());
  std::fill(out.f32(), out.f32() + out.size(), 0.0f);
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t j = 0; j < inner; ++j) {
      const float* x = in[0].f32() + o * n * inner + j;
      int64_t best = 0;
      for (int64_t k = 1; k < n; ++k)
        if (x[k * inner] > x[best * inner]) best = k;
      out.f32()[o * n * inner + best * inner + j] = 1.0f;
    }
}

// loss = -input[n, target, d...] * weight[target]; a target equal to ignore_index adds nothing.
// Mean divides by the sum of the weights used.
void nll_loss(const ref::Op& op, const std::vector<Tensor>& in, const Output& out) {
  const Dims& x = in[0].dims();
  int64_t n = x[0], classes = x[1], inner = product(x, 2, x.size());
  bool has_ignore = op.get_int("has_ignore_index", 0) != 0;
  int64_t ignore = op.get_int("ignore_index", 0), reduction = op.get_int("reduction", 0);
  const float* weight = in.size() > 2 && in[2].present() ? in[2].f32() : nullptr;
  std::vector<int64_t> target(static_cast<size_t>(in[1].size()));
  visit_dtype(in[1].dtype(), [&](auto tag) {
    using T = decltype(tag);
    std::copy(in[1].as<T>(), in[1].as<T>() + in[1].size(), target.begin());
  });
  double total = 0, weights = 0;
  for (int64_t b = 0; b < n; ++b)
    for (int64_t i = 0; i < inner; ++i) {
      int64_t t = target[static_cast<size_t>(b * inner + i)];
      float loss = 0.0f;
      if (!(has_ignore && t == ignore)) {
        if (t < 0 || t >= classes)
          throw Error(ErrorCode::kRuntime, "NegativeLogLikelihoodLoss target " + std::to_string(t) + " is outside [0, " +
                                               std::to_string(classes) + ")");
        float w = weight ? weight[t] : 1.0f;
        loss = -in[0].f32()[(b * classes + t) * inner + i] * w;
        weights += w;
      }
      if (reduction == 0) out.f32()[b * inner + i] = loss;
      total += loss;
    }
  if (reduction == 1) out.f32()[0] = static_cast<float>(total);
  if (reduction == 2) out.f32()[0] = static_cast<float>(total / weights);
}

void cum_sum(const ref::Op& op, const std::vector<Tensor>& in, const Output& out) {
  const Dims& d = in[0].dims();
  auto axis = static_cast<size_t>(op.get_int("axis", 0));
  bool exclusive = op.get_int("exclusive", 0) != 0, reverse = op.get_int("reverse", 0) != 0;
  int64_t outer = product(d, 0, axis), n = d[axis], inner = product(d, axis + 1, d.size());
  visit_dtype(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* x = in[0].as<T>();
    T* y = out.as<T>();
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t j = 0; j < inner; ++j) {
        T acc = 0;
        for (int64_t s = 0; s < n; ++s) {
          int64_t k = reverse ? n - 1 - s : s;
          int64_t at = (o * n + k) * inner + j;
          if (exclusive) y[at] = acc;
          acc = wrapping_add(acc, x[at]);
          if (!exclusive) y[at] = acc;
        }
      }
  });
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

void reduce_prod(const ref::Op& op, const std::vector<Tensor>& in, const Output& out) {
  int64_t count = 0;
  store(reduce_into<double>(op, in[0], out, 1.0, &count, [](double a, float b) { return a * b; }), 1.0, out);
}

void reduce_l1(const ref::Op& op, const std::vector<Tensor>& in, const Output& out) {
  int64_t count = 0;
  store(reduce_into<double>(op, in[0], out, 0.0, &count, [](double a, float b) { return a + std::fabs(b); }), 1.0, out);
}

void reduce_sum_square(const ref::Op& op, const std::vector<Tensor>& in, const Output& out) {
  int64_t count = 0;
  store(reduce_into<double>(op, in[0], out, 0.0, &count, [](double a, float b) { return a + double{b} * b; }), 1.0, out);
}

void reduce_l2(const ref::Op& op, const std::vector<Tensor>& in, const Output& out) {
  int64_t count = 0;
  auto sums = reduce_into<double>(op, in[0], out, 0.0, &count, [](double a, float b) { return a + double{b} * b; });
  for (auto& v : sums) v = std::sqrt(v);
  store(sums, 1.0, out);
}

void reduce_log_sum(const ref::Op& op, const std::vector<Tensor>& in, const Output& out) {
  int64_t count = 0;
  auto sums = reduce_sums(op, in[0], out, &count);
  for (auto& v : sums) v = std::log(v);
  store(sums, 1.0, out);
}

// Accumulated in double, which holds e^x for every float x below 709.
void reduce_log_sum_exp(const ref::Op& op, const std::vector<Tensor>& in, const Output& out) {
  int64_t count = 0;
  auto sums = reduce_into<double>(op, in[0], out, 0.0, &count, [](double a, float b) { return a + std::exp(double{b}); });
  for (auto& v : sums) v = std::log(v);
  store(sums, 1.0, out);
}

// Per (image, group of channels): normalised together, then scaled and shifted per channel.
void group_normalization(const ref::Op& op, const std::vector<Tensor>& in, const Output& out) {
  const Dims& d = in[0].dims();
  int64_t channels = d[1], groups = op.get_int("groups", 1), per_channel = product(d, 2, d.size());
  int64_t per_group = channels / groups * per_channel;
  double eps = op.get_float("epsilon", 1e-5f);
  for (int64_t b = 0; b < d[0]; ++b)
    for (int64_t g = 0; g < groups; ++g) {
      int64_t at = (b * groups + g) * per_group;
      const float* x = in[0].f32() + at;
      float* y = out.f32() + at;
      double sum = 0, sq = 0;
      for (int64_t i = 0; i < per_group; ++i) sum += x[i];
      double mean = per_group > 0 ? sum / static_cast<double>(per_group) : 0.0;
      for (int64_t i = 0; i < per_group; ++i) sq += (x[i] - mean) * (x[i] - mean);
      double inv = 1.0 / std::sqrt((per_group > 0 ? sq / static_cast<double>(per_group) : 0.0) + eps);
      for (int64_t i = 0; i < per_group; ++i) {
        int64_t c = g * (channels / groups) + i / per_channel;
        y[i] = static_cast<float>((x[i] - mean) * inv) * in[1].f32()[c] + in[2].f32()[c];
      }
    }
}

// Index of the largest (ArgMax) or smallest (ArgMin) element along the axis; the first of equal
// ones, or the last with select_last_index.
template <typename Better>
void arg_extreme(const ref::Op& op, const std::vector<Tensor>& in, const Output& out, Better better) {
  const Dims& d = in[0].dims();
  auto axis = static_cast<size_t>(op.get_int("axis", 0));
  bool last = op.get_int("select_last_index", 0) != 0;
  int64_t outer = product(d, 0, axis), n = d[axis], inner = product(d, axis + 1, d.size());
  auto* y = out.as<int64_t>();
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t j = 0; j < inner; ++j) {
      const float* x = in[0].f32() + o * n * inner + j;
      int64_t best = 0;
      for (int64_t k = 1; k < n; ++k)
        if (better(x[k * inner], x[best * inner]) || (last && x[k * inner] == x[best * inner])) best = k;
      y[o * inner + j] = best;
    }
}

void arg_max(const ref::Op& op, const std::vector<Tensor>& in, const Output& out) {
  arg_extreme(op, in, out, std::greater<float>());
}

void arg_min(const ref::Op& op, const std::vector<Tensor>& in, const Output& out) {
  arg_extreme(op, in, out, std::less<float>());
}

void reduce_max(const ref::Op& op, const std::vector<Tensor>& in, const Output& out) {
  reduce_extreme(op, in[0], out, -std::numeric_limits<float>::infinity(), std::greater<float>());
}

void reduce_min(const ref::Op& op, const std::vector<Tensor>& in, const Output& out) {
  reduce_extreme(op, in[0], out, std::numeric_limits<float>::infinity(), std::less<float>());
}

}  // namespace kernels
}  // namespace ctxgen::runtime

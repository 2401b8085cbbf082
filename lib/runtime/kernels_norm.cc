// Softmax, the normalisations and the reductions. Sums are accumulated in double so long rows
// do not lose precision.

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <type_traits>

#include "ctxgen/error.h"
#include "kernels.h"

namespace ctxgen::runtime {

namespace kernels {

// How a reduction walks its input: the input's strides, the output's in the input's rank (0 along
// reduced axes), and how many elements each output element folds.
struct Reduction final : OpPlan {
  Reduction(const ref::Op& op, const std::vector<const ref::Value*>& in, const ref::Value& out) {
    const Dims& xd = in[0]->dims;
    Dims axes = op.get_ints("axes");
    if (axes.empty())
      for (size_t a = 0; a < xd.size(); ++a) axes.push_back(static_cast<int64_t>(a));
    // Output strides in the input's rank (keepdims or not, the kept axes are in the same order).
    Dims kept;
    for (size_t a = 0; a < xd.size(); ++a)
      kept.push_back(std::binary_search(axes.begin(), axes.end(), static_cast<int64_t>(a)) ? 1 : xd[a]);
    strides[0] = strides_of(xd);
    strides[1] = strides_of(kept);
    for (int64_t a : axes) {
      strides[1][static_cast<size_t>(a)] = 0;
      reduced_count *= xd[static_cast<size_t>(a)];
    }
    scratch_bytes = static_cast<uint64_t>(product(out.dims)) * sizeof(double);  // the sums' accumulators
  }
  Dims strides[2];  // the input's, the output's
  int64_t reduced_count = 1;
};
const Planner plan_reduction = plan_as<Reduction>;

}  // namespace kernels

namespace {

using kernels::Reduction;

// A row folded into `Lanes` partial results (lane k takes elements k, k + Lanes, ... and lane 0
// the tail), which `merge` then joins pairwise: one running result would wait on each step
// before the next. `initial` is the identity of `merge`.
template <int64_t Lanes, typename Acc, typename Combine, typename Merge>
CTXGEN_INLINE Acc fold_row(const float* row, int64_t n, Acc initial, Combine combine, Merge merge) {
  Acc lanes[Lanes];
  std::fill(lanes, lanes + Lanes, initial);
  int64_t i = 0;
  for (; i + Lanes <= n; i += Lanes)
    for (int64_t k = 0; k < Lanes; ++k) lanes[k] = combine(lanes[k], row[i + k]);
  for (; i < n; ++i) lanes[0] = combine(lanes[0], row[i]);
  for (int64_t width = Lanes / 2; width > 0; width /= 2)
    for (int64_t k = 0; k < width; ++k) lanes[k] = merge(lanes[k], lanes[k + width]);
  return lanes[0];
}

// Lambdas, not functions: a function passed as a term is called through its pointer for every
// element, which no loop can vectorise (a classifier's global pools spent 0.7 ns an element so).
constexpr auto plain = [](double sum, int64_t) { return sum; };
constexpr auto summed = [](double a, float b) { return a + b; };

}  // namespace

// A row's plain sum, built for AVX2 and AVX-512 too (the same bits: each lane adds in the same
// order in every build): global average pools, ReduceMean and ReduceSum over rows. 32 lanes,
// eight chains of four doubles on AVX2 (an addition's latency is four of its issue slots).
// Outside the anonymous namespace: GCC takes a cloned internal function for unused.
CTXGEN_VECTOR_CLONES double row_sum(const float* row, int64_t n) {
  return fold_row<32>(row, n, 0.0, summed, std::plus<double>());
}

namespace {

// Folds every input element into its slot of `acc` (y's size, set to `initial` first) with
// `combine`, walking the input in memory order so reads are contiguous whichever axes are reduced.
// A row reduced whole (the innermost axis reduced, as a global pool's) is folded first (`fold`,
// fold_row's way) and joined to its slot with `merge`.
template <typename Acc, typename Combine, typename Merge, typename Fold>
void reduce_into(const Tensor& x, const Output& y, Acc* acc, Acc initial, Combine combine, Merge merge, Fold fold) {
  const auto& plan = plan_of<Reduction>(y);
  const Dims& xd = x.dims();
  std::fill(acc, acc + y.size(), initial);
  int64_t inner = xd.empty() ? 1 : xd.back(), so = xd.empty() ? 0 : plan.strides[1].back();
  const float* data = x.f32();
  if (so == 0 && inner >= 16)
    return for_each_row(xd, plan.strides, [&](const int64_t* at) { acc[at[1]] = merge(acc[at[1]], fold(data + at[0], inner)); });
  for_each_row(xd, plan.strides, [&](const int64_t* at) {
    const float* row = data + at[0];
    Acc* dst = acc + at[1];
    for (int64_t i = 0; i < inner; ++i) dst[i * so] = combine(dst[i * so], row[i]);
  });
}
template <typename Acc, typename Combine, typename Merge>
void reduce_into(const Tensor& x, const Output& y, Acc* acc, Acc initial, Combine combine, Merge merge) {
  reduce_into(x, y, acc, initial, combine, merge,
              [&](const float* row, int64_t n) { return fold_row<8>(row, n, initial, combine, merge); });
}

// Sums (of what `term` makes of each element) in double, in the run's scratch; then `finish` of
// each sum, stored. Partial sums add (`merge`; a product's multiply).
template <typename Term, typename Finish, typename Merge = std::plus<double>>
void reduce_sums(const Tensor& x, const Output& y, double initial, Term term, Finish finish, Merge merge = Merge()) {
  auto* sums = reinterpret_cast<double*>(y.scratch);
  const auto combine = [&](double a, float b) { return term(a, b); };
  if constexpr (std::is_same_v<Term, std::decay_t<decltype(summed)>>)
    reduce_into<double>(x, y, sums, initial, combine, merge, row_sum);
  else
    reduce_into<double>(x, y, sums, initial, combine, merge);
  const int64_t count = plan_of<Reduction>(y).reduced_count;
  for (int64_t i = 0; i < y.size(); ++i) y.f32()[i] = static_cast<float>(finish(sums[i], count));
}

// Max or min of the reduced elements; a NaN among them wins, as in ONNX Runtime.
template <typename Better>
void reduce_extreme(const Tensor& x, const Output& y, float initial, Better better) {
  const auto keep = [&](float a, float b) { return std::isnan(a) || (!std::isnan(b) && !better(b, a)) ? a : b; };
  reduce_into<float>(x, y, y.f32(), initial, keep, keep);
}

void exp_of_difference(const float* __restrict x, const float* __restrict peak, float* __restrict y, int64_t cols) {
  for (int64_t j = 0; j < cols; ++j) y[j] = exp_approx(x[j] - peak[j]);
}

// Softmax of one row of `n` adjacent values (over the last axis, as attention takes it), in the
// order of operations of softmax_columns, so both give the same bits.
void softmax_row(const float* __restrict x, float* __restrict y, int64_t n, bool log) {
  float peak = -std::numeric_limits<float>::infinity();
  for (int64_t k = 0; k < n; ++k) peak = std::max(peak, x[k]);
  for (int64_t k = 0; k < n; ++k) y[k] = exp_approx(x[k] - peak);
  double sum = 0.0;
  for (int64_t k = 0; k < n; ++k) sum += y[k];
  if (log) {
    const auto log_sum = static_cast<float>(std::log(sum));
    for (int64_t k = 0; k < n; ++k) y[k] = x[k] - peak - log_sum;
    return;
  }
  for (int64_t k = 0; k < n; ++k) y[k] = static_cast<float>(y[k] / sum);
}

// Softmax of `n` values spaced `inner` apart, for `inner` adjacent such columns, kColumns at a
// time so the loops walk memory contiguously and the running maxima and sums stay on the stack.
void softmax_columns(const float* x, float* y, int64_t n, int64_t inner, bool log) {
  if (inner == 1) return softmax_row(x, y, n, log);
  constexpr int64_t kColumns = 64;
  float peak[kColumns];
  double sum[kColumns];
  for (int64_t j0 = 0; j0 < inner; j0 += kColumns) {
    const int64_t cols = std::min(kColumns, inner - j0);
    std::fill(peak, peak + cols, -std::numeric_limits<float>::infinity());
    std::fill(sum, sum + cols, 0.0);
    const float* xc = x + j0;
    float* yc = y + j0;
    for (int64_t k = 0; k < n; ++k)
      for (int64_t j = 0; j < cols; ++j) peak[j] = std::max(peak[j], xc[k * inner + j]);
    // Exponentials first, in a loop of floats alone that becomes vector code; then their sums.
    for (int64_t k = 0; k < n; ++k) exp_of_difference(xc + k * inner, peak, yc + k * inner, cols);
    for (int64_t k = 0; k < n; ++k)
      for (int64_t j = 0; j < cols; ++j) sum[j] += yc[k * inner + j];
    if (log) {
      // x - max - log(sum): exact for the largest element, no exp/log round trip.
      for (int64_t k = 0; k < n; ++k)
        for (int64_t j = 0; j < cols; ++j)
          yc[k * inner + j] = xc[k * inner + j] - peak[j] - static_cast<float>(std::log(sum[j]));
      continue;
    }
    for (int64_t k = 0; k < n; ++k)
      for (int64_t j = 0; j < cols; ++j) yc[k * inner + j] = static_cast<float>(yc[k * inner + j] / sum[j]);
  }
}

}  // namespace

namespace kernels {

// How Softmax, LogSoftmax and Hardmax see their input: `outer` blocks of `n` x `inner`, each of
// the `inner` columns normalised over its `n` values.
struct Columns final : OpPlan {
  Columns(const ref::Op& op, const std::vector<const ref::Value*>& in, const ref::Value&) {
    const Dims& d = in[0]->dims;
    auto axis = static_cast<size_t>(op.get_int("axis", 0));
    // coerce_2d (opset < 13): one softmax over all of dims[axis:]; otherwise along `axis` alone.
    bool flat = op.get_int("coerce_2d", 0) != 0;
    outer = product(d, 0, axis);
    n = flat ? product(d, axis, d.size()) : d[axis];
    inner = flat ? 1 : product(d, axis + 1, d.size());
  }
  int64_t outer, n, inner;
};
const Planner plan_columns = plan_as<Columns>;

namespace {
// Rows of a few adjacent values (a detector's 4420 boxes of two scores): a row at a time cost a
// few values' work in calls and loop set-up, so kColumns rows go through softmax_columns at once,
// laid side by side in a block on the stack and back: the same operations in the same order.
constexpr int64_t kShortRow = 8;
void softmax_short_rows(const float* x, float* y, int64_t rows, int64_t n, bool log) {
  constexpr int64_t kColumns = 64;
  float in[kShortRow * kColumns], out[kShortRow * kColumns];
  for (int64_t r0 = 0; r0 < rows; r0 += kColumns) {
    const int64_t cols = std::min(kColumns, rows - r0);
    for (int64_t j = 0; j < cols; ++j)
      for (int64_t k = 0; k < n; ++k) in[k * cols + j] = x[(r0 + j) * n + k];
    softmax_columns(in, out, n, cols, log);
    for (int64_t j = 0; j < cols; ++j)
      for (int64_t k = 0; k < n; ++k) y[(r0 + j) * n + k] = out[k * cols + j];
  }
}

void softmax_of(Ins in, const Output& out, bool log) {
  const auto& c = plan_of<Columns>(out);
  parallel_ranges(out.parallel, c.outer, 8 * c.n * c.inner, [&](int64_t begin, int64_t end) {
    if (c.inner == 1 && c.n <= kShortRow)
      return softmax_short_rows(in[0].f32() + begin * c.n, out.f32() + begin * c.n, end - begin, c.n, log);
    for (int64_t o = begin; o < end; ++o)
      softmax_columns(in[0].f32() + o * c.n * c.inner, out.f32() + o * c.n * c.inner, c.n, c.inner, log);
  });
}
}  // namespace

void softmax(Ins in, const Output& out) { softmax_of(in, out, false); }
void log_softmax(Ins in, const Output& out) { softmax_of(in, out, true); }

// The attributes of the normalisations: LayerNormalization's `axis` and `output` (0: y, 1: mean,
// 2: inverse standard deviation), GroupNormalization's `groups`, and `epsilon`.
struct Normalisation final : OpPlan {
  Normalisation(const ref::Op& op, const std::vector<const ref::Value*>&, const ref::Value&)
      : axis(static_cast<size_t>(op.get_int("axis", 0))), which(op.get_int("output", 0)),
        groups(op.get_int("groups", 1)), epsilon(op.get_float("epsilon", 1e-5f)) {}
  size_t axis;
  int64_t which, groups;
  double epsilon;
};
const Planner plan_normalisation = plan_as<Normalisation>;

// BatchNormalization's epsilon, its epilogue (a fused activation), and where its channels are: axis
// 1, or last (an image channels last, [N, 1, H, W, C]).
struct BatchNormPlan final : OpPlan {
  BatchNormPlan(const ref::Op& op, const std::vector<const ref::Value*>& in, const ref::Value&)
      : epsilon(op.get_float("epsilon", 1e-5f)), channels_last(op.get_int("channels_last", 0) == 1),
        epilogue(fused_activation_of(op)) {
    scratch_bytes = 2 * in[1]->dims[0] * sizeof(float);  // each channel's scale and shift
  }
  double epsilon;
  bool channels_last;
  FusedActivation epilogue;
};
const Planner plan_batch_normalization = plan_as<BatchNormPlan>;

// y = x * scale + shift per channel over `pixels` rows of `channels` values (an image channels
// last); in place or not.
CTXGEN_VECTOR_CLONES void scale_shift_pixels(const float* x, float* y, const float* __restrict scale,
                                             const float* __restrict shift, int64_t pixels, int64_t channels) {
  for (int64_t i = 0; i < pixels; ++i, x += channels, y += channels)
    for (int64_t c = 0; c < channels; ++c) y[c] = x[c] * scale[c] + shift[c];
}

void batch_normalization(Ins in, const Output& out) {
  const Dims& d = in[0].dims();
  const auto& p = plan_of<BatchNormPlan>(out);
  const int64_t channels = p.channels_last ? d.back() : d[1];
  const float *scale = in[1].f32(), *bias = in[2].f32(), *mean = in[3].f32(), *var = in[4].f32();
  float* s = reinterpret_cast<float*>(out.scratch);
  float* shift = s + channels;
  for (int64_t c = 0; c < channels; ++c) {
    s[c] = static_cast<float>(scale[c] / std::sqrt(static_cast<double>(var[c]) + p.epsilon));
    shift[c] = bias[c] - mean[c] * s[c];
  }
  const float* x = in[0].f32();
  float* y = out.f32();
  if (p.channels_last) {
    // Rows of one pixel's channels: the same arithmetic a vector of channels at a time, and the
    // epilogue over each few pixels while they are in L1 (over a thread's whole range it read
    // DenseNet's images a second time: its 58 BatchNormalizations took 4.6 ms of 45).
    const int64_t pixels = product(d, 0, d.size() - 1), chunk = std::max<int64_t>(1, 4096 / channels);
    parallel_ranges(out.parallel, pixels, 2 * channels, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; i += chunk) {
        const int64_t n = std::min(chunk, end - i);
        scale_shift_pixels(x + i * channels, y + i * channels, s, shift, n, channels);
        if (!p.epilogue.empty()) p.epilogue.apply(y + i * channels, n * channels);
      }
    });
    return;
  }
  const int64_t inner = product(d, 2, d.size());
  parallel_ranges(out.parallel, d[0] * channels, 2 * inner, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const int64_t c = row % channels;
      const float* xr = x + row * inner;
      float* yr = y + row * inner;
      for (int64_t i = 0; i < inner; ++i) yr[i] = xr[i] * s[c] + shift[c];
    }
    if (!p.epilogue.empty()) p.epilogue.apply(y + begin * inner, (end - begin) * inner);
  });
}

// A row's sum of term(i) in double, as 8 interleaved partial sums added at the end: a fixed order,
// so every run gives the same bits, which the compiler vectorises (one running sum is a chain of
// dependent additions: LayerNormalization of 128 x 1024 took twice as long).
template <typename Term>
double lane_sum(int64_t n, Term term) {
  double part[8] = {};
  const int64_t whole = n / 8 * 8;
  for (int64_t i = 0; i < whole; i += 8)
    for (int64_t j = 0; j < 8; ++j) part[j] += term(i + j);
  for (int64_t i = whole; i < n; ++i) part[i - whole] += term(i);
  return ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
}

void layer_normalization(Ins in, const Output& out) {
  const Dims& d = in[0].dims();
  const auto& p = plan_of<Normalisation>(out);
  int64_t outer = product(d, 0, p.axis), inner = product(d, p.axis, d.size());
  const double eps = p.epsilon;
  const int64_t which = p.which;
  const float* scale = in[1].f32();
  const float* bias = in.size() > 2 && in[2].present() ? in[2].f32() : nullptr;
  parallel_ranges(out.parallel, outer, 4 * inner, [&](int64_t begin, int64_t end) {
    for (int64_t o = begin; o < end; ++o) {
      const float* x = in[0].f32() + o * inner;
      const double mean = lane_sum(inner, [x](int64_t i) { return double{x[i]}; }) / static_cast<double>(inner);
      const double sq = lane_sum(inner, [x, mean](int64_t i) { return (x[i] - mean) * (x[i] - mean); });
      const double inv = 1.0 / std::sqrt(sq / static_cast<double>(inner) + eps);
      if (which != 0) {
        out.f32()[o] = static_cast<float>(which == 1 ? mean : inv);
        continue;
      }
      // In float, twice the lanes of double. x - m is exact where it cancels (x within a factor 2
      // of m), and c gives back what rounding the mean to float lost, so a row whose spread is
      // tiny beside its mean keeps its digits; each result is within a few ulps of the double
      // computation. Every |x - mean| is at most sqrt(sq): a row that could overflow a float
      // difference, or whose 1/sigma is no normal float, stays in double.
      float* y = out.f32() + o * inner;
      const float m = static_cast<float>(mean), c = static_cast<float>(mean - m), s = static_cast<float>(inv);
      if (!std::isnormal(s) || !(std::fabs(mean) + std::sqrt(sq) < 0x1p126))
        for (int64_t i = 0; i < inner; ++i)
          y[i] = static_cast<float>((x[i] - mean) * inv) * scale[i] + (bias ? bias[i] : 0.0f);
      else if (bias)
        for (int64_t i = 0; i < inner; ++i) y[i] = ((x[i] - m) - c) * s * scale[i] + bias[i];
      else
        for (int64_t i = 0; i < inner; ++i) y[i] = ((x[i] - m) - c) * s * scale[i];
    }
  });
}

// One 1 per softmax column, at its first largest element (flattened at axis before opset 13).
void hardmax(Ins in, const Output& out) {
  const auto& c = plan_of<Columns>(out);
  const int64_t outer = c.outer, n = c.n, inner = c.inner;
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
struct NllLoss final : OpPlan {
  NllLoss(const ref::Op& op, const std::vector<const ref::Value*>&, const ref::Value&)
      : has_ignore(op.get_int("has_ignore_index", 0) != 0), ignore(op.get_int("ignore_index", 0)),
        reduction(op.get_int("reduction", 0)) {}
  bool has_ignore;
  int64_t ignore, reduction;  // reduction: 0 none, 1 sum, 2 mean
};
const Planner plan_nll_loss = plan_as<NllLoss>;

void nll_loss(Ins in, const Output& out) {
  const Dims& x = in[0].dims();
  int64_t classes = x[1], inner = product(x, 2, x.size());
  const int64_t n = inner == 0 ? 0 : x[0];  // no targets: the batch is not walked
  const auto& p = plan_of<NllLoss>(out);
  const float* weight = in.size() > 2 && in[2].present() ? in[2].f32() : nullptr;
  double total = 0, weights = 0;
  visit_dtype(in[1].dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* target = in[1].as<T>();
    for (int64_t b = 0; b < n; ++b)
      for (int64_t i = 0; i < inner; ++i) {
        const auto t = static_cast<int64_t>(target[b * inner + i]);
        float loss = 0.0f;
        if (!(p.has_ignore && t == p.ignore)) {
          if (t < 0 || t >= classes)
            throw Error(ErrorCode::kRuntime, "NegativeLogLikelihoodLoss target " + std::to_string(t) +
                                                 " is outside [0, " + std::to_string(classes) + ")");
          float w = weight ? weight[t] : 1.0f;
          loss = -in[0].f32()[(b * classes + t) * inner + i] * w;
          weights += w;
        }
        if (p.reduction == 0) out.f32()[b * inner + i] = loss;
        total += loss;
      }
  });
  if (p.reduction == 1) out.f32()[0] = static_cast<float>(total);
  if (p.reduction == 2) out.f32()[0] = static_cast<float>(total / weights);
}

struct CumSum final : OpPlan {
  CumSum(const ref::Op& op, const std::vector<const ref::Value*>&, const ref::Value&)
      : axis(static_cast<size_t>(op.get_int("axis", 0))), exclusive(op.get_int("exclusive", 0) != 0),
        reverse(op.get_int("reverse", 0) != 0) {}
  size_t axis;
  bool exclusive, reverse;
};
const Planner plan_cum_sum = plan_as<CumSum>;

void cum_sum(Ins in, const Output& out) {
  const Dims& d = in[0].dims();
  const auto& p = plan_of<CumSum>(out);
  const size_t axis = p.axis;
  const bool exclusive = p.exclusive, reverse = p.reverse;
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

void reduce_mean(Ins in, const Output& out) {
  reduce_sums(in[0], out, 0.0, summed, [](double sum, int64_t count) {
    return sum * (count > 0 ? 1.0 / static_cast<double>(count) : std::numeric_limits<double>::quiet_NaN());
  });
}

void reduce_sum(Ins in, const Output& out) { reduce_sums(in[0], out, 0.0, summed, plain); }

void reduce_prod(Ins in, const Output& out) {
  reduce_sums(in[0], out, 1.0, [](double a, float b) { return a * b; }, plain, std::multiplies<double>());
}

void reduce_l1(Ins in, const Output& out) {
  reduce_sums(in[0], out, 0.0, [](double a, float b) { return a + std::fabs(b); }, plain);
}

void reduce_sum_square(Ins in, const Output& out) {
  reduce_sums(in[0], out, 0.0, [](double a, float b) { return a + double{b} * b; }, plain);
}

void reduce_l2(Ins in, const Output& out) {
  reduce_sums(in[0], out, 0.0, [](double a, float b) { return a + double{b} * b; },
              [](double sum, int64_t) { return std::sqrt(sum); });
}

void reduce_log_sum(Ins in, const Output& out) {
  reduce_sums(in[0], out, 0.0, summed, [](double sum, int64_t) { return std::log(sum); });
}

// Accumulated in double, which holds e^x for every float x below 709.
void reduce_log_sum_exp(Ins in, const Output& out) {
  reduce_sums(in[0], out, 0.0, [](double a, float b) { return a + std::exp(double{b}); },
              [](double sum, int64_t) { return std::log(sum); });
}

// Per (image, group of channels): normalised together, then scaled and shifted per channel.
void group_normalization(Ins in, const Output& out) {
  const Dims& d = in[0].dims();
  const auto& p = plan_of<Normalisation>(out);
  int64_t channels = d[1], groups = p.groups, per_channel = product(d, 2, d.size());
  int64_t per_group = channels / groups * per_channel;
  const double eps = p.epsilon;
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
// ArgMax and ArgMin's attributes.
struct ArgExtreme final : OpPlan {
  ArgExtreme(const ref::Op& op, const std::vector<const ref::Value*>&, const ref::Value&)
      : axis(static_cast<size_t>(op.get_int("axis", 0))), last(op.get_int("select_last_index", 0) != 0) {}
  size_t axis;
  bool last;
};
const Planner plan_arg_extreme = plan_as<ArgExtreme>;

namespace {
template <typename Better>
void arg_extreme(Ins in, const Output& out, Better better) {
  const Dims& d = in[0].dims();
  const auto& p = plan_of<ArgExtreme>(out);
  const size_t axis = p.axis;
  const bool last = p.last;
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
}  // namespace

void arg_max(Ins in, const Output& out) { arg_extreme(in, out, std::greater<float>()); }
void arg_min(Ins in, const Output& out) { arg_extreme(in, out, std::less<float>()); }

void reduce_max(Ins in, const Output& out) {
  reduce_extreme(in[0], out, -std::numeric_limits<float>::infinity(), std::greater<float>());
}

void reduce_min(Ins in, const Output& out) {
  reduce_extreme(in[0], out, std::numeric_limits<float>::infinity(), std::less<float>());
}

}  // namespace kernels
}  // namespace ctxgen::runtime

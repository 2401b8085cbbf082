// Resize (nearest and N-linear, of float32, uint8 and int8 images). Coordinates
// follow ONNX Runtime's arithmetic (float, the same rounding rules), so a compiled model gives ORT's
// results.

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>

#include "kernels.h"

namespace ctxgen::runtime {
namespace {

// Input coordinate of output coordinate `x` on one axis (the `coord` codes of ref_program.h).
float original_coordinate(int64_t coord, int64_t x, float scale, int64_t out_len, int64_t in_len) {
  auto xf = static_cast<float>(x);
  switch (coord) {
    case 0: return (xf + 0.5f) / scale - 0.5f;                       // half_pixel
    case 1: return xf / scale;                                        // asymmetric
    case 2: return out_len > 1 ? (xf + 0.5f) / scale - 0.5f : 0.0f;   // pytorch_half_pixel
    case 3:                                                           // align_corners
      return out_len == 1 ? 0.0f : xf * static_cast<float>(in_len - 1) / static_cast<float>(out_len - 1);
    case 4: return (xf + 0.5f) / scale;                               // tf_half_pixel_for_nearest
    default: {                                                        // half_pixel_symmetric
      float adjustment = static_cast<float>(out_len) / (scale * static_cast<float>(in_len));
      float center = static_cast<float>(in_len) / 2.0f;
      return center * (1.0f - adjustment) + (xf + 0.5f) / scale - 0.5f;
    }
  }
}

int64_t nearest_index(int64_t mode, float x, bool downsampling) {
  switch (mode) {
    case 0:  // round_prefer_floor
      return x == static_cast<float>(static_cast<int64_t>(x)) + 0.5f ? static_cast<int64_t>(std::floor(x))
                                                                     : static_cast<int64_t>(std::round(x));
    case 1: return static_cast<int64_t>(std::round(x));  // round_prefer_ceil
    case 2: return static_cast<int64_t>(std::floor(x));
    case 3: return static_cast<int64_t>(std::ceil(x));
    default: return downsampling ? static_cast<int64_t>(std::ceil(x)) : static_cast<int64_t>(x);  // opset < 11
  }
}

// Per output coordinate of one axis: the two input positions and their weights (nearest: one
// position, weight 1).
struct Taps {
  std::vector<int64_t> lo, hi;
  std::vector<float> w_lo, w_hi;
};

Taps axis_taps(const ref::Op& op, float scale, int64_t out_len, int64_t in_len) {
  int64_t coord = op.get_int("coord", 0), nearest = op.get_int("nearest_mode", 0);
  bool linear = op.get_int("mode", 0) == 1;
  Taps t;
  for (auto* v : {&t.lo, &t.hi}) v->reserve(static_cast<size_t>(out_len));
  for (auto* v : {&t.w_lo, &t.w_hi}) v->reserve(static_cast<size_t>(out_len));
  for (int64_t x = 0; x < out_len; ++x) {
    float original = original_coordinate(coord, x, scale, out_len, in_len);
    if (!linear) {
      // Extreme scales give coordinates far outside the axis, or NaN; converting those to an
      // integer is undefined. Within [-1, in_len] the index clamps to the same edge.
      original = std::isnan(original) ? 0.0f : std::clamp(original, -1.0f, static_cast<float>(in_len));
      int64_t i = std::clamp<int64_t>(nearest_index(nearest, original, scale < 1.0f), 0, in_len - 1);
      t.lo.push_back(i);
      t.hi.push_back(i);
      t.w_lo.push_back(1.0f);
      t.w_hi.push_back(0.0f);
      continue;
    }
    float in = std::max(0.0f, std::min(original, static_cast<float>(in_len - 1)));
    int64_t lo = std::min(static_cast<int64_t>(in), in_len - 1), hi = std::min(lo + 1, in_len - 1);
    t.lo.push_back(lo);
    t.hi.push_back(hi);
    t.w_lo.push_back(lo == hi ? 1.0f : std::fabs(in - static_cast<float>(hi)));
    t.w_hi.push_back(lo == hi ? 0.0f : std::fabs(in - static_cast<float>(lo)));
  }
  return t;
}

// One output position's `lanes` values from its taps' (separate functions so that the compiler
// knows the output does not overlap the input, and makes vector code of them): w * a, and the
// bilinear w[0] a + w[1] b + w[2] c + w[3] d in that order.
template <typename Lanes>
void scale(float* __restrict y, const float* __restrict a, float w, Lanes lanes) {
  for (int64_t l = 0; l < lanes; ++l) y[l] = w * a[l];
}
template <typename Lanes>
void blend(float* __restrict y, const float* __restrict a, const float* __restrict b, const float* __restrict c,
           const float* __restrict d, std::array<float, 4> w, Lanes lanes) {
  for (int64_t l = 0; l < lanes; ++l) y[l] = ((w[0] * a[l] + w[1] * b[l]) + w[2] * c[l]) + w[3] * d[l];
}

// Does every output position of the axis read the input position it has, whole?
bool is_identity(const Taps& t, int64_t in_len) {
  if (static_cast<int64_t>(t.lo.size()) != in_len) return false;
  for (size_t j = 0; j < t.lo.size(); ++j)
    if (t.lo[j] != static_cast<int64_t>(j) || t.w_lo[j] != 1.0f || t.w_hi[j] != 0.0f) return false;
  return true;
}

// The taps of every axis and the axes that blend, worked out once per program. Trailing axes the
// resize leaves as they are (the channels of a channels-last image) are not axes here but
// `lanes`: runs of values each tap reads and writes whole.
struct ResizePlan final : OpPlan {
  Dims in_strides, out_dims;  // of the axes that remain
  std::vector<Taps> taps;
  std::vector<size_t> blended;  // axes where an output reads two positions, but the last
  bool last_blended = false;
  int64_t lanes = 1;
};

}  // namespace

namespace kernels {

std::unique_ptr<OpPlan> plan_resize(const ref::Op& op, const std::vector<const ref::Value*>& in, const ref::Value& out) {
  const Dims& xd = in[0]->dims;
  auto plan = std::make_unique<ResizePlan>();
  const auto* scales = op.attr("scales");
  for (size_t a = 0; a < xd.size(); ++a) plan->taps.push_back(axis_taps(op, scales->floats[a], out.dims[a], xd[a]));
  size_t rank = xd.size();
  while (rank > 1 && is_identity(plan->taps[rank - 1], xd[rank - 1])) plan->lanes *= xd[--rank];
  plan->taps.resize(rank);
  plan->in_strides = strides_of(xd);
  plan->in_strides.resize(rank);
  plan->out_dims.assign(out.dims.begin(), out.dims.begin() + static_cast<long>(rank));
  for (size_t a = 0; a < rank; ++a) {
    const auto& w_hi = plan->taps[a].w_hi;
    if (std::any_of(w_hi.begin(), w_hi.end(), [](float w) { return w != 0.0f; })) plan->blended.push_back(a);
  }
  plan->last_blended = rank > 0 && !plan->blended.empty() && plan->blended.back() == rank - 1;
  if (plan->last_blended) plan->blended.pop_back();
  // An 8-bit image is widened into the scratch, resized there and truncated back.
  if (out.dtype != ref::DType::kFloat32)
    plan->scratch_bytes = static_cast<uint64_t>(in[0]->element_count() + out.element_count()) * sizeof(float);
  return plan;
}

}  // namespace kernels

// A row of single values (an image's last axis, not channels last). Reading each output's taps
// from the input rows (one call a value) took a 16x16 to 32x32 bilinear image 2.9 ns a value
// (`cnn_resize_linear`): an input row's taps are now gathered once into rows of their own (most
// input rows serve several output rows), and the blend reads those a vector at a time, with
// blend's arithmetic value by value. Loops built for AVX2 and AVX-512, outside the anonymous
// namespace: GCC takes a cloned internal function for unused.
CTXGEN_VECTOR_CLONES void gather_taps(float* __restrict y, const float* __restrict x, const int64_t* __restrict at,
                                      int64_t width) {
  for (int64_t i = 0; i < width; ++i) y[i] = x[at[i]];
}
CTXGEN_VECTOR_CLONES void scale_row(float* __restrict y, const float* __restrict a, float w, int64_t width) {
  for (int64_t i = 0; i < width; ++i) y[i] = w * a[i];
}
CTXGEN_VECTOR_CLONES void blend_rows(float* __restrict y, const float* __restrict a_lo, const float* __restrict b_lo,
                                     const float* __restrict a_hi, const float* __restrict b_hi, const float* __restrict w_lo,
                                     const float* __restrict w_hi, float w0, float w1, int64_t width) {
  for (int64_t i = 0; i < width; ++i)
    y[i] = (((w0 * w_lo[i]) * a_lo[i] + (w1 * w_lo[i]) * b_lo[i]) + (w0 * w_hi[i]) * a_hi[i]) + (w1 * w_hi[i]) * b_hi[i];
}

namespace {

// The input rows a thread's output rows read, their taps gathered (gather_taps; the hi taps only
// where the last axis blends), the last few kept: rows of single values only. The buffer is the
// thread's, grown once.
class GatheredRows {
 public:
  GatheredRows(const Taps& taps, bool blends, int64_t width) : taps_(taps), blends_(blends), width_(width) {
    thread_local std::vector<float> buffer;
    if (buffer.size() < static_cast<size_t>(2 * kKept * width)) buffer.resize(static_cast<size_t>(2 * kKept * width));
    data_ = buffer.data();
  }
  // Input row `offset`'s values at the lo (or hi) taps of the last axis.
  const float* row(const float* x, int64_t offset, bool hi) {
    size_t slot = 0;
    while (slot < kKept && offsets_[slot] != offset) ++slot;
    if (slot == kKept) {
      slot = next_;
      next_ = (next_ + 1) % kKept;
      offsets_[slot] = offset;
      float* lo_row = data_ + 2 * static_cast<int64_t>(slot) * width_;
      gather_taps(lo_row, x + offset, taps_.lo.data(), width_);
      if (blends_) gather_taps(lo_row + width_, x + offset, taps_.hi.data(), width_);
    }
    return data_ + (2 * static_cast<int64_t>(slot) + (hi ? 1 : 0)) * width_;
  }

 private:
  static constexpr size_t kKept = 4;
  const Taps& taps_;
  bool blends_;
  int64_t width_;
  float* data_ = nullptr;
  std::array<int64_t, kKept> offsets_ = {-1, -1, -1, -1};
  size_t next_ = 0;
};

void resize_floats(const ResizePlan& plan, const float* x, float* y, int64_t size, const ParallelFor* parallel) {
  if (plan.out_dims.empty()) {  // a scalar: nothing to interpolate
    y[0] = x[0];
    return;
  }
  // Row by row of the last axis: the corners of the other blended axes are found once per row.
  // Sums and products keep the order of a corner-by-corner sum over all blended axes (the last
  // axis is the highest corner bit), so the result does not depend on this split.
  const Dims& yd = plan.out_dims;
  const Dims& xs = plan.in_strides;
  const size_t last = yd.size() - 1;
  const std::vector<Taps>& taps = plan.taps;
  const std::vector<size_t>& blended = plan.blended;
  const bool last_blended = plan.last_blended;
  const Taps& inner = taps[last];
  const size_t corners = size_t{1} << blended.size();
  const int64_t width = yd[last];
  with_lanes(plan.lanes, [&](auto lanes) {
  parallel_ranges(parallel, size / (width * lanes), width * lanes * static_cast<int64_t>(2 * corners),
                  [&](int64_t begin, int64_t end) {
    const bool single = lanes == 1 && xs[last] == 1;
    GatheredRows gathered(inner, last_blended, single ? width : 0);
    SmallArray<float, 16> corner_weight(corners);
    SmallArray<int64_t, 16> corner_offset(corners);
    AxisIndex at(last);
    for (size_t a = last, rest = static_cast<size_t>(begin); a-- > 0;) {
      at[a] = static_cast<int64_t>(rest % static_cast<size_t>(yd[a]));
      rest /= static_cast<size_t>(yd[a]);
    }
    for (int64_t row = begin; row < end; ++row) {
      int64_t base = 0;
      for (size_t a = 0; a < last; ++a) base += taps[a].lo[static_cast<size_t>(at[a])] * xs[a];
      for (size_t corner = 0; corner < corners; ++corner) {
        float weight = 1.0f;
        int64_t offset = base;
        for (size_t k = 0; k < blended.size(); ++k) {
          size_t a = blended[k];
          auto j = static_cast<size_t>(at[a]);
          bool hi = (corner >> k) & 1;
          weight *= hi ? taps[a].w_hi[j] : taps[a].w_lo[j];
          if (hi) offset += (taps[a].hi[j] - taps[a].lo[j]) * xs[a];
        }
        corner_weight[corner] = weight;
        corner_offset[corner] = offset;
      }
      float* dst = y + row * width * lanes;
      const int64_t step = xs[last];
      // The common cases, in the same order of sums and products as the general loop below:
      // one corner read along the row (nearest, or linear along other axes only), and bilinear.
      if (single && corners == 1 && !last_blended) {
        scale_row(dst, gathered.row(x, corner_offset[0], false), corner_weight[0], width);
      } else if (single && corners == 2 && last_blended) {
        blend_rows(dst, gathered.row(x, corner_offset[0], false), gathered.row(x, corner_offset[1], false),
                   gathered.row(x, corner_offset[0], true), gathered.row(x, corner_offset[1], true), inner.w_lo.data(),
                   inner.w_hi.data(), corner_weight[0], corner_weight[1], width);
      } else if (corners == 1 && !last_blended) {
        const float w0 = corner_weight[0];
        const float* src = x + corner_offset[0];
        for (int64_t i = 0; i < width; ++i, dst += lanes) {
          scale(dst, src + inner.lo[static_cast<size_t>(i)] * step, w0, lanes);
        }
      } else if (corners == 2 && last_blended) {
        const float w0 = corner_weight[0], w1 = corner_weight[1];
        const float *r0 = x + corner_offset[0], *r1 = x + corner_offset[1];
        for (int64_t i = 0; i < width; ++i, dst += lanes) {
          const auto j = static_cast<size_t>(i);
          const int64_t lo = inner.lo[j] * step, hi = inner.hi[j] * step;
          const float wl = inner.w_lo[j], wh = inner.w_hi[j];
          blend(dst, r0 + lo, r1 + lo, r0 + hi, r1 + hi, {w0 * wl, w1 * wl, w0 * wh, w1 * wh}, lanes);
        }
      } else {
        for (int64_t i = 0; i < width; ++i, dst += lanes) {
          const auto j = static_cast<size_t>(i);
          for (int64_t l = 0; l < lanes; ++l) {
            float sum = 0.0f;
            for (size_t c = 0; c < corners; ++c)
              sum += (last_blended ? corner_weight[c] * inner.w_lo[j] : corner_weight[c]) * x[corner_offset[c] + inner.lo[j] * step + l];
            if (last_blended)
              for (size_t c = 0; c < corners; ++c)
                sum += (corner_weight[c] * inner.w_hi[j]) * x[corner_offset[c] + inner.hi[j] * step + l];
            dst[l] = sum;
          }
        }
      }
      for (size_t a = last; a-- > 0;) {
        if (++at[a] < yd[a]) break;
        at[a] = 0;
      }
    }
  });
  });
}

// 8-bit values to float32 and back, truncated toward zero as ONNX Runtime's Resize of uint8 and
// int8 images stores its float blend (clamped to the type, which a blend of its values can only
// leave by a rounding). Loops that vectorise: converting each of a bilinear output's four reads
// on its own made the 8-bit Resize twice as slow as the float one.
template <typename T>
void widen(const T* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = static_cast<float>(x[i]);
}
template <typename T>
void narrow(const float* x, T* y, int64_t n) {
  constexpr auto lo = static_cast<float>(std::numeric_limits<T>::lowest()), hi = static_cast<float>(std::numeric_limits<T>::max());
  for (int64_t i = 0; i < n; ++i) y[i] = static_cast<T>(static_cast<int32_t>(std::min(std::max(x[i], lo), hi)));
}
template <typename T>
void resize_8bit(const ResizePlan& plan, Ins in, const Output& out) {
  auto* x = reinterpret_cast<float*>(out.scratch);
  float* y = x + in[0].size();
  widen(in[0].as<T>(), x, in[0].size());
  resize_floats(plan, x, y, out.size(), out.parallel);
  narrow(y, out.as<T>(), out.size());
}

}  // namespace

namespace kernels {

void resize(Ins in, const Output& out) {
  const auto& plan = plan_of<ResizePlan>(out);
  switch (out.dtype()) {
    case ref::DType::kUInt8: return resize_8bit<uint8_t>(plan, in, out);
    case ref::DType::kInt8: return resize_8bit<int8_t>(plan, in, out);
    default: return resize_floats(plan, in[0].f32(), out.f32(), out.size(), out.parallel);
  }
}

}  // namespace kernels
}  // namespace ctxgen::runtime

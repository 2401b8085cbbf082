// MaxPool and AveragePool over N-D windows. Windows are clipped to the input: padding never wins
// a max, and counts towards an average only with count_include_pad (then up to the padded edge,
// not beyond it: a ceil_mode window running past the padding counts only what lies inside).

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels.h"

namespace ctxgen::runtime {
namespace kernels {

// A pooling op's window over the spatial axes, and the input's spatial strides.
struct Window final : OpPlan {
  Window(const ref::Op& op, const std::vector<const ref::Value*>& x, const ref::Value& y);
  Dims in, out, kernel, strides, pads, dilations, in_strides;  // pads: begins then ends
  bool include_pad;                                             // AveragePool's count_include_pad
  // The fast path's: 2-D windows without dilation over images (1), or over images in channel
  // blocks (the block: a last spatial axis the window does not move along); else 0.
  int64_t lanes = 0;
};

}  // namespace kernels

namespace {

using kernels::Window;

// Sets every output to reduce(plane, start), plane by plane; `start` is the first input index of
// the window per axis (negative inside the begin padding).
template <typename T = float, typename Reduce>
void for_each_window(const Window& w, const Tensor& x, const Output& y, Reduce&& reduce) {
  size_t n = w.in.size();
  int64_t planes = x.dims()[0] * x.dims()[1], in_size = product(w.in), out_size = product(w.out);
  AxisIndex opos(n), start(n);
  for (int64_t p = 0; p < planes; ++p) {
    const T* plane = x.as<T>() + p * in_size;
    T* dst = y.as<T>() + p * out_size;
    for (size_t a = 0; a < n; ++a) opos[a] = 0;
    for (int64_t o = 0; o < out_size; ++o) {
      for (size_t a = 0; a < n; ++a) start[a] = opos[a] * w.strides[a] - w.pads[a];
      dst[o] = reduce(plane, start);
      for (size_t a = n; a-- > 0;) {
        if (++opos[a] < w.out[a]) break;
        opos[a] = 0;
      }
    }
  }
}

// Visits the in-bounds input offsets of the window starting at `start`: visit(offset).
template <typename Visit>
void for_each_tap(const Window& w, const AxisIndex& start, const Dims& in_strides, Visit&& visit) {
  size_t n = w.in.size();
  if (n == 2) {  // images, the common case: two plain loops instead of an index split per tap
    for (int64_t ky = 0; ky < w.kernel[0]; ++ky) {
      const int64_t y = start[0] + ky * w.dilations[0];
      if (y < 0 || y >= w.in[0]) continue;
      for (int64_t kx = 0; kx < w.kernel[1]; ++kx) {
        const int64_t x = start[1] + kx * w.dilations[1];
        if (x >= 0 && x < w.in[1]) visit(y * in_strides[0] + x);
      }
    }
    return;
  }
  int64_t taps = product(w.kernel);
  for (int64_t t = 0; t < taps; ++t) {
    int64_t rem = t, offset = 0;
    bool inside = true;
    for (size_t a = n; a-- > 0;) {
      int64_t at = start[a] + (rem % w.kernel[a]) * w.dilations[a];
      rem /= w.kernel[a];
      inside = inside && at >= 0 && at < w.in[a];
      offset += at * in_strides[a];
    }
    if (inside) visit(offset);
  }
}

// Images without dilation, the common case: each window clipped to the input once, then read row
// by row, no index vector per output; planes shared out over the caller's threads. Each window
// position holds `lanes` values side by side (channels of a block), reduced in one loop.
// reduce(plane, ys, ye, xs, xe, y0, x0, dst) gets the clipped window [ys, ye) x [xs, xe), its
// unclipped start (y0, x0), and writes the window's `lanes` outputs to dst.
// The running max and sum of a window position's `lanes` values: separate functions so that the
// compiler knows `acc` and `v` do not overlap, and makes vector code of them.
template <typename T, typename Lanes>
void max_into(T* __restrict acc, const T* __restrict v, Lanes lanes) {
  // A NaN input propagates: it wins, and once the running max is NaN nothing beats it.
  for (int64_t l = 0; l < lanes; ++l) acc[l] = v[l] > acc[l] || v[l] != v[l] ? v[l] : acc[l];
}

// What a window's maximum starts from: below every value (-inf for floats).
template <typename T>
constexpr T lowest() {
  return std::numeric_limits<T>::has_infinity ? -std::numeric_limits<T>::infinity() : std::numeric_limits<T>::lowest();
}
template <typename Lanes>
void add_into(float* __restrict acc, const float* __restrict v, Lanes lanes) {
  for (int64_t l = 0; l < lanes; ++l) acc[l] += v[l];
}

template <typename T = float, typename Reduce>
void for_each_window_2d(const Window& w, const Tensor& x, const Output& y, Reduce&& reduce) {
  const int64_t ih = w.in[0], iw = w.in[1], oh = w.out[0], ow = w.out[1], lanes = w.lanes;
  const int64_t kh = w.kernel[0], kw = w.kernel[1], sh = w.strides[0], sw = w.strides[1];
  parallel_ranges(y.parallel, x.dims()[0] * x.dims()[1], oh * ow * kh * kw * lanes, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const T* plane = x.as<T>() + p * ih * iw * lanes;
      T* dst = y.as<T>() + p * oh * ow * lanes;
      for (int64_t oy = 0; oy < oh; ++oy) {
        const int64_t y0 = oy * sh - w.pads[0], ys = std::max<int64_t>(y0, 0), ye = std::min(y0 + kh, ih);
        for (int64_t ox = 0; ox < ow; ++ox, dst += lanes) {
          const int64_t x0 = ox * sw - w.pads[1], xs = std::max<int64_t>(x0, 0), xe = std::min(x0 + kw, iw);
          reduce(plane, ys, ye, xs, xe, y0, x0, dst);
        }
      }
    }
  });
}

// MaxPool over row-major images without dilation. Windows wholly inside the row's width are
// reduced a tap at a time across the whole output row: a loop of selects the compiler vectorises
// (a window at a time, its compare branches mispredicted about every other tap on real images:
// 2.8 ns a tap, the 16-channel 2x2 pool of a 32x32 image 46 µs); the windows at the edges are
// clipped one at a time.
// dst[o] = max(dst[o], src[o * step]) for o in [first, last): its bounds are arguments, so that
// a store of a byte cannot change them (through a reference, they kept the loop over uint8 scalar).
template <typename T>
void max_across(T* __restrict dst, const T* __restrict src, int64_t first, int64_t last, int64_t step) {
  for (int64_t o = first; o < last; ++o) {
    const T v = src[o * step];
    dst[o] = v > dst[o] || v != v ? v : dst[o];  // a NaN input propagates, as in max_into
  }
}

template <typename T>
void max_pool_rows(const Window& w, const Tensor& x, const Output& y) {
  const int64_t ih = w.in[0], iw = w.in[1], oh = w.out[0], ow = w.out[1];
  const int64_t kh = w.kernel[0], kw = w.kernel[1], sh = w.strides[0], sw = w.strides[1], left = w.pads[1];
  const int64_t first = std::min((left + sw - 1) / sw, ow);  // the first window starting inside
  const int64_t last = iw - kw + left < 0 ? first : std::clamp((iw - kw + left) / sw + 1, first, ow);  // past the last inside
  parallel_ranges(y.parallel, x.dims()[0] * x.dims()[1], oh * ow * kh * kw, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const T* plane = x.as<T>() + p * ih * iw;
      for (int64_t oy = 0; oy < oh; ++oy) {
        T* __restrict dst = y.as<T>() + (p * oh + oy) * ow;
        const int64_t y0 = oy * sh - w.pads[0], ys = std::max<int64_t>(y0, 0), ye = std::min(y0 + kh, ih);
        for (int64_t ox = 0; ox < ow; ++ox) {
          if (ox == first) ox = last;
          if (ox >= ow) break;
          const int64_t x0 = ox * sw - left, xs = std::max<int64_t>(x0, 0), xe = std::min(x0 + kw, iw);
          // A ceil_mode window lying wholly in the padding gives 0.
          dst[ox] = ys >= ye || xs >= xe ? T(0) : lowest<T>();
          for (int64_t r = ys; r < ye; ++r)
            for (int64_t c = xs; c < xe; ++c) max_into(dst + ox, plane + r * iw + c, 1);
        }
        if (first >= last) continue;
        const T start = ys >= ye ? T(0) : lowest<T>();
        for (int64_t ox = first; ox < last; ++ox) dst[ox] = start;
        for (int64_t r = ys; r < ye; ++r)
          for (int64_t kx = 0; kx < kw; ++kx) max_across(dst, plane + r * iw + kx - left, first, last, sw);
      }
    }
  });
}

}  // namespace

namespace kernels {

Window::Window(const ref::Op& op, const std::vector<const ref::Value*>& x, const ref::Value& y)
    : in(x[0]->dims.begin() + 2, x[0]->dims.end()), out(y.dims.begin() + 2, y.dims.end()),
      kernel(op.get_ints("kernel_shape")), strides(op.get_ints("strides")), pads(op.get_ints("pads")),
      dilations(op.get_ints("dilations")), in_strides(strides_of(in)),
      include_pad(op.get_int("count_include_pad", 0) != 0) {
  // AveragePool has no dilations (validate() does not check a `dilations` attribute on it).
  if (op.type != "MaxPool" || dilations.empty()) dilations.assign(in.size(), 1);
  const size_t n = in.size();
  const bool plain_2d = n >= 2 && dilations[0] == 1 && dilations[1] == 1;
  if (plain_2d && n == 2) lanes = 1;
  if (plain_2d && n == 3 && kernel[2] == 1 && strides[2] == 1 && pads[2] == 0 && pads[5] == 0 && dilations[2] == 1)
    lanes = in[2];
}
const Planner plan_window = plan_as<Window>;

template <typename T>
void max_pool_of(const Window& w, Ins in, const Output& out) {
  if (w.lanes == 1) return max_pool_rows<T>(w, in[0], out);
  if (w.lanes) {
    const int64_t iw = w.in[1];
    return with_lanes(w.lanes, [&](auto lanes) {
      for_each_window_2d<T>(w, in[0], out, [iw, lanes](const T* plane, int64_t ys, int64_t ye, int64_t xs, int64_t xe,
                                                       int64_t, int64_t, T* dst) {
        // A ceil_mode window lying wholly in the padding gives 0.
        const T start = ys >= ye || xs >= xe ? T(0) : lowest<T>();
        for (int64_t l = 0; l < lanes; ++l) dst[l] = start;
        for (int64_t r = ys; r < ye; ++r)
          for (int64_t c = xs; c < xe; ++c) max_into(dst, plane + (r * iw + c) * lanes, lanes);
      });
    });
  }
  for_each_window<T>(w, in[0], out, [&](const T* plane, const AxisIndex& start) {
    T best = lowest<T>();
    bool any = false;
    for_each_tap(w, start, w.in_strides, [&](int64_t at) {
      // A NaN input propagates: once the running max is NaN it stays NaN.
      if (best == best && !(plane[at] <= best)) best = plane[at];
      any = true;
    });
    return any ? best : T(0);  // a ceil_mode window lying wholly in the padding
  });
}

void max_pool(Ins in, const Output& out) {
  const auto& w = plan_of<Window>(out);
  switch (out.dtype()) {
    case ref::DType::kUInt8: return max_pool_of<uint8_t>(w, in, out);
    case ref::DType::kInt8: return max_pool_of<int8_t>(w, in, out);
    case ref::DType::kUInt16: return max_pool_of<uint16_t>(w, in, out);
    case ref::DType::kInt16: return max_pool_of<int16_t>(w, in, out);
    default: return max_pool_of<float>(w, in, out);
  }
}

void average_pool(Ins in, const Output& out) {
  const auto& w = plan_of<Window>(out);
  const bool include_pad = w.include_pad;
  size_t n = w.in.size();
  if (w.lanes) {
    const int64_t iw = w.in[1];
    return with_lanes(w.lanes, [&](auto lanes) {
      for_each_window_2d(w, in[0], out, [&](const float* plane, int64_t ys, int64_t ye, int64_t xs, int64_t xe,
                                            int64_t y0, int64_t x0, float* dst) {
        for (int64_t l = 0; l < lanes; ++l) dst[l] = 0.0f;
        for (int64_t r = ys; r < ye; ++r)
          for (int64_t c = xs; c < xe; ++c) add_into(dst, plane + (r * iw + c) * lanes, lanes);
        int64_t count = std::max<int64_t>(ye - ys, 0) * std::max<int64_t>(xe - xs, 0);
        if (include_pad)  // up to the padded edge, not beyond it
          count = std::max<int64_t>(std::min(y0 + w.kernel[0], w.in[0] + w.pads[n]) - std::max(y0, -w.pads[0]), 0) *
                  std::max<int64_t>(std::min(x0 + w.kernel[1], w.in[1] + w.pads[n + 1]) - std::max(x0, -w.pads[1]), 0);
        const float divisor = static_cast<float>(count);
        for (int64_t l = 0; l < lanes; ++l) dst[l] = count > 0 ? dst[l] / divisor : 0.0f;
      });
    });
  }
  for_each_window(w, in[0], out, [&](const float* plane, const AxisIndex& start) {
    float sum = 0.0f;
    int64_t count = 0;
    for_each_tap(w, start, w.in_strides, [&](int64_t at) {
      sum += plane[at];
      ++count;
    });
    if (include_pad) {
      count = 1;
      for (size_t a = 0; a < n; ++a) {
        int64_t lo = std::max(start[a], -w.pads[a]);
        int64_t hi = std::min(start[a] + w.kernel[a], w.in[a] + w.pads[a + n]);
        count *= std::max<int64_t>(hi - lo, 0);
      }
    }
    return count > 0 ? sum / static_cast<float>(count) : 0.0f;
  });
}

}  // namespace kernels
}  // namespace ctxgen::runtime

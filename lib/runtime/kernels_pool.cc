// MaxPool and AveragePool over N-D windows. Windows are clipped to the input: padding never wins
// a max, and counts towards an average only with count_include_pad (then up to the padded edge,
// not beyond it: a ceil_mode window running past the padding counts only what lies inside).

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels.h"

namespace ctxgen::runtime {
namespace {

struct Window {
  Dims in, out, kernel, strides, pads, dilations;  // spatial; pads: begins then ends
};

// AveragePool has no dilations (validate() does not check a `dilations` attribute on it).
Window window_of(const ref::Op& op, const Tensor& x, const Output& y, bool has_dilations) {
  Window w;
  w.in.assign(x.dims().begin() + 2, x.dims().end());
  w.out.assign(y.dims().begin() + 2, y.dims().end());
  w.kernel = op.get_ints("kernel_shape");
  w.strides = op.get_ints("strides");
  w.pads = op.get_ints("pads");
  if (has_dilations) w.dilations = op.get_ints("dilations");
  if (w.dilations.empty()) w.dilations.assign(w.in.size(), 1);
  return w;
}

// Sets every output to reduce(plane, start), plane by plane; `start` is the first input index of
// the window per axis (negative inside the begin padding).
template <typename Reduce>
void for_each_window(const Window& w, const Tensor& x, const Output& y, Reduce&& reduce) {
  size_t n = w.in.size();
  int64_t planes = x.dims()[0] * x.dims()[1], in_size = product(w.in), out_size = product(w.out);
  std::vector<int64_t> opos(n), start(n);
  for (int64_t p = 0; p < planes; ++p) {
    const float* plane = x.f32() + p * in_size;
    float* dst = y.f32() + p * out_size;
    std::fill(opos.begin(), opos.end(), 0);
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
void for_each_tap(const Window& w, const std::vector<int64_t>& start, const Dims& in_strides, Visit&& visit) {
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

}  // namespace

namespace kernels {

void max_pool(const ref::Op& op, const std::vector<Tensor>& in, const Output& out) {
  Window w = window_of(op, in[0], out, true);
  Dims in_strides = strides_of(w.in);
  for_each_window(w, in[0], out, [&](const float* plane, const std::vector<int64_t>& start) {
    float best = -std::numeric_limits<float>::infinity();
    bool any = false;
    for_each_tap(w, start, in_strides, [&](int64_t at) {
      // A NaN input propagates: once the running max is NaN it stays NaN.
      if (!std::isnan(best) && !(plane[at] <= best)) best = plane[at];
      any = true;
    });
    return any ? best : 0.0f;  // a ceil_mode window lying wholly in the padding
  });
}

void average_pool(const ref::Op& op, const std::vector<Tensor>& in, const Output& out) {
  Window w = window_of(op, in[0], out, false);
  Dims in_strides = strides_of(w.in);
  bool include_pad = op.get_int("count_include_pad", 0) != 0;
  size_t n = w.in.size();
  for_each_window(w, in[0], out, [&](const float* plane, const std::vector<int64_t>& start) {
    float sum = 0.0f;
    int64_t count = 0;
    for_each_tap(w, start, in_strides, [&](int64_t at) {
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

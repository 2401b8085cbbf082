// Data movement: Transpose, Reshape (a byte copy), Tile, Trilu, Concat, Slice, Gather and Pad, for
// every element type.

#include <algorithm>
#include <cstring>
#include <string>
#include <type_traits>

#include "ctxgen/error.h"
#include "kernels.h"

namespace ctxgen::runtime::kernels {
namespace {

// y[i] = x[offset of i], where each output axis moves the output offset by strides[0] and the
// input offset by strides[1] (rows of the innermost axis copied in a tight loop).
// Tiles of a transpose that moves the input's contiguous axis (output axis `axis`) away from the
// output's last one, which would read it a stride apart: kTile x kTile, read along `axis` and
// written along the last axis, keep both sides in cache.
constexpr int64_t kTile = 16;
struct Tiles {
  size_t axis = 0;  // the output rank when the copy runs row by row
  Dims outer;       // the output dims with `axis` and the last one 1: the tiles' rows
};

template <typename T>
void strided_copy(const T* x, T* y, const Dims& out_dims, const Dims (&strides)[2], const Tiles& tiles) {
  int64_t inner = out_dims.empty() ? 1 : out_dims.back(), step = out_dims.empty() ? 0 : strides[1].back();
  if (tiles.axis == out_dims.size()) {
    for_each_row(out_dims, strides, [&](const int64_t* at) {
      if (step == 1) return static_cast<void>(std::memcpy(y + at[0], x + at[1], static_cast<size_t>(inner) * sizeof(T)));
      for (int64_t i = 0; i < inner; ++i) y[at[0] + i] = x[at[1] + i * step];
    });
    return;
  }
  const int64_t rows = out_dims[tiles.axis], row_step = strides[0][tiles.axis], in_row = strides[1][tiles.axis];
  if (inner < kTile) {
    // A short last axis (a shuffle within each pixel, G of 2 to 8; a Slice of a few values of each
    // row, as detectors decode boxes): `rows` of them a call, G a constant where it is 2 or 4, so
    // the loop becomes vector shuffles.
    const auto interleave = [&](const int64_t* at, auto g) {
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < g; ++j) y[at[0] + i * row_step + j] = x[at[1] + i * in_row + j * step];
    };
    for_each_row(tiles.outer, strides, [&](const int64_t* at) {
      if (inner == 2) interleave(at, std::integral_constant<int64_t, 2>{});
      else if (inner == 4) interleave(at, std::integral_constant<int64_t, 4>{});
      else interleave(at, inner);
    });
    return;
  }
  for_each_row(tiles.outer, strides, [&](const int64_t* at) {
    for (int64_t i0 = 0; i0 < rows; i0 += kTile)
      for (int64_t j0 = 0; j0 < inner; j0 += kTile) {
        const int64_t i1 = std::min(rows, i0 + kTile), j1 = std::min(inner, j0 + kTile);
        for (int64_t i = i0; i < i1; ++i)
          for (int64_t j = j0; j < j1; ++j) y[at[0] + i * row_step + j] = x[at[1] + i + j * step];
      }
  });
}

template <typename F>
void for_each_index(const Dims& dims, F&& f) {
  int64_t n = product(dims);
  AxisIndex index(dims.size());
  for (int64_t i = 0; i < n; ++i) {
    f(i, static_cast<const AxisIndex&>(index));
    for (size_t a = dims.size(); a-- > 0;) {
      if (++index[a] < dims[a]) break;
      index[a] = 0;
    }
  }
}

// An index of type I read as int64, checked against [-extent, extent) and made non-negative.
template <typename I>
int64_t index_within(I value, int64_t extent, const char* op) {
  const auto k = static_cast<int64_t>(value);
  if (k < -extent || k >= extent)
    throw Error(ErrorCode::kRuntime, std::string(op) + " index " + std::to_string(k) + " out of range [" +
                                         std::to_string(-extent) + ", " + std::to_string(extent) + ")");
  return k < 0 ? k + extent : k;
}

}  // namespace

// A copy of the input seen through other strides: Transpose (its permutation), Slice (its starts
// and steps).
struct StridedCopy final : OpPlan {
  Dims dims;         // the output's, neighbours that stay neighbours in the input merged
  Dims strides[2];   // the output's, and the input's per axis of `dims`
  int64_t base = 0;  // input offset of the first element
  Tiles tiles;
};

// The tiles' outer rows; a copy row by row of a short last axis goes `rows` of it a call instead
// (strided_copy), the axis before it the tiles' axis.
void plan_short_rows(StridedCopy& plan) {
  const size_t rank = plan.dims.size();
  if (plan.tiles.axis == rank && rank > 1 && plan.dims.back() < kTile && plan.dims[rank - 2] > 1) plan.tiles.axis = rank - 2;
  if (plan.tiles.axis == rank) return;
  plan.tiles.outer = plan.dims;
  plan.tiles.outer[plan.tiles.axis] = 1;
  plan.tiles.outer.back() = 1;
}

std::unique_ptr<OpPlan> plan_transpose(const ref::Op& op, const std::vector<const ref::Value*>& in, const ref::Value& out) {
  auto plan = std::make_unique<StridedCopy>();
  const Dims perm = op.get_ints("perm"), in_strides = strides_of(in[0]->dims);
  // Output axes the input holds side by side in the same order are one axis: a channel shuffle
  // ([N, 2, C/2, H, W] to [N, C/2, 2, H, W]) copies whole H x W planes, not rows of W.
  for (size_t a = 0; a < perm.size(); ++a) {
    const int64_t dim = out.dims[a], stride = in_strides[static_cast<size_t>(perm[a])];
    if (!plan->dims.empty() && plan->strides[1].back() == stride * dim) {
      plan->dims.back() *= dim;
      plan->strides[1].back() = stride;
    } else {
      plan->dims.push_back(dim);
      plan->strides[1].push_back(stride);
    }
  }
  plan->strides[0] = strides_of(plan->dims);
  const Dims& dims = plan->dims;
  const size_t rank = dims.size();
  plan->tiles.axis = rank;
  // Also for a short last axis (a channel shuffle within each pixel of a channels-last image, [P, G,
  // C/G] to [P, C/G, G]): row by row, each row would copy G values.
  if (rank > 1 && dims.back() > 1 && plan->strides[1].back() != 1)
    for (size_t a = 0; a + 1 < rank; ++a)
      if (plan->strides[1][a] == 1 && dims[a] >= kTile) plan->tiles.axis = a;
  plan_short_rows(*plan);
  return plan;
}

std::unique_ptr<OpPlan> plan_slice(const ref::Op& op, const std::vector<const ref::Value*>& in, const ref::Value& out) {
  auto plan = std::make_unique<StridedCopy>();
  plan->tiles.axis = out.dims.size();
  const Dims starts = op.get_ints("starts"), steps = op.get_ints("steps"), in_strides = strides_of(in[0]->dims);
  plan->strides[1].assign(steps.size(), 0);  // a single-element axis never steps
  if (product(out.dims) > 0)  // starts of empty axes are not meaningful
    for (size_t a = 0; a < steps.size(); ++a) {
      if (out.dims[a] > 1) plan->strides[1][a] = steps[a] * in_strides[a];
      plan->base += starts[a] * in_strides[a];
    }
  plan->dims = out.dims;
  plan->strides[0] = strides_of(out.dims);
  plan_short_rows(*plan);
  return plan;
}

void transpose(Ins in, const Output& out) {
  const auto& p = plan_of<StridedCopy>(out);
  visit_dtype(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    strided_copy(in[0].as<T>() + p.base, out.as<T>(), p.dims, p.strides, p.tiles);
  });
}

void slice(Ins in, const Output& out) { transpose(in, out); }

// A copy, unless the memory plan placed the output on its input's bytes.
void reshape(Ins in, const Output& out) {
  if (out.data != in[0].data) std::memcpy(out.data, in[0].data, static_cast<size_t>(out.value->byte_size()));
}

// The input's strides, for kernels that compute each element's input offset.
struct InputStrides final : OpPlan {
  Dims strides;
};
std::unique_ptr<OpPlan> plan_input_strides(const ref::Op&, const std::vector<const ref::Value*>& in, const ref::Value&) {
  auto plan = std::make_unique<InputStrides>();
  plan->strides = strides_of(in[0]->dims);
  return plan;
}

void tile(Ins in, const Output& out) {
  const Dims& xd = in[0].dims();
  const Dims& xs = plan_of<InputStrides>(out).strides;
  visit_dtype(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* x = in[0].as<T>();
    T* y = out.as<T>();
    for_each_index(out.dims(), [&](int64_t i, const AxisIndex& at) {
      int64_t offset = 0;
      for (size_t a = 0; a < xd.size(); ++a) offset += (at[a] % xd[a]) * xs[a];
      y[i] = x[offset];
    });
  });
}

struct Trilu final : OpPlan {
  Trilu(const ref::Op& op, const std::vector<const ref::Value*>&, const ref::Value&)
      : k(op.get_int("k", 0)), upper(op.get_int("upper", 1) != 0) {}
  int64_t k;
  bool upper;
};
const Planner plan_trilu = plan_as<Trilu>;

// Keeps the elements on and above (upper) or on and below (lower) diagonal k of each matrix.
void trilu(Ins in, const Output& out) {
  const Dims& d = out.dims();
  const int64_t rows = d[d.size() - 2], cols = d.back(), k = plan_of<Trilu>(out).k;
  const bool upper = plan_of<Trilu>(out).upper;
  int64_t matrices = product(d, 0, d.size() - 2);
  visit_dtype(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* x = in[0].as<T>();
    T* y = out.as<T>();
    for (int64_t m = 0; m < matrices; ++m)
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) {
          int64_t i = (m * rows + r) * cols + c;
          // c - r compared with k, written so it cannot overflow for any k.
          bool keep = upper ? c - r >= k : c - r <= k;
          y[i] = keep ? x[i] : T(0);
        }
  });
}

// The op's `axis` attribute, for kernels that need no other.
struct Axis final : OpPlan {
  Axis(const ref::Op& op, const std::vector<const ref::Value*>&, const ref::Value&)
      : axis(static_cast<size_t>(op.get_int("axis", 0))) {}
  size_t axis;
};
const Planner plan_axis = plan_as<Axis>;

// Copies `bytes` bytes, 16 at a time inline when they are a few such (a channels-last image's
// channels at one position): a call to memcpy for each of those cost more than the copy.
void copy_block(uint8_t* to, const uint8_t* from, int64_t bytes) {
  if (bytes % 16 != 0 || bytes > 256)
    std::memcpy(to, from, static_cast<size_t>(bytes));
  else
    for (int64_t i = 0; i < bytes; i += 16) __builtin_memcpy(to + i, from + i, 16);
}

// Output row by output row, each input's block in turn, so that the output is written in order;
// the rows are split over the caller's threads.
void concat(Ins in, const Output& out) {
  const size_t axis = plan_of<Axis>(out).axis;
  const Dims& od = out.dims();
  auto es = static_cast<int64_t>(ref::dtype_size(out.dtype()));
  int64_t outer = product(od, 0, axis), inner = product(od, axis + 1, od.size()) * es;
  int64_t out_row = od[axis] * inner;
  parallel_ranges(out.parallel, outer, out_row, [&](int64_t begin, int64_t end) {
    if (out_row <= 64) {
      // Rows of a few values (a detector's boxes joined along their last axis): input by input,
      // its rows a fixed-size copy each, not a call.
      int64_t at = 0;
      for (const Tensor& t : in) {
        const int64_t row = t.dims()[axis] * inner;
        const auto rows = [&](auto size) {
          for (int64_t o = begin; o < end; ++o) std::memcpy(out.bytes() + o * out_row + at, t.bytes() + o * row, size);
        };
        if (row == 4) rows(std::integral_constant<size_t, 4>{});
        else if (row == 8) rows(std::integral_constant<size_t, 8>{});
        else if (row == 16) rows(std::integral_constant<size_t, 16>{});
        else rows(static_cast<size_t>(row));
        at += row;
      }
      return;
    }
    for (int64_t o = begin; o < end; ++o) {
      uint8_t* to = out.bytes() + o * out_row;
      for (const Tensor& t : in) {
        const int64_t row = t.dims()[axis] * inner;
        copy_block(to, t.bytes() + o * row, row);
        to += row;
      }
    }
  });
}

void gather(Ins in, const Output& out) {
  const Dims& d = in[0].dims();
  const size_t axis = plan_of<Axis>(out).axis;
  int64_t outer = product(d, 0, axis), extent = d[axis];
  auto inner = product(d, axis + 1, d.size()) * static_cast<int64_t>(ref::dtype_size(out.dtype()));
  int64_t count = in[1].size();
  visit_dtype(in[1].dtype(), [&](auto tag) {
    using I = decltype(tag);
    const I* indices = in[1].as<I>();
    for (int64_t k = 0; k < count; ++k) index_within(indices[k], extent, "Gather");  // before writing anything
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t k = 0; k < count; ++k) {
        const int64_t i = index_within(indices[k], extent, "Gather");
        std::memcpy(out.bytes() + (o * count + k) * inner, in[0].bytes() + (o * extent + i) * inner,
                    static_cast<size_t>(inner));
      }
  });
}

// The data input's strides and the op's axis.
struct AxisStrides final : OpPlan {
  AxisStrides(const ref::Op& op, const std::vector<const ref::Value*>& in, const ref::Value&)
      : axis(static_cast<size_t>(op.get_int("axis", 0))), reduction(op.get_int("reduction", 0)),
        strides(strides_of(in[0]->dims)) {}
  size_t axis;
  int64_t reduction;  // ScatterElements: 0 none, 1 add, 2 mul, 3 max, 4 min
  Dims strides;
};
const Planner plan_axis_strides = plan_as<AxisStrides>;

void gather_elements(Ins in, const Output& out) {
  const Dims& d = in[0].dims();
  const auto& p = plan_of<AxisStrides>(out);
  const size_t axis = p.axis;
  const Dims& ds = p.strides;
  int64_t extent = d[axis];
  visit_dtype(in[1].dtype(), [&](auto index_tag) {
    using I = decltype(index_tag);
    const I* indices = in[1].as<I>();
    visit_dtype(out.dtype(), [&](auto tag) {
      using T = decltype(tag);
      const T* x = in[0].as<T>();
      T* y = out.as<T>();
      for_each_index(out.dims(), [&](int64_t i, const AxisIndex& at) {
        const int64_t k = index_within(indices[i], extent, "GatherElements");
        int64_t offset = 0;
        for (size_t a = 0; a < d.size(); ++a) offset += (a == axis ? k : at[a]) * ds[a];
        y[i] = x[offset];
      });
    });
  });
}

struct Pad final : OpPlan {
  Pad(const ref::Op& op, const std::vector<const ref::Value*>& in, const ref::Value& out)
      : pads(op.get_ints("pads")), in_strides(strides_of(in[0]->dims)), mode(op.get_int("mode", 0)),
        fill(TypedScalar::of(op, "value", out.dtype)) {}
  Dims pads, in_strides;
  int64_t mode;  // 0 constant (`value`), 1 reflect (mirror without repeating the edge), 2 edge (repeat it)
  TypedScalar fill;
};
const Planner plan_pad = plan_as<Pad>;

// Row by row of the last axis, over the caller's threads: the input row it copies (or none: a
// row of the fill), then that row's own pads around one copy. One element at a time through the
// whole index, an image's Pad took ~5 ns a value.
void pad(Ins in, const Output& out) {
  const Dims& xd = in[0].dims();
  const Dims& yd = out.dims();
  const size_t rank = xd.size();
  const auto& p = plan_of<Pad>(out);
  const Dims &pads = p.pads, &xs = p.in_strides;
  // Where output index `at` of axis `a` reads; false for constant mode outside the input.
  const auto source = [&](size_t a, int64_t at, int64_t& at_in) {
    const int64_t n = xd[a];
    at_in = at - pads[a];
    if (at_in >= 0 && at_in < n) return true;
    if (p.mode == 0) return false;
    at_in = p.mode == 2 ? (at_in < 0 ? 0 : n - 1) : (at_in < 0 ? -at_in : 2 * (n - 1) - at_in);
    return true;
  };
  visit_dtype(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* x = in[0].as<T>();
    T* y = out.as<T>();
    const T fill = p.fill.as<T>();
    if (rank == 0) {
      y[0] = x[0];
      return;
    }
    const size_t last = rank - 1;
    const int64_t width = yd[last];
    if (width == 0) return;
    // The columns [copy_begin, copy_end) of every row read the input row as it is.
    const int64_t copy_begin = std::clamp<int64_t>(pads[last], 0, width);
    const int64_t copy_end = std::clamp<int64_t>(pads[last] + xd[last], copy_begin, width);
    parallel_ranges(out.parallel, out.size() / width, width, [&](int64_t begin, int64_t end) {
      AxisIndex at(last);
      for (size_t a = last, rest = static_cast<size_t>(begin); a-- > 0;) {
        at[a] = static_cast<int64_t>(rest % static_cast<size_t>(yd[a]));
        rest /= static_cast<size_t>(yd[a]);
      }
      for (int64_t row = begin; row < end; ++row) {
        T* dst = y + row * width;
        int64_t offset = 0, at_in = 0;
        bool inside = true;
        for (size_t a = 0; a < last && inside; ++a) {
          inside = source(a, at[a], at_in);
          offset += at_in * xs[a];
        }
        if (!inside) {
          std::fill(dst, dst + width, fill);
        } else {
          const T* src = x + offset;
          const auto edge = [&](int64_t j) { dst[j] = source(last, j, at_in) ? src[at_in] : fill; };
          for (int64_t j = 0; j < copy_begin; ++j) edge(j);
          if (copy_end > copy_begin)
            std::memcpy(dst + copy_begin, src + (copy_begin - pads[last]), static_cast<size_t>(copy_end - copy_begin) * sizeof(T));
          for (int64_t j = copy_end; j < width; ++j) edge(j);
        }
        for (size_t a = last; a-- > 0;) {
          if (++at[a] < yd[a]) break;
          at[a] = 0;
        }
      }
    });
  });
}

// One int attribute, for kernels that need no other: Shape `start`, GatherND `batch_dims`,
// EyeLike `k`.
struct IntAttr final : OpPlan {
  explicit IntAttr(int64_t v) : value(v) {}
  int64_t value;
};
std::unique_ptr<OpPlan> plan_shape(const ref::Op& op, const std::vector<const ref::Value*>&, const ref::Value&) {
  return std::make_unique<IntAttr>(op.get_int("start", 0));
}
std::unique_ptr<OpPlan> plan_gather_nd(const ref::Op& op, const std::vector<const ref::Value*>&, const ref::Value&) {
  return std::make_unique<IntAttr>(op.get_int("batch_dims", 0));
}
std::unique_ptr<OpPlan> plan_eye_like(const ref::Op& op, const std::vector<const ref::Value*>&, const ref::Value&) {
  return std::make_unique<IntAttr>(op.get_int("k", 0));
}

void shape(Ins in, const Output& out) {
  const Dims& d = in[0].dims();
  const int64_t start = plan_of<IntAttr>(out).value;
  std::copy(d.begin() + start, d.begin() + start + out.size(), out.as<int64_t>());
}

void size(Ins in, const Output& out) { *out.as<int64_t>() = in[0].size(); }

void gather_nd(Ins in, const Output& out) {
  const Dims& d = in[0].dims();
  const Dims& idx = in[1].dims();
  auto b = static_cast<size_t>(plan_of<IntAttr>(out).value);
  auto m = static_cast<size_t>(idx.back());
  int64_t batches = product(d, 0, b), per_batch = product(idx, b, idx.size() - 1);
  auto es = static_cast<int64_t>(ref::dtype_size(out.dtype()));
  int64_t slice = product(d, b + m, d.size()) * es, batch_stride = product(d, b, d.size()) * es;
  const int64_t* indices = in[1].i64();
  for (int64_t bi = 0; bi < batches; ++bi)
    for (int64_t p = 0; p < per_batch; ++p) {
      const int64_t* coord = indices + (bi * per_batch + p) * static_cast<int64_t>(m);
      int64_t offset = bi * batch_stride;
      for (size_t j = 0; j < m; ++j)
        offset += index_within(coord[j], d[b + j], "GatherND") * product(d, b + j + 1, d.size()) * es;
      std::memcpy(out.bytes() + (bi * per_batch + p) * slice, in[0].bytes() + offset, static_cast<size_t>(slice));
    }
}

void scatter_elements(Ins in, const Output& out) {
  const Dims& d = in[0].dims();
  const auto& p = plan_of<AxisStrides>(out);
  const size_t axis = p.axis;
  const Dims& ds = p.strides;
  const int64_t extent = d[axis];
  std::memcpy(out.data, in[0].data, static_cast<size_t>(out.value->byte_size()));
  visit_dtype(in[1].dtype(), [&](auto index_tag) {
    using I = decltype(index_tag);
    const I* indices = in[1].as<I>();
    visit_dtype(out.dtype(), [&](auto tag) {
      using T = decltype(tag);
      T* y = out.as<T>();
      const T* updates = in[2].as<T>();
      for_each_index(in[1].dims(), [&](int64_t i, const AxisIndex& at) {
        const int64_t k = index_within(indices[i], extent, "ScatterElements");
        int64_t offset = 0;
        for (size_t a = 0; a < d.size(); ++a) offset += (a == axis ? k : at[a]) * ds[a];
        T u = updates[i];
        T& t = y[offset];
        switch (p.reduction) {
          case 1: t = wrapping_add(t, u); break;
          case 2: t = wrapping_mul(t, u); break;
          case 3: t = std::max(t, u); break;
          case 4: t = std::min(t, u); break;
          default: t = u;
        }
      });
    });
  });
}

void eye_like(Ins, const Output& out) {
  const int64_t rows = out.dims()[0], cols = out.dims()[1], k = plan_of<IntAttr>(out).value;
  visit_dtype(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) out.as<T>()[r * cols + c] = c - r == k ? T(1) : T(0);
  });
}

struct OneHot final : OpPlan {
  OneHot(const ref::Op& op, const std::vector<const ref::Value*>&, const ref::Value& out)
      : axis(static_cast<size_t>(op.get_int("axis", 0))), depth(op.get_int("depth", 1)),
        on(TypedScalar::of(op, "on", out.dtype)), off(TypedScalar::of(op, "off", out.dtype)) {}
  size_t axis;
  int64_t depth;
  TypedScalar on, off;
};
const Planner plan_one_hot = plan_as<OneHot>;

void one_hot(Ins in, const Output& out) {
  const auto& p = plan_of<OneHot>(out);
  const Dims& od = out.dims();
  const int64_t depth = p.depth, outer = product(od, 0, p.axis), inner = product(od, p.axis + 1, od.size());
  visit_dtype(in[0].dtype(), [&](auto index_tag) {
    using I = decltype(index_tag);
    const I* indices = in[0].as<I>();
    visit_dtype(out.dtype(), [&](auto tag) {
      using T = decltype(tag);
      const T on = p.on.as<T>(), off = p.off.as<T>();
      T* y = out.as<T>();
      std::fill(y, y + out.size(), off);
      for (int64_t o = 0; o < outer; ++o)
        for (int64_t j = 0; j < inner; ++j) {
          auto k = static_cast<int64_t>(indices[o * inner + j]);
          if (k < 0) k += depth;
          if (k >= 0 && k < depth) y[(o * depth + k) * inner + j] = on;  // out of range: all off, as ONNX says
        }
    });
  });
}

}  // namespace ctxgen::runtime::kernels

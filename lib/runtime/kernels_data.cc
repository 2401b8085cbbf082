// Data movement: Transpose, Reshape (a byte copy), Tile, Trilu, Concat, Slice, Gather and Pad, for
// every element type.

#include <algorithm>
#include <cstring>
#include <string>

#include "ctxgen/error.h"
#include "kernels.h"

namespace ctxgen::runtime::kernels {
namespace {

// y[i] = x[offset of i], where each output axis moves the input offset by `in_strides` (rows of the
// innermost axis copied in a tight loop).
template <typename T>
void strided_copy(const T* x, T* y, const Dims& out_dims, const Dims& in_strides) {
  const Dims strides[2] = {strides_of(out_dims), in_strides};
  int64_t inner = out_dims.empty() ? 1 : out_dims.back(), step = out_dims.empty() ? 0 : in_strides.back();
  for_each_row(out_dims, strides, [&](const int64_t* at) {
    for (int64_t i = 0; i < inner; ++i) y[at[0] + i] = x[at[1] + i * step];
  });
}

template <typename F>
void for_each_index(const Dims& dims, F&& f) {
  int64_t n = product(dims);
  std::vector<int64_t> index(dims.size(), 0);
  for (int64_t i = 0; i < n; ++i) {
    f(i, index);
    for (size_t a = dims.size(); a-- > 0;) {
      if (++index[a] < dims[a]) break;
      index[a] = 0;
    }
  }
}

}  // namespace

void transpose(const ref::Op& op, const std::vector<Tensor>& in, const Output& out) {
  Dims perm = op.get_ints("perm");
  Dims in_strides = strides_of(in[0].dims());
  Dims gathered(perm.size());  // input stride of each output axis
  for (size_t a = 0; a < perm.size(); ++a) gathered[a] = in_strides[static_cast<size_t>(perm[a])];
  visit_dtype(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    strided_copy(in[0].as<T>(), out.as<T>(), out.dims(), gathered);
  });
}

void reshape(const ref::Op&, const std::vector<Tensor>& in, const Output& out) {
  std::memcpy(out.data, in[0].data, static_cast<size_t>(out.value->byte_size()));
}

void tile(const ref::Op&, const std::vector<Tensor>& in, const Output& out) {
  const Dims& xd = in[0].dims();
  Dims xs = strides_of(xd);
  visit_dtype(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* x = in[0].as<T>();
    T* y = out.as<T>();
    for_each_index(out.dims(), [&](int64_t i, const std::vector<int64_t>& at) {
      int64_t offset = 0;
      for (size_t a = 0; a < xd.size(); ++a) offset += (at[a] % xd[a]) * xs[a];
      y[i] = x[offset];
    });
  });
}

// Keeps the elements on and above (upper) or on and below (lower) diagonal k of each matrix.
void trilu(const ref::Op& op, const std::vector<Tensor>& in, const Output& out) {
  const Dims& d = out.dims();
  int64_t rows = d[d.size() - 2], cols = d.back(), k = op.get_int("k", 0);
  bool upper = op.get_int("upper", 1) != 0;
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

void concat(const ref::Op& op, const std::vector<Tensor>& in, const Output& out) {
  auto axis = static_cast<size_t>(op.get_int("axis", 0));
  const Dims& od = out.dims();
  auto es = static_cast<int64_t>(ref::dtype_size(out.dtype()));
  int64_t outer = product(od, 0, axis), inner = product(od, axis + 1, od.size()) * es;
  int64_t out_row = od[axis] * inner;
  int64_t at = 0;  // start of this input's block within an output row, in bytes
  for (const Tensor& t : in) {
    int64_t row = t.dims()[axis] * inner;
    for (int64_t o = 0; o < outer; ++o)
      std::memcpy(out.bytes() + o * out_row + at, t.bytes() + o * row, static_cast<size_t>(row));
    at += row;
  }
}

void slice(const ref::Op& op, const std::vector<Tensor>& in, const Output& out) {
  const Dims& od = out.dims();
  if (product(od) == 0) return;  // starts of empty axes are not meaningful
  Dims starts = op.get_ints("starts"), steps = op.get_ints("steps");
  Dims in_strides = strides_of(in[0].dims());
  Dims stepped(steps.size(), 0);  // input stride per output axis; a single-element axis never steps
  int64_t base = 0;
  for (size_t a = 0; a < steps.size(); ++a) {
    if (od[a] > 1) stepped[a] = steps[a] * in_strides[a];
    base += starts[a] * in_strides[a];
  }
  visit_dtype(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    strided_copy(in[0].as<T>() + base, out.as<T>(), od, stepped);
  });
}

void gather(const ref::Op& op, const std::vector<Tensor>& in, const Output& out) {
  const Dims& d = in[0].dims();
  auto axis = static_cast<size_t>(op.get_int("axis", 0));
  int64_t outer = product(d, 0, axis), extent = d[axis];
  auto inner = product(d, axis + 1, d.size()) * static_cast<int64_t>(ref::dtype_size(out.dtype()));
  int64_t count = in[1].size();
  std::vector<int64_t> indices(static_cast<size_t>(count));
  visit_dtype(in[1].dtype(), [&](auto tag) {
    using T = decltype(tag);
    std::copy(in[1].as<T>(), in[1].as<T>() + count, indices.begin());
  });
  for (int64_t k = 0; k < count; ++k)
    if (indices[k] < -extent || indices[k] >= extent)
      throw Error(ErrorCode::kRuntime, "Gather index " + std::to_string(indices[k]) + " out of range [" +
                                           std::to_string(-extent) + ", " + std::to_string(extent) + ")");
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t k = 0; k < count; ++k) {
      int64_t i = indices[k] < 0 ? indices[k] + extent : indices[k];
      std::memcpy(out.bytes() + (o * count + k) * inner, in[0].bytes() + (o * extent + i) * inner,
                  static_cast<size_t>(inner));
    }
}

void gather_elements(const ref::Op& op, const std::vector<Tensor>& in, const Output& out) {
  const Dims& d = in[0].dims();
  auto axis = static_cast<size_t>(op.get_int("axis", 0));
  Dims ds = strides_of(d);
  int64_t extent = d[axis];
  visit_dtype(in[1].dtype(), [&](auto index_tag) {
    using I = decltype(index_tag);
    const I* indices = in[1].as<I>();
    visit_dtype(out.dtype(), [&](auto tag) {
      using T = decltype(tag);
      const T* x = in[0].as<T>();
      T* y = out.as<T>();
      for_each_index(out.dims(), [&](int64_t i, const std::vector<int64_t>& at) {
        auto k = static_cast<int64_t>(indices[i]);
        if (k < -extent || k >= extent)
          throw Error(ErrorCode::kRuntime, "GatherElements index " + std::to_string(k) + " out of range [" +
                                               std::to_string(-extent) + ", " + std::to_string(extent) + ")");
        int64_t offset = 0;
        for (size_t a = 0; a < d.size(); ++a) offset += (a == axis ? (k < 0 ? k + extent : k) : at[a]) * ds[a];
        y[i] = x[offset];
      });
    });
  });
}

// mode 0 constant (`value`), 1 reflect (mirror without repeating the edge), 2 edge (repeat it).
void pad(const ref::Op& op, const std::vector<Tensor>& in, const Output& out) {
  const Dims& xd = in[0].dims();
  size_t rank = xd.size();
  Dims pads = op.get_ints("pads"), xs = strides_of(xd);
  int64_t mode = op.get_int("mode", 0);
  visit_dtype(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* x = in[0].as<T>();
    T* y = out.as<T>();
    T fill = scalar_of<T>(op, "value");
    for_each_index(out.dims(), [&](int64_t i, const std::vector<int64_t>& at) {
      int64_t offset = 0;
      bool inside = true;
      for (size_t a = 0; a < rank && inside; ++a) {
        int64_t p = at[a] - pads[a], n = xd[a];
        if (p < 0 || p >= n) {
          if (mode == 0) inside = false;
          else if (mode == 2) p = p < 0 ? 0 : n - 1;
          else p = p < 0 ? -p : 2 * (n - 1) - p;
        }
        offset += p * xs[a];
      }
      y[i] = inside ? x[offset] : fill;
    });
  });
}

void shape(const ref::Op& op, const std::vector<Tensor>& in, const Output& out) {
  const Dims& d = in[0].dims();
  auto start = op.get_int("start", 0);
  std::copy(d.begin() + start, d.begin() + start + out.size(), out.as<int64_t>());
}

void size(const ref::Op&, const std::vector<Tensor>& in, const Output& out) { *out.as<int64_t>() = in[0].size(); }

void gather_nd(const ref::Op& op, const std::vector<Tensor>& in, const Output& out) {
  const Dims& d = in[0].dims();
  const Dims& idx = in[1].dims();
  auto b = static_cast<size_t>(op.get_int("batch_dims", 0));
  auto m = static_cast<size_t>(idx.back());
  int64_t batches = product(d, 0, b), per_batch = product(idx, b, idx.size() - 1);
  auto es = static_cast<int64_t>(ref::dtype_size(out.dtype()));
  int64_t slice = product(d, b + m, d.size()) * es, batch_stride = product(d, b, d.size()) * es;
  const int64_t* indices = in[1].i64();
  for (int64_t bi = 0; bi < batches; ++bi)
    for (int64_t p = 0; p < per_batch; ++p) {
      const int64_t* coord = indices + (bi * per_batch + p) * static_cast<int64_t>(m);
      int64_t offset = bi * batch_stride;
      for (size_t j = 0; j < m; ++j) {
        int64_t extent = d[b + j], k = coord[j];
        if (k < -extent || k >= extent)
          throw Error(ErrorCode::kRuntime, "GatherND index " + std::to_string(k) + " out of range [" + std::to_string(-extent) +
                                               ", " + std::to_string(extent) + ")");
        offset += (k < 0 ? k + extent : k) * product(d, b + j + 1, d.size()) * es;
      }
      std::memcpy(out.bytes() + (bi * per_batch + p) * slice, in[0].bytes() + offset, static_cast<size_t>(slice));
    }
}

void scatter_elements(const ref::Op& op, const std::vector<Tensor>& in, const Output& out) {
  const Dims& d = in[0].dims();
  auto axis = static_cast<size_t>(op.get_int("axis", 0));
  int64_t reduction = op.get_int("reduction", 0), extent = d[axis];
  Dims ds = strides_of(d);
  std::memcpy(out.data, in[0].data, static_cast<size_t>(out.value->byte_size()));
  std::vector<int64_t> indices(static_cast<size_t>(in[1].size()));
  visit_dtype(in[1].dtype(), [&](auto tag) {
    using I = decltype(tag);
    std::copy(in[1].as<I>(), in[1].as<I>() + in[1].size(), indices.begin());
  });
  visit_dtype(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T* y = out.as<T>();
    const T* updates = in[2].as<T>();
    for_each_index(in[1].dims(), [&](int64_t i, const std::vector<int64_t>& at) {
      int64_t k = indices[static_cast<size_t>(i)];
      if (k < -extent || k >= extent)
        throw Error(ErrorCode::kRuntime, "ScatterElements index " + std::to_string(k) + " out of range [" +
                                             std::to_string(-extent) + ", " + std::to_string(extent) + ")");
      int64_t offset = 0;
      for (size_t a = 0; a < d.size(); ++a) offset += (a == axis ? (k < 0 ? k + extent : k) : at[a]) * ds[a];
      T u = updates[i];
      T& t = y[offset];
      switch (reduction) {
        case 1: t = wrapping_add(t, u); break;
        case 2: t = wrapping_mul(t, u); break;
        case 3: t = std::max(t, u); break;
        case 4: t = std::min(t, u); break;
        default: t = u;
      }
    });
  });
}

void eye_like(const ref::Op& op, const std::vector<Tensor>&, const Output& out) {
  int64_t rows = out.dims()[0], cols = out.dims()[1], k = op.get_int("k", 0);
  visit_dtype(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) out.as<T>()[r * cols + c] = c - r == k ? T(1) : T(0);
  });
}

void one_hot(const ref::Op& op, const std::vector<Tensor>& in, const Output& out) {
  auto axis = static_cast<size_t>(op.get_int("axis", 0));
  int64_t depth = op.get_int("depth", 1);
  const Dims& od = out.dims();
  int64_t outer = product(od, 0, axis), inner = product(od, axis + 1, od.size());
  std::vector<int64_t> indices(static_cast<size_t>(in[0].size()));
  visit_dtype(in[0].dtype(), [&](auto tag) {
    using I = decltype(tag);
    for (size_t i = 0; i < indices.size(); ++i) indices[i] = static_cast<int64_t>(in[0].as<I>()[i]);
  });
  visit_dtype(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T on = scalar_of<T>(op, "on"), off = scalar_of<T>(op, "off");
    T* y = out.as<T>();
    std::fill(y, y + out.size(), off);
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t j = 0; j < inner; ++j) {
        int64_t k = indices[static_cast<size_t>(o * inner + j)];
        if (k < 0) k += depth;
        if (k >= 0 && k < depth) y[(o * depth + k) * inner + j] = on;  // out of range: all off, as ONNX says
      }
  });
}

}  // namespace ctxgen::runtime::kernels

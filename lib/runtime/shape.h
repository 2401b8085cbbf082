#pragma once
// Shape arithmetic shared by validation and the kernels.

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

namespace ctxgen::runtime {

using Dims = std::vector<int64_t>;

// Product of dims[begin, end); callers pass dims validated to hold at most 2^48 elements.
int64_t product(const Dims& dims, size_t begin, size_t end);
inline int64_t product(const Dims& dims) { return product(dims, 0, dims.size()); }

// Numpy broadcast of two shapes, or nullopt when they do not broadcast.
std::optional<Dims> broadcast(const Dims& a, const Dims& b);

// Row-major element strides of `dims`.
Dims strides_of(const Dims& dims);

// Strides of `dims` seen through the broadcast shape `out` (same or lower rank, right-aligned):
// one per output axis, 0 where `dims` is broadcast.
Dims broadcast_strides(const Dims& dims, const Dims& out);

// A zeroed array of `size` elements: on the stack up to kInline, on the heap beyond, which only
// ranks no exported model uses pay for. Kernels keep their per-axis counters in it, so a run
// allocates nothing.
template <typename T, size_t kInline = 8>
class SmallArray {
 public:
  explicit SmallArray(size_t size) : heap_(size > kInline ? size : 0, T{}), at_(size > kInline ? heap_.data() : inline_) {}
  SmallArray(const SmallArray&) = delete;
  SmallArray& operator=(const SmallArray&) = delete;
  T& operator[](size_t i) { return at_[i]; }
  const T& operator[](size_t i) const { return at_[i]; }

 private:
  T inline_[kInline] = {};
  std::vector<T> heap_;
  T* at_;
};
using AxisIndex = SmallArray<int64_t>;

// Visits every index of dims[0 .. rank-1) in row-major order, keeping one offset per tensor
// (offset += strides[t][axis] as the index moves). The innermost axis is left to the caller, who
// runs a tight loop over it: `body(offsets)` is called once per row. With any axis empty, the
// innermost included, no row holds an element and nothing is visited: the outer axes of an empty
// tensor may still span ~10^11 rows.
template <size_t kTensors, typename Body>
void for_each_row(const Dims& dims, const Dims* strides, Body&& body) {
  size_t outer_rank = dims.empty() ? 0 : dims.size() - 1;
  for (int64_t d : dims)
    if (d == 0) return;
  AxisIndex index(outer_rank);
  int64_t offsets[kTensors] = {};
  while (true) {
    body(static_cast<const int64_t*>(offsets));
    size_t axis = outer_rank;
    while (axis > 0) {
      --axis;
      ++index[axis];
      for (size_t t = 0; t < kTensors; ++t) offsets[t] += strides[t][axis];
      if (index[axis] < dims[axis]) break;
      for (size_t t = 0; t < kTensors; ++t) offsets[t] -= strides[t][axis] * dims[axis];
      index[axis] = 0;
      if (axis == 0) return;
    }
    if (outer_rank == 0) return;
  }
}
template <size_t kTensors, typename Body>
void for_each_row(const Dims& dims, const Dims (&strides)[kTensors], Body&& body) {
  for_each_row<kTensors>(dims, static_cast<const Dims*>(strides), std::forward<Body>(body));
}

}  // namespace ctxgen::runtime

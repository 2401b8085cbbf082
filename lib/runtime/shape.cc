#include "shape.h"

#include <algorithm>

namespace ctxgen::runtime {

int64_t product(const Dims& dims, size_t begin, size_t end) {
  int64_t n = 1;
  for (size_t i = begin; i < end; ++i) n *= dims[i];
  return n;
}

std::optional<Dims> broadcast(const Dims& a, const Dims& b) {
  size_t rank = std::max(a.size(), b.size());
  Dims out(rank);
  for (size_t i = 0; i < rank; ++i) {
    int64_t da = i < rank - a.size() ? 1 : a[i - (rank - a.size())];
    int64_t db = i < rank - b.size() ? 1 : b[i - (rank - b.size())];
    if (da != db && da != 1 && db != 1) return std::nullopt;
    out[i] = da == 1 ? db : da;
  }
  return out;
}

Dims strides_of(const Dims& dims) {
  Dims s(dims.size());
  int64_t step = 1;
  for (size_t i = dims.size(); i-- > 0;) {
    s[i] = step;
    step *= dims[i];
  }
  return s;
}

Dims broadcast_strides(const Dims& dims, const Dims& out) {
  Dims own = strides_of(dims);
  Dims s(out.size(), 0);
  size_t lead = out.size() - dims.size();
  for (size_t i = 0; i < dims.size(); ++i) s[lead + i] = dims[i] == 1 ? 0 : own[i];
  return s;
}

}  // namespace ctxgen::runtime

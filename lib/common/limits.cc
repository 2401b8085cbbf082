#include "ctxgen/limits.h"

namespace ctxgen {

std::optional<int64_t> bounded_element_count(const std::vector<int64_t>& dims) {
  for (int64_t d : dims)
    if (d < 0) return std::nullopt;
  for (int64_t d : dims)
    if (d == 0) return 0;  // empty, however large the others
  int64_t count = 1;
  for (int64_t d : dims)
    if (__builtin_mul_overflow(count, d, &count) || count > kMaxElements) return std::nullopt;
  return count;
}

}  // namespace ctxgen

#pragma once
// The one bound on a tensor's size, checked wherever a shape enters ctxgen (a model's declared
// dims, a shape option, a context binary's program), so no element count or byte size computed
// from a shape can wrap.

#include <cstdint>
#include <optional>
#include <vector>

namespace ctxgen {

// A tensor holds at most 2^48 elements.
inline constexpr int64_t kMaxElements = int64_t{1} << 48;

// The number of elements of a tensor of `dims`, or nullopt when a dim is negative or the count
// passes kMaxElements (computed without wrapping: dims whose product wraps to 1 are caught).
std::optional<int64_t> bounded_element_count(const std::vector<int64_t>& dims);

}  // namespace ctxgen

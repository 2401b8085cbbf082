#pragma once
// Counts the heap allocations a test binary makes (its global operator new is replaced by
// allocations.cc), so a test can prove a call allocates nothing.

#include <cstdint>

namespace ctxgen::testing {

// Allocations through operator new since the process started, on every thread.
uint64_t allocations_so_far();

}  // namespace ctxgen::testing

#pragma once
// Static memory plan of a ref program: every kArena value gets a byte offset in one arena so that
// two values alive at the same time never overlap.

#include <cstdint>

#include "ctxgen/ref_program.h"

namespace ctxgen::refc {

inline constexpr uint64_t kArenaAlignment = 64;

// Sets `index` of every kArena value to its offset (a multiple of kArenaAlignment) and
// program.arena_bytes to the high-water mark. A value is alive from the op that writes it to the
// last op that reads it, both included, so an op never writes over the inputs it reads.
void plan_memory(ref::Program& program);

}  // namespace ctxgen::refc

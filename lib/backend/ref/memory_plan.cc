// Greedy-by-size placement (as in TFLite's arena planner): values are placed largest first, each
// in the smallest gap left between already placed values whose lifetimes overlap its own. Big
// values then claim space first and small ones fill the holes, which packs better than placing in
// execution order. A Reshape's output is its input's bytes (no value is written twice, so the two
// can share them): the pair is placed as one value living as long as both, and nothing is copied.

#include "memory_plan.h"

#include <algorithm>
#include <limits>
#include <numeric>
#include <vector>

#include "ctxgen/error.h"

namespace ctxgen::refc {
namespace {

struct Lifetime {
  size_t first = std::numeric_limits<size_t>::max();  // op that writes the value
  size_t last = 0;                                     // last op that reads it (or first)
  bool overlaps(const Lifetime& o) const { return first <= o.last && o.first <= last; }
};

uint64_t aligned(uint64_t bytes) { return (bytes + kArenaAlignment - 1) / kArenaAlignment * kArenaAlignment; }

std::vector<Lifetime> lifetimes(const ref::Program& program) {
  std::vector<Lifetime> life(program.values.size());
  for (size_t op = 0; op < program.ops.size(); ++op) {
    for (int32_t v : program.ops[op].outputs) {
      auto& l = life[static_cast<size_t>(v)];
      l.first = std::min(l.first, op);
      l.last = std::max(l.last, op);
    }
    for (int32_t v : program.ops[op].inputs)
      if (v >= 0) life[static_cast<size_t>(v)].last = std::max(life[static_cast<size_t>(v)].last, op);
  }
  for (size_t v = 0; v < program.values.size(); ++v)
    if (program.values[v].kind == ref::ValueKind::kArena && life[v].first > life[v].last)
      throw Error(ErrorCode::kInternal, "ref memory plan: arena value " + std::to_string(v) + " is read but never written");
  return life;
}

struct Placed {
  uint64_t offset, size;
  size_t value;
};

// Smallest gap between `busy` blocks (sorted by offset) that holds `size`; the end when none does.
uint64_t best_fit(const std::vector<Placed>& busy, uint64_t size) {
  uint64_t best = std::numeric_limits<uint64_t>::max(), best_gap = best, end = 0;
  for (const auto& b : busy) {
    if (b.offset >= end && b.offset - end >= size && b.offset - end < best_gap) {
      best = end;
      best_gap = b.offset - end;
    }
    end = std::max(end, b.offset + b.size);
  }
  return best_gap == std::numeric_limits<uint64_t>::max() ? end : best;
}

}  // namespace

// The value whose bytes v shares (itself when none): Reshapes of arena values joined in chains.
std::vector<size_t> shared_bytes(const ref::Program& program) {
  std::vector<size_t> root(program.values.size());
  std::iota(root.begin(), root.end(), size_t{0});
  const auto arena = [&](int32_t v) { return v >= 0 && program.values[static_cast<size_t>(v)].kind == ref::ValueKind::kArena; };
  for (const ref::Op& op : program.ops)
    if (op.type == "Reshape" && arena(op.inputs[0]) && arena(op.outputs[0]))
      root[static_cast<size_t>(op.outputs[0])] = root[static_cast<size_t>(op.inputs[0])];  // written after its input
  return root;
}

void plan_memory(ref::Program& program) {
  auto life = lifetimes(program);
  const std::vector<size_t> root = shared_bytes(program);
  for (size_t v = 0; v < program.values.size(); ++v) {
    if (root[v] == v) continue;
    Lifetime& r = life[root[v]];
    r.first = std::min(r.first, life[v].first);
    r.last = std::max(r.last, life[v].last);
  }
  std::vector<size_t> order;
  for (size_t v = 0; v < program.values.size(); ++v)
    if (program.values[v].kind == ref::ValueKind::kArena && root[v] == v) order.push_back(v);
  // Largest first; ties by first use then id keep the plan deterministic.
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    uint64_t sa = aligned(program.values[a].byte_size()), sb = aligned(program.values[b].byte_size());
    if (sa != sb) return sa > sb;
    return life[a].first < life[b].first;
  });
  std::vector<Placed> placed;  // sorted by offset
  uint64_t high_water = 0;
  for (size_t v : order) {
    uint64_t size = aligned(program.values[v].byte_size());
    std::vector<Placed> busy;
    for (const auto& p : placed)
      if (life[p.value].overlaps(life[v])) busy.push_back(p);
    uint64_t offset = best_fit(busy, size);
    program.values[v].index = offset;
    Placed p{offset, size, v};
    placed.insert(std::upper_bound(placed.begin(), placed.end(), p,
                                   [](const Placed& a, const Placed& b) { return a.offset < b.offset; }),
                  p);
    high_water = std::max(high_water, offset + size);
  }
  for (size_t v = 0; v < program.values.size(); ++v)
    if (root[v] != v) program.values[v].index = program.values[root[v]].index;
  program.arena_bytes = high_water;
}

}  // namespace ctxgen::refc

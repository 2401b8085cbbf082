#pragma once
// What the kernels share of oneDNN: one CPU engine, a stream per thread, the guard that keeps
// oneDNN on the calling thread, and the CPU feature level its packed layouts are made for.

#include <string>
#include <vector>

#include <oneapi/dnnl/dnnl.hpp>

#include "ctxgen/backend_runtime.h"

namespace ctxgen::runtime::onednn {

const dnnl::engine& engine();
// oneDNN streams are not to be shared between threads running at once.
dnnl::stream& stream();

// oneDNN runs on the calling thread alone while this lives: the threads are the caller's (ONNX
// Runtime's intra-op pool lends them through ParallelFor), not OpenMP's. Primitives are created
// under it too, since some fix their thread decomposition when created.
class OneThread {
 public:
  OneThread();
  ~OneThread();
  OneThread(const OneThread&) = delete;
  OneThread& operator=(const OneThread&) = delete;

 private:
  int before_;
};

// Runs a primitive through oneDNN's C API (the C++ one copies the arguments into a map and a
// vector on every call) on this thread's stream, and waits for it.
void execute(const dnnl::primitive& primitive, const dnnl_exec_arg_t* args, int count);
void reorder(const dnnl::reorder& primitive, const dnnl::memory& from, const dnnl::memory& to);

// oneDNN's memory objects around a kernel's buffers, kept from one run to the next: making one
// allocates (4 or 5 a packed Conv's piece on every run were ~7% of the exported CNN's time on one
// thread), while the buffers (arena, weights, scratch) stay put from run to run of a run state. A
// buffer that moves (ONNX Runtime's output, say) gets a new object. Slots used at once by pieces
// running at once must differ.
class MemorySlots {
 public:
  explicit MemorySlots(size_t slots) : slots_(slots) {}
  const dnnl::memory& at(size_t slot, const dnnl::memory::desc& desc, const void* data);

 private:
  std::vector<std::pair<const void*, dnnl::memory>> slots_;
};

// How many plans of primitives the process keeps (kept.h): each holds its primitives' code
// (~0.12 MB a packed Conv's), so the 256 most recently used, and none when the host turned oneDNN's
// own primitive cache off (ONEDNN_PRIMITIVE_CACHE_CAPACITY=0) to keep memory down.
size_t kept_plans();
// Counts the plans made (runtime.h, conv_plans_made()).
void plan_made();
uint64_t plans_made();

// Whether oneDNN's 8-bit convolutions sum exactly on this CPU: with VNNI's int32 dot products.
// Without it, oneDNN 2.6 halves int8 weights (for a signed image) or saturates 16-bit pair sums (for
// an unsigned one).
bool exact_int8_convolution();

// The CPU feature level oneDNN chooses its kernels and weight layouts by, with its version:
// "x86_64 avx2, oneDNN 2.6.3". Weights packed on one level are laid out for it alone.
std::string architecture();
// Throws Error(kUsage) unless `level` is one of oneDNN's names (e.g. "avx2") that this process's
// level includes.
void check_level(const std::string& level);
// Makes oneDNN choose kernels and layouts for `level`, as on a CPU of that level, for the rest of
// the process: only the CPU-level helper does this (CpuTarget), before anything else asks oneDNN
// about the CPU. Throws Error(kUsage) for an unknown level or one this CPU lacks.
void target_level(const std::string& level);
// The level oneDNN lays weights out for in this process, e.g. "avx2".
std::string level();
// Whether that level has AVX-512 (avx512_core or above): the runtime's own AVX-512 kernels run
// only where oneDNN's would.
bool avx512();
// Whether it has AVX2 and FMA (avx2 or above).
bool avx2();
// The levels target_level knows, lowest first.
std::vector<std::string> known_levels();
// The levels this CPU runs ("sse41, avx, avx2, ..."), for messages.
std::string levels_below();
// Whether this CPU runs weights packed for the `recorded` architecture: its own level is optimal,
// one whose instructions it has runs, any other (or another oneDNN version) does not.
Judgement judge_architecture(const std::string& recorded);

}  // namespace ctxgen::runtime::onednn

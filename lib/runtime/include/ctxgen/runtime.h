#pragma once
// Executes `ref` programs on CPU (no ONNX or ONNX Runtime dependency): the runtime half of the
// reference backend, used by the ONNX Runtime plugin EP and by tests.

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ctxgen/backend_runtime.h"
#include "ctxgen/error.h"
#include "ctxgen/format.h"
#include "ctxgen/ref_program.h"

namespace ctxgen::runtime {

// Weight bytes by weight id.
using WeightLookup = std::function<const uint8_t*(uint32_t weight_id)>;
using ctxgen::ParallelFor;

// Checks that every op, attribute, value and id in `program` is one the runtime can execute and
// that every buffer fits its dims. Throws Error(kInvalidBinary) saying which op or value is wrong.
void validate(const ref::Program& program, size_t weight_count);

// The element type and dims of `op`'s output for inputs of these types (nullptr = absent optional
// input): the rule validate() checks programs with, and the compiler builds them with. Throws
// Error(kInvalidBinary) "<label>: <what is wrong>" when the op, its attributes or inputs are invalid.
ref::Value infer_output(const ref::Op& op, const std::vector<const ref::Value*>& inputs, const std::string& label);

struct Plans;     // what a program's ops resolved before their first run (lib/runtime/execute.cc)
struct RunState;  // a run's arena and bound buffers (lib/runtime/execute.cc)

// A validated program made ready to run: each op's kernel and typed parameters resolved, every
// weight looked up, once. Each run binds only the caller's buffers: the arenas and bound buffers
// of finished runs are kept for the next, so a run allocates nothing. One instance may run from
// several threads at once, each run with its own arena.
class PreparedProgram {
 public:
  // Throws Error(kInvalidBinary) when an op cannot run on this CPU, Error(kRuntime) when `weights`
  // has no bytes for a weight the program reads.
  // `name` labels its ops' times with CTXGEN_PROFILE (the graph's name in its context binary).
  PreparedProgram(ref::Program program, const WeightLookup& weights);
  PreparedProgram(std::shared_ptr<const ref::Program> program, const WeightLookup& weights, std::string name = {});
  ~PreparedProgram();

  const ref::Program& program() const { return *program_; }
  // inputs[i] / outputs[i] point at dense buffers of the program's input and output sizes.
  void run(const std::vector<const void*>& inputs, const std::vector<void*>& outputs,
           const ParallelFor& parallel = {}) const;

 private:
  std::shared_ptr<const ref::Program> program_;
  std::string name_;
  std::unique_ptr<const Plans> plans_;
  mutable std::mutex states_mutex_;
  mutable std::vector<std::unique_ptr<RunState>> states_;  // one per run that was in flight at once
};

// How many programs Executables of this process have read and validated: one read before, byte
// for byte, with as many weights in its binary, is kept for the process and not read again.
uint64_t programs_validated();

// Prepares a validated program and runs it once.
void execute(const ref::Program& program, const WeightLookup& weights, const std::vector<const void*>& inputs,
             const std::vector<void*>& outputs, const ParallelFor& parallel = {});

// One graph of a context binary, ready to run. Weights are used in place from the binary, which
// the executable keeps alive. Runs as a PreparedProgram does.
class Executable final : public GraphRunner {
 public:
  // Throws Error(kInvalidBinary) when the graph is missing or its program is malformed or uses
  // an op or weight the runtime does not know.
  Executable(std::shared_ptr<const ContextBinary> binary, const std::string& graph_name);

  const GraphRecord& graph() const override { return *graph_; }
  const ref::Program& program() const { return prepared_->program(); }

  // inputs[i] / outputs[i] point at dense buffers of the sizes in the graph signature.
  void run(const std::vector<const void*>& inputs, const std::vector<void*>& outputs,
           const ParallelFor& parallel = {}) const override;

 private:
  std::shared_ptr<const ContextBinary> binary_;
  const GraphRecord* graph_ = nullptr;
  std::unique_ptr<PreparedProgram> prepared_;
};

// The CPU this runtime runs on, as far as weight layouts are concerned: the feature level its
// kernel library (oneDNN) lays packed weights out for, and the library's version ("x86_64 avx2,
// oneDNN 2.6.3"). The `ref` backend's binaries carry it as their hardware architecture: weights
// packed for one level are refused on another.
std::string hardware_architecture();
// The CPU levels a compile can target (oneDNN's names), lowest first (oneDNN's order; avx2_vnni
// comes between avx2 and avx512_core though neither includes the other).
std::vector<std::string> cpu_levels();
// The level this process runs at (this CPU's, or lower under ONEDNN_MAX_CPU_ISA): one of cpu_levels().
std::string cpu_level();

// The CPU level one compile lays weights out for (--target-cpu), held by that compile alone: the
// process's own level never changes, so compiles for several levels run one after another or at
// once. oneDNN decides a layout by the level its process runs at, so another level's decisions
// are asked of a helper process running at it (ctxgen-cpu-level, cpu_target.cc); what only
// depends on the recorded layout (pack_conv_weight) needs no helper.
// What a CpuTarget throws when it cannot answer at all (its helper is missing, of another
// version, died, or stopped answering): the compile fails with it, instead of taking it for a
// convolution oneDNN cannot run at that level.
struct CpuTargetFailure : Error {
  using Error::Error;
};

class CpuTarget {
 public:
  // `level` empty: this process's level. Throws Error(kUsage) for an unknown level or one this
  // CPU's does not include, Error(kInternal) when the helper cannot be found.
  static std::shared_ptr<const CpuTarget> of(const std::string& level);
  virtual ~CpuTarget() = default;
  virtual std::string level() const = 0;
  // hardware_architecture() and runs_qlinear_conv(), conv_weight_layout() and
  // conv_runs_channels_last() below, as a process at this level answers them.
  virtual std::string architecture() const = 0;
  virtual bool exact_int8() const = 0;
  virtual std::vector<int64_t> conv_weight_layout(const ref::Op& op, const std::vector<int64_t>& x, const std::vector<int64_t>& w,
                                                  const std::vector<int64_t>& y, bool bias) const = 0;
  virtual bool conv_runs_channels_last(const ref::Op& op, const std::vector<int64_t>& x, const std::vector<int64_t>& w,
                                       const std::vector<int64_t>& y, bool bias) const = 0;
};
// The helper's whole life: sets this process to `level` and answers a CpuTarget's questions read
// from the socket `fd` until it closes. Returns the exit status.
int serve_cpu_level(const std::string& level, int fd);
// Whether this CPU runs QLinearConv (kernels_qconv.cc): its int8 convolutions must sum exactly.
bool runs_qlinear_conv();

// The identity of the `ref` backend's binaries on this machine: what its compiler writes and its
// runtime runs (ref_identity.h, and this CPU's hardware_architecture()).
BinaryIdentity ref_identity();
// The `ref` backend's runtime, for the hosts that run binaries (ctxgen/backend_runtime.h).
std::unique_ptr<BackendRuntime> make_ref_runtime();

// The layout oneDNN's convolution `op` (with attributes packed = 1 and weight_shape) wants its
// weight in on this CPU, for input dims `x` and output dims `y`: what the `ref` compiler records
// as the op's attribute weight_layout (docs/ref-program-format.md). Throws Error(kInternal) when
// oneDNN cannot run that convolution.
std::vector<int64_t> conv_weight_layout(const ref::Op& op, const std::vector<int64_t>& x, const std::vector<int64_t>& w,
                                        const std::vector<int64_t>& y, bool bias);
// A Conv weight [M, C/group, k...] (row-major float32, at any alignment) in the layout `op`
// records (weight_layout): what the `ref` compiler stores in place of the weight.
MadeBytes pack_conv_weight(const ref::Op& op, const uint8_t* weight);
// The size in bytes of what pack_conv_weight makes, learnt without packing.
uint64_t packed_conv_weight_bytes(const ref::Op& op);
// Does oneDNN run that 2-D convolution channels last as fast as in the layout it prefers here?
// Then the compiler gives it channels_last = 1 before packing its weight: its rows are
// contiguous, so the runtime cuts it into bands of rows for the caller's threads, and it reads and
// writes channels-last images (src_channels_last, dst_channels_last) without reordering them.
bool conv_runs_channels_last(const ref::Op& op, const std::vector<int64_t>& x, const std::vector<int64_t>& w,
                             const std::vector<int64_t>& y, bool bias);
// How many convolutions this process has planned (their oneDNN primitives made: packed Convs,
// QLinearConvs, ConvIntegers): a plan is kept for the process and shared by every later op with
// the same attributes and operand types and dims.
uint64_t conv_plans_made();

// The float32 matrix [rows, cols] at `from` (any alignment) as [cols, rows]: a MatMul weight as
// the `ref` compiler stores it. Runs on all of oneDNN's threads.
MadeBytes transpose_matrix(const uint8_t* from, size_t rows, size_t cols);
// A product's float32 B, stored [K, N] (or [N, K] when `nk`) at `from` (any alignment), laid out in
// panels of 32 columns as MatMul and Gemm read it with the attribute `panels`
// (docs/ref-program-format.md).
MadeBytes panels_of(const uint8_t* from, size_t k, size_t n, bool nk);

// IEEE half precision and bfloat16, as their bits: float to either rounds to nearest even (NaN
// stays NaN, values beyond the largest finite give infinity), either to float is exact.
uint16_t half_of(float value);
float float_of_half(uint16_t bits);
uint16_t bfloat16_of(float value);
float float_of_bfloat16(uint16_t bits);
// The same conversions over arrays, by the CPU's F16C instructions where it has them.
void halves_of(const float* from, uint16_t* to, int64_t count);
void floats_of_halves(const uint16_t* from, float* to, int64_t count);

// False for ops whose output depends on their inputs' dims only (Shape, Size).
bool reads_input_data(const std::string& op_type);

// Names of the ops the runtime can execute (the `ref` op set).
std::vector<std::string> supported_ops();

}  // namespace ctxgen::runtime

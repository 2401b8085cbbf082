#pragma once
// Proof that compiled models work: ONNX Runtime runs the original on its CPU EP and the compiled
// model through the ctxgen plugin EP, and the outputs are compared. Built only with an ONNX Runtime
// tree (CTXGEN_ORT_ROOT).

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <onnxruntime_cxx_api.h>

#include "ctxgen/backend_runtime.h"

namespace ctxgen::verify {

// ONNX Runtime with a backend's plugin EP library registered: the EP named by `identity`, whose
// binaries it runs.
class OrtHost {
 public:
  // Throws Error(kRuntime) when the plugin cannot be loaded or offers no device for that EP.
  OrtHost(const std::filesystem::path& plugin, BinaryIdentity identity,
          OrtLoggingLevel log_level = ORT_LOGGING_LEVEL_ERROR);
  const BinaryIdentity& identity() const { return identity_; }
  // threads: the session's intra-op threads (0: ONNX Runtime's default, one per physical core).
  Ort::Session cpu_session(const std::filesystem::path& model, int threads = 0);
  // A model held in memory whose external data all lives in one in-memory file, `weights_name`.
  Ort::Session cpu_session(const std::string& model, const std::string& weights_name, std::vector<char>& weights);
  // `config`: session config entries on top of the plugin EP's (ep.share_ep_contexts=1, say).
  Ort::Session plugin_session(const std::filesystem::path& model, const std::map<std::string, std::string>& config = {},
                              int threads = 0);

 private:
  BinaryIdentity identity_;
  Ort::Env env_;
  Ort::SessionOptions plugin_options_;
};

// The plugin EP beside the running program (lib/ next to bin/), or the one the environment variable
// CTXGEN_ORT_EP names.
std::filesystem::path default_plugin();

// A dense tensor held as bytes.
struct Tensor {
  ONNXTensorElementDataType type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  std::vector<int64_t> dims;
  std::vector<uint8_t> bytes;

  static Tensor from(const Ort::Value& value);
  // A view for ONNX Runtime; the tensor must outlive it.
  Ort::Value view() const;
};

// A tensor of seeded random values, as verify feeds them (float: uniform in [-1, 1]; float16 and
// bfloat16: multiples of 1/128 there; integers 0..2; bools 0 or 1). Error(kUsage) naming input
// `name` for a type that is not a number.
Tensor random_tensor(ONNXTensorElementDataType type, const std::vector<int64_t>& dims, const std::string& name,
                     std::mt19937_64& rng);

// The inputs `compiled` (a _ctx.onnx) was compiled for one value of (--fix-value), by name, as
// tensors of the types `session` (on it or its original) declares for them: what a run must feed.
std::map<std::string, Tensor> fixed_feeds(const std::filesystem::path& compiled, Ort::Session& session);

// How to read one element of a numeric tensor; `exact` types must match bit for bit.
struct ElementKind {
  size_t size;
  double (*read)(const uint8_t*);
  bool exact;
};
// Empty for types that are not numbers (strings, complex, 4-bit types).
std::optional<ElementKind> element_kind(ONNXTensorElementDataType type);

// Which number the tolerance applies to (docs/verify.md): every element, or a statistic of the
// errors over the whole output.
enum class ErrorStat { kElementwise, kMax, kMean, kMedian, kP99 };
const char* error_stat_name(ErrorStat stat);
std::optional<ErrorStat> error_stat_named(const std::string& name);

struct Tolerance {
  double rtol = 1e-3;
  // Unset: rtol times the output's largest expected magnitude. Float32 rounding error in a value
  // comes from the magnitudes summed into it, not from the value, so a fixed atol is too tight
  // for large outputs and too loose for small ones (docs/verify.md has the measurements).
  std::optional<double> atol;
  ErrorStat stat = ErrorStat::kElementwise;
  std::optional<double> min_cosine, min_snr_db;  // further criteria, off unless given
  // With a float64 reference: the most the compiled model's rms error may be, as a multiple of
  // the original's own float32 rms error. Rounding differently stays within a small factor; a
  // kernel that computes something else does not, even when it is within the tolerance.
  double max_error_ratio = 4;
  // A quantized output (one a DequantizeLinear gives, or the integers of a QuantizeLinear) holds
  // only multiples of its step: each element may be `max_steps` of them off, or as far as a float
  // output may (atol), whichever is more. Two correct implementations round a value that falls
  // near the midpoint of two steps to either side (docs/verify.md).
  std::optional<double> step;
  double max_steps = 1;
};

// The errors of one output as a distribution, so float32 rounding (small errors spread over every
// element) can be told from a wrong kernel (large errors, low cosine and SNR).
struct ErrorSummary {
  double max = 0, mean = 0, median = 0, p99 = 0;
  double of(ErrorStat stat) const;
};

struct Difference {
  std::vector<int64_t> dims;  // of the expected output
  uint64_t elements = 0;
  double reference_max_abs = 0, reference_rms = 0;  // how large the expected values are
  double error_rms = 0;
  ErrorSummary abs;  // |got - expected|
  ErrorSummary rel;  // |got - expected| / |expected|, over the elements whose expected value is not 0
  double atol = 0;     // the one applied
  double step = 0;     // of a quantized output, 0 for others; abs.max / step is its largest error in steps
  double outside = 0;  // fraction of elements with |got - expected| > atol + rtol * |expected|
  // Of got and expected as vectors; 1 when both are all zeros, NaN when an element is NaN or
  // infinite on one side only.
  double cosine = 1;
  double snr_db = INFINITY;  // 10 log10(sum expected^2 / sum (got - expected)^2); infinite when equal
  bool within = true;
  std::string failed;   // the criterion that failed, in words
  std::string problem;  // set when the tensors cannot be compared (type or shape differ)
};

// Compares got with expected, of the same type and shape: floating-point types (float16 and
// bfloat16 too) by value, NaN matching NaN; integers and bools must be equal. The tolerance
// decides `within`.
Difference compare(const Tensor& got, const Tensor& expected, const Tolerance& tolerance);

struct Result;

// What the original runs in on ONNX Runtime's CPU EP for the comparison. kFloat64 runs every float
// tensor in float64 where ONNX Runtime has a float64 kernel for the node (the rest stay float32,
// named in the result), and also measures the original's own float32 error against it.
enum class Precision { kFloat32, kFloat64 };

struct Options {
  std::vector<std::filesystem::path> models;      // compiled (_ctx.onnx)
  std::vector<std::filesystem::path> references;  // originals, one per model, or none
  Tolerance tolerance;
  Precision reference_precision = Precision::kFloat32;
  uint64_t seed = 1;
  std::map<std::string, std::vector<int64_t>> input_shapes;
  std::filesystem::path plugin;
  // A model in which nothing is compiled (no EPContext node of the backend) passes; otherwise it
  // fails: it would pass every check while running nothing on the backend.
  bool allow_empty = false;
  // The runtime of the backend the models were compiled for; verify expects its identity in every
  // binary and EPContext node, and runs the models through the plugin EP of that name.
  std::shared_ptr<const BackendRuntime> runtime;
  // Called before each step that loads or runs a model ("running decoder.onnx on ONNX Runtime's
  // CPU EP"), so a crash inside ONNX Runtime can be reported with what it was doing.
  std::function<void(const std::string&)> step;
  // Called after each model with what was found for it (checks passed, outputs compared), so
  // results can be shown as they are known; run() returns them all again at the end.
  std::function<void(const Result&)> model_checked;
};

struct OutputCheck {
  std::filesystem::path model;
  std::string output;
  Difference difference;  // the compiled model against the reference
  // What the reference ran in: "float32", "float64", or float64 with the op types kept in float32.
  std::string reference;
  // With a float64 reference: the original on the CPU EP in float32 against it, the error float32
  // rounding alone makes, and the compiled model's rms error as a multiple of it (of 2^-20 of the
  // output's rms when that is larger).
  std::optional<Difference> baseline;
  std::optional<double> error_ratio;
};

struct Result {
  std::vector<std::string> checks;  // integrity checks that passed, one line each
  std::vector<OutputCheck> outputs;
  bool ok() const;
};

// Integrity of every model (files present, binaries valid, weights re-hashed, identity and graphs
// matching, loads in ONNX Runtime); with references, also outputs on the same seeded inputs.
// Throws Error(kMismatch) for a failed integrity check, Error(kRuntime) when ONNX Runtime fails.
Result run(const Options& options);
// run() in a child process, so a crash inside ONNX Runtime (its CPU EP divides without checking
// in some integer kernels) is an Error(kRuntime) naming the signal and the step it happened in,
// not a crash of ctxgen. Forks: call it from a single-threaded process (the CLI does).
Result run_isolated(const Options& options);

}  // namespace ctxgen::verify

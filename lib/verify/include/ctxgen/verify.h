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
#include <string>
#include <vector>

#include <onnxruntime_cxx_api.h>

namespace ctxgen::verify {

// ONNX Runtime with the ctxgen plugin EP library registered.
class OrtHost {
 public:
  // Throws Error(kRuntime) when the plugin cannot be loaded or offers no device.
  explicit OrtHost(const std::filesystem::path& plugin, OrtLoggingLevel log_level = ORT_LOGGING_LEVEL_ERROR);
  Ort::Session cpu_session(const std::filesystem::path& model);
  Ort::Session plugin_session(const std::filesystem::path& model);

 private:
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
  Ort::Value view();
};

// How to read one element of a numeric tensor; `exact` types must match bit for bit.
struct ElementKind {
  size_t size;
  double (*read)(const uint8_t*);
  bool exact;
};
// Empty for types that are not numbers (strings, complex, 4-bit types).
std::optional<ElementKind> element_kind(ONNXTensorElementDataType type);

struct Difference {
  double max_abs = 0, max_rel = 0;
  bool within = true;
  std::string problem;  // set when the tensors cannot be compared (type or shape differ)
};

// Elementwise |got - expected| <= atol + rtol * |expected| for floating-point types (float16 and
// bfloat16 too); NaN matches NaN. Integers and bools must be equal.
Difference compare(const Tensor& got, const Tensor& expected, double rtol, double atol);

struct Result;

struct Options {
  std::vector<std::filesystem::path> models;      // compiled (_ctx.onnx)
  std::vector<std::filesystem::path> references;  // originals, one per model, or none
  double rtol = 1e-4, atol = 1e-5;
  uint64_t seed = 1;
  std::map<std::string, std::vector<int64_t>> input_shapes;
  std::filesystem::path plugin;
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
  Difference difference;
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

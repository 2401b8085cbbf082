#pragma once
// The program format of the `ref` backend: what its compiler (lib/backend/ref) emits and its
// runtime (lib/runtime) executes. It has no ONNX dependency so the runtime can ship alone.
//
// A program is a list of ops over values with fully static shapes. Ops keep ONNX names and ONNX
// semantics, normalised by the compiler so kernels never resolve anything at run time: every
// attribute is explicit (defaults filled, negative axes made non-negative, auto_pad turned into
// explicit `pads`), and constant inputs ONNX passes as tensors are attributes (Reshape `shape`,
// Slice `starts`/`steps`/`sizes`, reduction `axes`, Clip `min`/`max`, Expand `shape`, Tile
// `repeats`, Pad `pads`/`value`, Resize `scales`/`sizes` ...). Each op has exactly one output.
//
// Each op's inputs, element types, attributes and the output type they imply are defined once, by
// its rule in lib/runtime/ops.cc; docs/ref-program-format.md describes every op, its attribute
// codes (Resize `coord`/`nearest_mode`, Pad `mode`, the fused `act` of Conv/Gemm/MatMul) and the
// byte encoding. float32 is the compute type; int32, int64 and bool carry indices, positions,
// masks and shape arithmetic; the 8- and 16-bit integers carry quantized values, converted from
// and to float32 by QuantizeLinear and DequantizeLinear with their scales and zero points.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "ctxgen/limits.h"

namespace ctxgen::ref {

// ONNX TensorProto codes. float32 is the compute type; int32, int64 and bool carry indices,
// positions, masks and the shape arithmetic of exported models; the 8- and 16-bit integers carry
// quantized values and float16 and bfloat16 half-precision ones (data-movement ops pass them
// through unchanged, Cast converts them).
enum class DType : uint8_t {
  kFloat32 = 1, kUInt8 = 2, kInt8 = 3, kUInt16 = 4, kInt16 = 5, kInt32 = 6, kInt64 = 7, kBool = 9, kFloat16 = 10,
  kBFloat16 = 16,
};

// Limits every program respects, so no size or offset arithmetic can overflow: a value holds at
// most 2^48 elements; window attributes (kernel, stride, pad, dilation) are below 2^31.
// The arena holds at most the sum of its values' (64-byte aligned) sizes.
inline constexpr int64_t kMaxElements = ctxgen::kMaxElements;
inline constexpr int64_t kMaxWindow = (int64_t{1} << 31) - 1;
// A value holds at most 64 GiB: beyond that no machine a session runs on allocates it, so the
// compiler leaves such nodes on CPU instead of writing a program that fails at run time.
inline constexpr uint64_t kMaxValueBytes = uint64_t{1} << 36;
// A program performs at most this many element operations per run (an upper bound each kernel
// respects, see validate()), so no program, however crafted, keeps a session busy for days: 2^48
// is some hours of one core, more than an 8B-parameter LLM prefill of 4096 tokens (~2^45).
inline constexpr uint64_t kMaxWork = uint64_t{1} << 48;

// Bytes per element, or 0 for a code that is not a DType.
size_t dtype_size(DType dtype);
std::string dtype_name(DType dtype);  // "float32", "uint8", ..., "bool", "float16", "bfloat16"
// float32, float16 or bfloat16: the types whose scalar attributes (Pad's value ...) are floats.
bool is_float(DType dtype);

enum class Activation : int64_t {
  kNone = 0, kRelu = 1, kLeakyRelu = 2, kSigmoid = 3, kTanh = 4, kClip = 5, kHardSigmoid = 6,
  kHardSwish = 7,
};

enum class ValueKind : uint8_t {
  kInput = 0,   // index = position among the graph inputs
  kOutput = 1,  // index = position among the graph outputs
  kWeight = 2,  // index = weight id in the context binary's weight table
  kArena = 3,   // index = byte offset in the intermediate arena (64-byte aligned)
};

struct Value {
  DType dtype = DType::kFloat32;
  std::vector<int64_t> dims;
  ValueKind kind = ValueKind::kArena;
  uint64_t index = 0;

  int64_t element_count() const;
  uint64_t byte_size() const;
};

struct Attr {
  enum class Kind : uint8_t { kInt = 0, kFloat = 1, kInts = 2, kFloats = 3 };
  std::string name;
  Kind kind = Kind::kInt;
  int64_t i = 0;
  float f = 0;
  std::vector<int64_t> ints;
  std::vector<float> floats;
};

Attr int_attr(const std::string& name, int64_t value);
Attr float_attr(const std::string& name, float value);
Attr ints_attr(const std::string& name, std::vector<int64_t> values);
Attr floats_attr(const std::string& name, std::vector<float> values);

struct Op {
  std::string type;  // ONNX op type, normalised as described above
  std::vector<Attr> attrs;
  std::vector<int32_t> inputs;   // value ids; -1 = optional input absent
  std::vector<int32_t> outputs;  // value ids

  const Attr* attr(const std::string& name) const;
  int64_t get_int(const std::string& name, int64_t fallback) const;
  float get_float(const std::string& name, float fallback) const;
  std::vector<int64_t> get_ints(const std::string& name) const;  // empty when absent
};

struct Program {
  std::vector<Value> values;
  std::vector<Op> ops;          // in execution order
  uint64_t arena_bytes = 0;     // size of the intermediate arena
  std::vector<int32_t> inputs;  // value id of each graph input, in order
  std::vector<int32_t> outputs; // value id of each graph output, in order
};

// Little-endian, versioned encoding; docs/ref-program-format.md describes it.
std::vector<uint8_t> serialize(const Program& program);
// Throws ctxgen::Error(kInvalidBinary) on any malformed or out-of-range field, saying which.
Program deserialize(const uint8_t* data, size_t size);

}  // namespace ctxgen::ref

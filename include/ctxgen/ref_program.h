#pragma once
// The program format of the `ref` backend: what its compiler (lib/backend/ref) emits and its
// runtime (lib/runtime) executes. It has no ONNX dependency so the runtime can ship alone.
//
// A program is a list of ops over values with fully static shapes. Ops keep ONNX names and ONNX
// semantics, normalised by the compiler so kernels never resolve anything at run time:
//  - every attribute is explicit (defaults filled, negative axes made non-negative, auto_pad turned
//    into explicit `pads`, Pool/Conv output dims already in the output value);
//  - constant inputs that ONNX passes as tensors are attributes: Reshape/Flatten/Squeeze/Unsqueeze/
//    Identity all become op "Reshape" with no attributes (a byte copy, output dims say the shape);
//    Clip `min`/`max` (floats, default -inf/+inf); ReduceMean/ReduceSum `axes` (sorted, empty =
//    all axes) and `keepdims`; Slice `starts` and `steps` given for every input axis, already
//    clamped, so out[i] = in[starts + i * steps] per axis;
//  - Softmax: `axis` (>= 0) and `coerce_2d` (1 for opset < 13 semantics: flatten to 2-D at axis);
//  - MatMul: numpy matmul with batch broadcasting; inputs of rank >= 2 (the compiler reshapes 1-D);
//  - Gemm: `transA`, `transB`, `alpha`, `beta`; a constant B is packed to [K, N] (transB = 0);
//    optional C broadcast to [M, N];
//  - Conv: N-D over NC[D]HW with `kernel_shape`, `strides`, `pads` (begins then ends),
//    `dilations`, `group`; optional bias; BatchNormalization that followed it is already folded in;
//  - MaxPool/AveragePool: `kernel_shape`, `strides`, `pads`, `dilations` (MaxPool),
//    `count_include_pad` (AveragePool); output dims already reflect ceil_mode;
//  - Conv, Gemm and MatMul may carry a fused activation: `act` (Activation below), `act_alpha`,
//    `act_beta` (LeakyRelu alpha; Clip min/max; HardSigmoid alpha/beta);
//  - LayerNormalization: `axis` (>= 0), `epsilon`; inputs X, Scale, optional B; one output;
//  - BatchNormalization (not folded): `epsilon`; inputs X, scale, B, mean, var;
//  - Concat/Gather/Transpose: `axis` (>= 0) / `axis` (>= 0, indices int64, may be negative) /
//    `perm` (explicit);
//  - elementwise binary ops broadcast numpy-style to the output dims.
// Data is float32, except Gather indices (int64).

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace ctxgen::ref {

// ONNX TensorProto codes. float32 is the compute type; the integer and bool types carry indices,
// positions, masks and the shape arithmetic of exported models.
enum class DType : uint8_t { kFloat32 = 1, kInt32 = 6, kInt64 = 7, kBool = 9 };

// Bytes per element, or 0 for a code that is not a DType.
size_t dtype_size(DType dtype);
std::string dtype_name(DType dtype);  // "float32", "int32", "int64", "bool"

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

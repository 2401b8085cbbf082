#pragma once
// Read access to one ONNX node for the ref backend's checks: attributes with defaults, input and
// output types that must be static, constant inputs. Every accessor refuses (throws Refusal with a
// reason a user can act on) instead of returning something the lowering cannot use.

#include <cstdint>
#include <string>
#include <vector>

#include <onnx/onnx_pb.h>

#include "ctxgen/model.h"
#include "ctxgen/ref_program.h"

namespace ctxgen::refc {

// One element of a tensor, exact: float32 as float, integers and bools as int64.
struct Scalar {
  bool is_float = false;
  float f = 0;
  int64_t i = 0;
};

// Why a node cannot run on ref. Internal to the backend: supports() turns it into NodeSupport.
struct Refusal {
  std::string reason;
};

[[noreturn]] void refuse(std::string reason);

extern const char* const kSupportedTypes;  // "ref supports float32, ...", for refusals

std::string dims_text(const std::vector<int64_t>& dims);  // "[1,3,?,?]" (-1 shown as ?)
std::string values_text(const std::vector<int64_t>& values);  // "[1,-1,0]": attribute and constant values

class NodeView {
 public:
  NodeView(const Model& model, const onnx::NodeProto& node);

  const std::string& op() const { return node_.op_type(); }
  const std::string& domain() const { return node_.domain(); }
  int64_t opset() const { return opset_; }  // of the default domain

  // Attributes; `fallback` when absent. A present attribute of the wrong kind is refused.
  bool has_attr(const std::string& name) const;
  int64_t int_attr(const std::string& name, int64_t fallback) const;
  float float_attr(const std::string& name, float fallback) const;
  std::string string_attr(const std::string& name, const std::string& fallback) const;
  std::vector<int64_t> ints_attr(const std::string& name, std::vector<int64_t> fallback) const;
  const onnx::TensorProto* tensor_attr(const std::string& name) const;  // nullptr when absent
  std::vector<float> floats_attr(const std::string& name) const;         // empty when absent

  // Inputs. Trailing empty names do not count; an empty name in the middle is an absent input.
  size_t input_count() const;
  bool has_input(size_t i) const;
  const std::string& input(size_t i) const;
  // A float32 input with a static, non-empty shape; returns its dims. After compute_in_float(), a
  // half-precision input counts as float32 (normalise_all then reads it through a Cast).
  std::vector<int64_t> float_input(size_t i) const;
  void compute_in_float() { narrow_as_float_ = true; }
  // An input of a ref element type (float32, the 8- and 16-bit integers, int32, int64, bool) with a
  // static, non-empty shape.
  ref::Value typed_input(size_t i) const;
  // Static dims and element type of an input, whatever the type.
  std::vector<int64_t> input_dims(size_t i) const;
  int32_t input_elem_type(size_t i) const;
  // The weight behind a constant input, or nullptr.
  const Weight* constant(size_t i) const;
  // An input that must be a constant integer tensor (int32 or int64), as values.
  std::vector<int64_t> const_ints(size_t i) const;
  // An input that must be a constant float32 tensor (or a half one, as float_input), as values.
  std::vector<float> const_floats(size_t i) const;
  // An input that must be a constant float32 scalar (one element; or a half one, as float_input).
  float const_float(size_t i) const;
  // An input that must be a constant scalar (one element of a float type, an integer type or bool).
  Scalar const_scalar(size_t i) const;

  // The single output the backend produces. Outputs after the first must be absent;
  // `extra_output_reason` says why when they are not.
  const std::string& single_output(const std::string& extra_output_reason) const;
  size_t output_count() const { return static_cast<size_t>(node_.output_size()); }
  const std::string& output(size_t i) const { return node_.output(static_cast<int>(i)); }
  std::string input_label(size_t i) const;  // "input 1 'w'", for refusals

 private:
  const onnx::AttributeProto* find_attr(const std::string& name) const;

  bool is_float(int32_t onnx_type) const;

  const Model& model_;
  const onnx::NodeProto& node_;
  int64_t opset_;
  bool narrow_as_float_ = false;
};

// float16 or bfloat16.
bool is_half(int32_t onnx_type);
// uint8, int8, uint16 or int16.
bool is_quantized(int32_t onnx_type);

// The ref element type of an ONNX one; refuses types ref does not hold. `what` names the value.
ref::DType ref_dtype(int32_t onnx_type, const std::string& what);

// The ref value a constant is in a program: of its own type and dims, except a 4-bit one (int4,
// uint4), which ref holds as its bytes, uint8 [(n + 1) / 2], read by ops that say how to unpack it.
ref::Value constant_value(const TensorData& t, const std::string& what);
// The ref value a node reads under `name`: a 4-bit constant's bytes (constant_value), else its
// static type (refused as static_dims and ref_dtype refuse). `label` names it in refusals.
ref::Value static_value(const Model& model, const std::string& name, const std::string& label);

// Static dims of a value (from shape inference or a constant); refuses unknown or dynamic ones,
// and zero-sized ones when `must_be_nonempty`. `label` names the value in the reason.
std::vector<int64_t> static_dims(const Model& model, const std::string& name, const std::string& label,
                                 bool must_be_nonempty);

// The one element of a numeric tensor (float32, int32, int64, bool), exactly, from its
// little-endian bytes or its TensorProto; refuses other types and other sizes.
Scalar scalar_of(int32_t dtype, const uint8_t* data, size_t size, const std::string& what);
Scalar scalar_value(const onnx::TensorProto& tensor, const std::string& what);

// Bounded so byte sizes derived from it cannot overflow; refuses beyond.
using ref::kMaxElements;
int64_t element_count(const std::vector<int64_t>& dims);

// Numpy broadcast of two shapes; refuses when they do not broadcast.
std::vector<int64_t> broadcast_dims(const std::vector<int64_t>& a, const std::vector<int64_t>& b);

// `axis` in [-rank, rank) made non-negative; refuses outside that range. `what` names it.
int64_t normalise_axis(int64_t axis, int64_t rank, const std::string& what);

}  // namespace ctxgen::refc

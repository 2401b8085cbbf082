#pragma once
// Read access to one ONNX node for the ref backend's checks: attributes with defaults, input and
// output types that must be static, constant inputs. Every accessor refuses (throws Refusal with a
// reason a user can act on) instead of returning something the lowering cannot use.

#include <cstdint>
#include <string>
#include <vector>

#include <onnx/onnx_pb.h>

#include "ctxgen/model.h"

namespace ctxgen::refc {

// Why a node cannot run on ref. Internal to the backend: supports() turns it into NodeSupport.
struct Refusal {
  std::string reason;
};

[[noreturn]] void refuse(std::string reason);

std::string dims_text(const std::vector<int64_t>& dims);  // "[1,3,?,?]" (-1 shown as ?)

class NodeView {
 public:
  NodeView(const Model& model, const onnx::NodeProto& node);

  const std::string& op() const { return node_.op_type(); }
  int64_t opset() const { return opset_; }

  // Attributes; `fallback` when absent. A present attribute of the wrong kind is refused.
  bool has_attr(const std::string& name) const;
  int64_t int_attr(const std::string& name, int64_t fallback) const;
  float float_attr(const std::string& name, float fallback) const;
  std::string string_attr(const std::string& name, const std::string& fallback) const;
  std::vector<int64_t> ints_attr(const std::string& name, std::vector<int64_t> fallback) const;

  // Inputs. Trailing empty names do not count; an empty name in the middle is an absent input.
  size_t input_count() const;
  bool has_input(size_t i) const;
  const std::string& input(size_t i) const;
  // A float32 input with a static, non-empty shape; returns its dims.
  std::vector<int64_t> float_input(size_t i) const;
  // Static dims and element type of an input, whatever the type.
  std::vector<int64_t> input_dims(size_t i) const;
  int32_t input_elem_type(size_t i) const;
  // The weight behind a constant input, or nullptr.
  const Weight* constant(size_t i) const;
  // An input that must be a constant integer tensor (int32 or int64), as values.
  std::vector<int64_t> const_ints(size_t i) const;
  // An input that must be a constant float32 scalar (one element).
  float const_float(size_t i) const;

  // The single output the backend produces, a float32 static non-empty tensor. Outputs after the
  // first must be absent; `extra_output_reason` says why when they are not.
  const std::string& single_output(const std::string& extra_output_reason) const;
  std::vector<int64_t> output_dims() const;  // dims of output 0

  // Refuses when `computed` differs from the inferred dims of output 0.
  void expect_output_dims(const std::vector<int64_t>& computed) const;
  // Refuses when output 0 does not hold as many elements as input `i` (shape-only ops).
  void expect_same_element_count(size_t i) const;

 private:
  const onnx::AttributeProto* find_attr(const std::string& name) const;
  std::string input_label(size_t i) const;
  std::vector<int64_t> static_dims(const std::string& label, const std::string& name, bool must_be_nonempty) const;

  const Model& model_;
  const onnx::NodeProto& node_;
  int64_t opset_;
};

// Bounded so byte sizes derived from it cannot overflow; refuses beyond.
inline constexpr int64_t kMaxElements = int64_t{1} << 48;
int64_t element_count(const std::vector<int64_t>& dims);

// Numpy broadcast of two shapes; refuses when they do not broadcast.
std::vector<int64_t> broadcast_dims(const std::vector<int64_t>& a, const std::vector<int64_t>& b);

// `axis` in [-rank, rank) made non-negative; refuses outside that range. `what` names it.
int64_t normalise_axis(int64_t axis, int64_t rank, const std::string& what);

}  // namespace ctxgen::refc

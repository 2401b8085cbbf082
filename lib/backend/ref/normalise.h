#pragma once
// One ONNX node in the normalised form of include/ctxgen/ref_program.h. A single function both
// decides support and produces the form, so every node supports() accepts is one compile() lowers.

#include <cstdint>
#include <string>
#include <vector>

#include <onnx/onnx_pb.h>

#include "ctxgen/model.h"
#include "ctxgen/ref_program.h"

namespace ctxgen::refc {

struct NormalisedNode {
  std::string type;             // ref op type
  std::vector<ref::Attr> attrs; // every attribute explicit
  std::vector<std::string> inputs;  // ONNX values the op reads at run time; "" = absent optional
  std::string output;           // the one output
  ref::Value output_type;       // dtype and dims, from the runtime's rule for the op
  bool internal = false;        // a value between the parts of one node, not an ONNX value
  bool computes_in_float = false;  // a Cast normalise added so the node computes in float32
};

// The ONNX element type of a value (typed by shape inference or a constant), 0 when unknown.
int32_t elem_type_of(const Model& model, const std::string& name);

// The normalised form: one ref op per output of the node (Split gives several), or throws
// Refusal saying why the node cannot run on ref.
std::vector<NormalisedNode> normalise_all(const Model& model, const onnx::NodeProto& node);
// The same for a node that must become exactly one ref op (refuses otherwise).
NormalisedNode normalise(const Model& model, const onnx::NodeProto& node);

// The ONNX op types normalise() may accept, sorted.
std::vector<std::string> supported_op_types();

using ref::float_attr;
using ref::int_attr;
using ref::floats_attr;
using ref::ints_attr;

// Op types an activation may be fused from, and its Activation code (kNone when it is none).
ref::Activation activation_of(const std::string& op_type);

}  // namespace ctxgen::refc

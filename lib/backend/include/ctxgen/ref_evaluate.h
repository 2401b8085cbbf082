#pragma once
// The ref backend as an evaluator of single ONNX nodes: the static type of a node's output from
// the op's one rule, and its value computed by the ref runtime's kernels. The specialise stage
// uses it to propagate shapes and fold constants with exactly the semantics ref compiles with.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <onnx/onnx_pb.h>

#include "ctxgen/model.h"

namespace ctxgen::ref {

struct Evaluated {
  std::vector<std::pair<std::string, ValueType>> types;  // static type of each output, by name
  // The value of each output, in the order of `types`, when every input the node reads is constant.
  std::optional<std::vector<std::vector<uint8_t>>> values;
};

// nullopt when ref does not take the node. The values are computed only when they and the values
// between the ref ops the node becomes are at most `max_bytes` long in all.
std::optional<Evaluated> evaluate(const Model& model, const onnx::NodeProto& node, uint64_t max_bytes);

}  // namespace ctxgen::ref

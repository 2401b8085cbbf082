// Single-node evaluation for the specialise stage: normalise the node as the compiler does, then
// run each ref op it becomes as a one-op program whose inputs are the constants' own bytes.

#include "ctxgen/ref_evaluate.h"

#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "ctxgen/error.h"
#include "ctxgen/runtime.h"
#include "node_view.h"
#include "normalise.h"

namespace ctxgen::ref {
namespace {

// Values computed for the earlier parts of a node, by name.
using Computed = std::unordered_map<std::string, std::pair<Value, std::vector<uint8_t>>>;

// The value of one part, or nullopt when an input it reads is computed at run time.
std::optional<std::vector<uint8_t>> evaluate_part(const Model& model, const refc::NormalisedNode& n,
                                                  const Computed& computed) {
  // An op that reads only dims (Shape, Size) gets a stand-in buffer its kernel never reads.
  static const uint8_t kUnread[8] = {};
  bool data_free = !runtime::reads_input_data(n.type);
  Program program;
  Op op;
  op.type = n.type;
  op.attrs = n.attrs;
  std::vector<const uint8_t*> weights;
  // Kernels read whole elements, and a weight viewed in a model file may sit at any offset: such
  // an input is copied, aligned, for the evaluation.
  std::vector<std::vector<uint8_t>> aligned;
  auto readable = [&aligned](const TensorData& t) -> const uint8_t* {
    if (reinterpret_cast<uintptr_t>(t.data) % alignof(std::max_align_t) == 0) return t.data;
    return aligned.emplace_back(t.data, t.data + t.size).data();
  };
  for (const auto& name : n.inputs) {
    if (name.empty()) {
      op.inputs.push_back(-1);
      continue;
    }
    Value v;
    if (auto it = computed.find(name); it != computed.end()) {
      v = it->second.first;
      weights.push_back(it->second.second.data());
    } else {
      const Weight* constant = model.constant(name);
      if (!constant && !data_free) return std::nullopt;
      v = refc::static_value(model, name, name);
      weights.push_back(constant ? readable(constant->data) : kUnread);
    }
    v.kind = ValueKind::kWeight;
    v.index = weights.size() - 1;
    op.inputs.push_back(static_cast<int32_t>(program.values.size()));
    program.values.push_back(std::move(v));
  }
  Value out = n.output_type;
  out.kind = ValueKind::kOutput;
  out.index = 0;
  op.outputs.push_back(static_cast<int32_t>(program.values.size()));
  program.outputs.push_back(op.outputs[0]);
  program.values.push_back(std::move(out));
  program.ops.push_back(std::move(op));

  std::vector<uint8_t> bytes(n.output_type.byte_size());
  runtime::validate(program, weights.size());
  runtime::execute(program, [&](uint32_t id) { return weights[id]; }, {}, {bytes.data()});
  return bytes;
}

}  // namespace

std::optional<Evaluated> evaluate(const Model& model, const onnx::NodeProto& node, uint64_t max_bytes) {
  std::vector<refc::NormalisedNode> parts;
  try {
    parts = refc::normalise_all(model, node);
  } catch (const refc::Refusal&) {
    return std::nullopt;
  }
  Evaluated result;
  uint64_t bytes = 0;
  for (const auto& part : parts) {
    bytes += part.output_type.byte_size();
    // A quantized weight stays integers in the binary, dequantized as the program runs, and a
    // float16 or bfloat16 one stays 16-bit, cast as the program runs: folding its DequantizeLinear
    // or Cast would store it as float32, two to four times its size. A few values (a Resize's
    // scales, a Pad's value) fold, so that the ops reading them see constants.
    constexpr int64_t kFewValues = 64;
    const bool widens_half = part.type == "Cast" && !part.internal && part.output_type.dtype == DType::kFloat32 &&
                             refc::is_half(refc::elem_type_of(model, part.inputs[0])) &&
                             part.output_type.element_count() > kFewValues;
    if (part.type == "DequantizeLinear" || widens_half) max_bytes = 0;
    if (part.internal) continue;
    ValueType type;
    type.elem_type = static_cast<int32_t>(part.output_type.dtype);
    type.dims = part.output_type.dims;
    result.types.emplace_back(part.output, type);
  }
  if (bytes > max_bytes) return result;

  // Each part in turn: a Split's slices read the node's input, an Einsum's product the parts
  // before it.
  Computed computed;
  for (const auto& part : parts) {
    auto value = evaluate_part(model, part, computed);
    if (!value) return result;
    computed[part.output] = {part.output_type, std::move(*value)};
  }
  result.values.emplace();
  for (const auto& [name, type] : result.types) result.values->push_back(std::move(computed.at(name).second));
  return result;
}

}  // namespace ctxgen::ref

#pragma once
// What a backend produces for one partition; shared by the compiler, the context-binary format
// and the runtime (no ONNX dependency).

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace ctxgen {

// Type and static shape of a partition input or output.
struct IoSignature {
  std::string name;       // the ONNX value name at the partition boundary
  int32_t elem_type = 0;  // onnx::TensorProto_DataType code
  std::vector<int64_t> dims;
  bool operator==(const IoSignature&) const = default;
};

// A partition input whose value was compiled in (--fix-value): the program does not read it,
// and the host that runs the graph refuses a run that feeds another value (or type, or shape).
struct FixedInput {
  IoSignature io;
  std::vector<uint8_t> value;  // the elements, little-endian; bool as one byte, 0 or 1
  bool operator==(const FixedInput&) const = default;
};

// The element size of the types a FixedInput holds (float, double, int32, int64, bool); 0 for others.
size_t fixed_element_size(int32_t elem_type);
// Up to eight of `count` values of such a type as text, e.g. "16000" or "[1, 0, 1, ...]".
std::string fixed_values_text(int32_t elem_type, const uint8_t* data, size_t count);

// One partition lowered to a backend program. The program is opaque to everything but the
// backend and its runtime; it refers to weights by their weight-table id.
struct CompiledGraph {
  std::string name;  // graph name in the context binary = EPContext node name = partition_name
  std::vector<IoSignature> inputs, outputs;
  std::vector<uint8_t> program;
  std::vector<uint32_t> weight_ids;  // weight ids the program uses, ascending
  size_t node_count = 0;             // ONNX nodes lowered into it (before fusion)
  std::vector<FixedInput> fixed_inputs;  // after `inputs` among the EPContext node's inputs
};

}  // namespace ctxgen

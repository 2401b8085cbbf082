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

// One partition lowered to a backend program. The program is opaque to everything but the
// backend and its runtime; it refers to weights by their weight-table id.
struct CompiledGraph {
  std::string name;  // graph name in the context binary = EPContext node name = partition_name
  std::vector<IoSignature> inputs, outputs;
  std::vector<uint8_t> program;
  std::vector<uint32_t> weight_ids;  // weight ids the program uses, ascending
  size_t node_count = 0;             // ONNX nodes lowered into it (before fusion)
};

}  // namespace ctxgen

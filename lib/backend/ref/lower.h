#pragma once
// Lowers one partition to a ref program: per-node normalisation, graph passes (BatchNormalization
// folding, activation fusion, MatMul/Gemm and Conv weight packing), weight interning and the
// static memory plan. Exposed here so tests can inspect the program before serialisation.

#include <cstdint>
#include <memory>
#include <vector>

#include "ctxgen/compiled.h"
#include "ctxgen/model.h"
#include "ctxgen/partition.h"
#include "ctxgen/ref_program.h"
#include "ctxgen/runtime.h"
#include "ctxgen/weights.h"

namespace ctxgen::refc {

struct LoweredPartition {
  ref::Program program;
  std::vector<IoSignature> inputs, outputs;
  std::vector<uint32_t> weight_ids;  // ascending, unique
};

// What one compile lowers for.
struct LowerTarget {
  // The CPU level whose layouts the weights take, and whose int8 convolutions decide QLinearConv.
  std::shared_ptr<const runtime::CpuTarget> cpu = runtime::CpuTarget::of("");
  // The weights the model stores in external data keep their layout (the binary will refer to
  // them there); those the runtime needs in another are laid out once a session.
  bool weightless = false;
};

// Throws Error(kInternal) when the partition holds a node supports() refuses or is inconsistent
// with the graph (a value read before it is produced, an output nothing produces).
LoweredPartition lower_partition(const Model& model, const Partition& partition, WeightStore& store,
                                 const LowerTarget& target = {});

}  // namespace ctxgen::refc

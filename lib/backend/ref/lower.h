#pragma once
// Lowers one partition to a ref program: per-node normalisation, graph passes (BatchNormalization
// folding, activation fusion, MatMul/Gemm and Conv weight packing), weight interning and the
// static memory plan. Exposed here so tests can inspect the program before serialisation.

#include <cstdint>
#include <vector>

#include "ctxgen/compiled.h"
#include "ctxgen/model.h"
#include "ctxgen/partition.h"
#include "ctxgen/ref_program.h"
#include "ctxgen/weights.h"

namespace ctxgen::refc {

struct LoweredPartition {
  ref::Program program;
  std::vector<IoSignature> inputs, outputs;
  std::vector<uint32_t> weight_ids;  // ascending, unique
};

// Throws Error(kInternal) when the partition holds a node supports() refuses or is inconsistent
// with the graph (a value read before it is produced, an output nothing produces).
// `weightless`: the weights the model stores in external data keep their layout (the binary will
// refer to them there); those the runtime needs in another are laid out once a session.
LoweredPartition lower_partition(const Model& model, const Partition& partition, WeightStore& store, bool weightless);

}  // namespace ctxgen::refc

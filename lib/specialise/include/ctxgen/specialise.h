#pragma once
// Stage 2, specialise: once load has frozen the dims, ctxgen computes the static type of every
// value it can (the ref op rules, the same ones it compiles with), folds every node whose output
// depends only on constants or only on static dims (Shape -> Gather -> Concat -> Reshape chains,
// ConstantOfShape, Range, masks ...) into a new constant evaluated by the ref runtime's kernels,
// and removes the nodes nothing reads any more. An If whose condition became constant (for example
// through --fix-value) is replaced by the nodes of the branch it takes. A backend then sees one static graph, as NPU
// toolchains hand theirs.

#include <cstdint>
#include <map>
#include <string>

#include "ctxgen/model.h"

namespace ctxgen {

struct SpecialiseOptions {
  uint64_t max_folded_bytes = uint64_t{64} << 20;         // larger results stay nodes, computed at run time
  uint64_t max_total_folded_bytes = uint64_t{256} << 20;  // past this, nothing more is folded
  // Keep every folded value's bytes, also when only other folded nodes read it: the plugin EP needs
  // them, since ONNX Runtime's graph still has the nodes that read them (they may leave a partition).
  bool keep_folded_values = false;
};

struct SpecialiseSummary {
  size_t folded_nodes = 0;   // replaced by constants
  size_t removed_nodes = 0;  // read by nothing after folding
  size_t typed_values = 0;   // values shape inference left without a static type, typed by ctxgen
  size_t inlined_branches = 0;  // If nodes with a constant condition replaced by the branch taken
  std::map<std::string, size_t> folded_by_op;
};

// Rewrites the main graph of `model` in place. Folded values become weights (origin kFolded) like
// any other, so a share deduplicates them across models.
SpecialiseSummary specialise(Model& model, const SpecialiseOptions& options = {});

}  // namespace ctxgen

#pragma once
// A session on an ordinary model (one without this EP's EPContext nodes): GetCapability runs
// ctxgen's load, specialise and partition stages on ORT's graph with the plugin's backend, claims
// each partition as one fused node, and keeps what it decided; Compile then lowers the partitions
// ORT fused with the backend's compiler, exactly as `ctxgen compile` would.

#include <onnxruntime_c_api.h>

#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "ctxgen/backend.h"
#include "ctxgen/compile_cache.h"
#include "ctxgen/model.h"
#include "ctxgen/partition.h"
#include "ctxgen/pipeline.h"

namespace ctxgen::ort_ep {

class OrdinaryGraph {
 public:
  // Throws Error when ctxgen cannot read the graph (the caller then claims nothing).
  // `external_views`: for a weightless binary (parse_ort_graph).
  OrdinaryGraph(const OrtGraph* graph, const Backend& backend, bool external_views = false);
  // The files the model's initializers are read from, which no output may replace.
  const std::set<std::filesystem::path>& external_files() const { return external_files_; }

  // The ORT nodes of each partition, to fuse into one node each; valid only during GetCapability.
  // Nodes the specialise stage folded into constants ride along with the partitions around them.
  const std::vector<std::vector<const OrtNode*>>& groups() const { return groups_; }
  // Why each node left out stays on CPU, one line per node, for ORT's log (folded nodes ORT keeps
  // because no partition reads them are not listed).
  const std::vector<std::string>& reasons() const { return reasons_; }
  size_t folded_nodes() const { return folded_; }
  // The symbolic dims the graph's inputs leave open: fixing them (ORT's free dimension overrides)
  // is what lets shape-dependent nodes compile.
  const std::vector<std::string>& open_dims() const { return open_dims_; }
  size_t node_count() const { return node_count_; }

  // The partition ORT fused into `fused` (a graph of one of groups()). Throws Error(kInternal)
  // when the fused graph is not one of them.
  size_t partition_of(const OrtGraph* fused) const;
  // That partition compiled under `name`, its weights read from `fused`. ORT lends its bytes for
  // the Compile call only: unless `copy_weights`, the binary must be written before it returns.
  // With `cache`, taken from it when it holds the partition, else compiled and kept there.
  CompiledGraph compile(const OrtGraph* fused, const std::string& name, WeightStore& store, bool copy_weights,
                        CompileCache* cache = nullptr);

 private:
  const Backend& backend_;
  Model model_;  // after specialisation
  std::set<std::filesystem::path> external_files_;

 public:
  const Model& model() const { return model_; }
  // The model and the constants its partitions read, for a weightless binary.
  WeightlessSource weightless_source() const;
  PartitionPlan plan_;
  std::vector<std::vector<const OrtNode*>> groups_;  // groups_[p] is plan_.partitions[p]
  std::unordered_map<std::string, size_t> partition_of_;  // first output of a claimed node -> partition
  std::vector<std::string> reasons_;
  std::vector<std::string> open_dims_;
  size_t folded_ = 0;
  size_t node_count_ = 0;
};

}  // namespace ctxgen::ort_ep

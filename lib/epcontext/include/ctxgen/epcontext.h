#pragma once
// Stage 5, the EPContext model (<model>_ctx.onnx): the original graph with each compiled partition
// replaced by one com.microsoft EPContext node, and the weights CPU nodes still need attached
// either inside the file or in one external data file.

#include <cstdint>
#include <string>
#include <vector>

#include <onnx/onnx_pb.h>

#include "ctxgen/compiled.h"
#include "ctxgen/format.h"
#include "ctxgen/model.h"
#include "ctxgen/partition.h"
#include "ctxgen/weights.h"

namespace ctxgen {

struct EpContextSettings {
  BinaryIdentity identity;  // the backend's: `source` is its EP name
  bool embed = false;
  // embed: the context binary's bytes; otherwise its path relative to the output model's folder.
  std::string cache_context;
  std::string producer_version;
  std::string content_id;  // hex; recorded under kContentIdMetadataKey
};

// The EPContext node that runs one compiled graph: the graph's inputs and outputs, and the
// attributes every ctxgen output carries (main_context, with ep_cache_context on the main node,
// embed_mode, the identity, partition_name, onnx_model_filename, notes).
onnx::NodeProto epcontext_node(const CompiledGraph& graph, bool main, const EpContextSettings& settings,
                               const std::string& model_filename);

// Builds the EPContext model. `graphs[i]` is the compiled form of `plan.partitions[i]`. Weights
// are still references (see kWeightRefKey); attach them with one of the functions below.
onnx::ModelProto build_epcontext_model(const Model& model, const PartitionPlan& plan,
                                       const std::vector<CompiledGraph>& graphs, const EpContextSettings& settings);

// Replaces every weight reference in `out` with the weight's bytes (raw_data).
void embed_weights(onnx::ModelProto& out, const Model& model);

// Collects the weights of several output models into one external data file, each distinct byte
// string once. Offsets are fixed as weights are added, so models can point at the file before it
// is written.
class ExternalWeightsFile {
 public:
  explicit ExternalWeightsFile(std::string location) : location_(std::move(location)) {}
  // Replaces every weight reference in `out` with a location in this file.
  void externalize(onnx::ModelProto& out, const Model& model);
  const std::string& location() const { return location_; }
  const WeightStore& store() const { return store_; }
  // Offset of each store entry in the file, in store-id order.
  const std::vector<uint64_t>& offsets() const { return offsets_; }
  uint64_t size() const { return end_; }

 private:
  std::string location_;
  WeightStore store_;
  std::vector<uint64_t> offsets_;
  uint64_t end_ = 0;
};

// Alignment of tensors in the external data file, so ONNX Runtime can map them.
inline constexpr uint64_t kExternalDataAlignment = 64;

}  // namespace ctxgen

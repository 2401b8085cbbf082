#pragma once
// Stage 2, partition: a backend only answers "can you run this node?"; this backend-neutral stage
// groups the supported nodes into partitions that can each be fused into one node without
// creating a cycle, and records why every other node stays on CPU.

#include <cstddef>
#include <functional>
#include <string>
#include <unordered_set>
#include <vector>

#include <onnx/onnx_pb.h>

namespace ctxgen {

struct NodeSupport {
  bool supported = false;
  std::string reason;  // why not, when not supported
  static NodeSupport yes() { return {true, {}}; }
  static NodeSupport no(std::string why) { return {false, std::move(why)}; }
};

struct Partition {
  std::vector<size_t> nodes;         // indices into graph.node(), in topological order
  std::vector<std::string> inputs;   // boundary values read from outside, first-use order; no constants
  std::vector<std::string> outputs;  // values used outside or graph outputs, production order
  std::vector<std::string> constants;  // constant initializers the partition reads, first-use order
};

struct CpuNode {
  size_t node = 0;
  std::string reason;
};

struct PartitionPlan {
  std::vector<Partition> partitions;  // ordered by their first node
  std::vector<CpuNode> cpu_nodes;     // in node order
};

// `supports(i)` is asked once per node of `graph`, in node order. `constants` are the names of
// main-graph constant initializers (they never become partition inputs).
// Deterministic: the same graph and answers give the same plan.
PartitionPlan partition_graph(const onnx::GraphProto& graph,
                              const std::unordered_set<std::string>& constants,
                              const std::function<NodeSupport(size_t)>& supports);

}  // namespace ctxgen

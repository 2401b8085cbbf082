// Backend-neutral grouping of supported nodes into fusable partitions.
//
// Nodes are visited in topological order (ONNX requires the main graph to be sorted). A supported
// node may join a group G unless G already reaches one of the node's predecessors outside G in the
// graph where every group is contracted to one node: fusing would then need G's own output as an
// input, a cycle. The check walks backwards from those predecessors; a group it meets stands for
// all its members. (Node indices do not bound the walk: through a contracted group a path can
// reach a node older than G's first member.)

#include <algorithm>
#include <unordered_map>

#include "ctxgen/log.h"
#include "ctxgen/model.h"
#include "ctxgen/partition.h"

namespace ctxgen {
namespace {

class Grouping {
 public:
  explicit Grouping(const std::vector<std::vector<size_t>>& preds) : preds_(preds), group_of_(preds.size(), -1) {}

  void assign(const std::vector<bool>& supported) {
    int last = -1;
    for (size_t i = 0; i < preds_.size(); ++i) {
      if (!supported[i]) continue;
      // Prefer a producer's group (data stays inside one partition), then the group grown last
      // (fewer, larger partitions for independent branches).
      int chosen = -1;
      for (size_t p : preds_[i]) {
        int g = group_of_[p];
        if (g >= 0 && can_join(i, g)) {
          chosen = g;
          break;
        }
      }
      if (chosen < 0 && last >= 0 && can_join(i, last)) chosen = last;
      if (chosen < 0) {
        chosen = static_cast<int>(members_.size());
        members_.emplace_back();
      }
      group_of_[i] = chosen;
      members_[static_cast<size_t>(chosen)].push_back(i);
      last = chosen;
    }
  }

  const std::vector<int>& group_of() const { return group_of_; }
  size_t group_count() const { return members_.size(); }

 private:
  bool can_join(size_t node, int g) {
    ++epoch_;  // marks from earlier searches become stale without clearing
    node_mark_.resize(preds_.size(), 0);
    group_mark_.resize(members_.size(), 0);
    std::vector<size_t> stack;
    for (size_t p : preds_[node])
      if (group_of_[p] != g) stack.push_back(p);
    while (!stack.empty()) {
      size_t v = stack.back();
      stack.pop_back();
      if (node_mark_[v] == epoch_) continue;
      node_mark_[v] = epoch_;
      int h = group_of_[v];
      if (h == g) return false;
      if (h >= 0 && group_mark_[static_cast<size_t>(h)] != epoch_) {
        group_mark_[static_cast<size_t>(h)] = epoch_;
        for (size_t m : members_[static_cast<size_t>(h)]) stack.push_back(m);
      }
      for (size_t p : preds_[v]) stack.push_back(p);
    }
    return true;
  }

  const std::vector<std::vector<size_t>>& preds_;
  std::vector<int> group_of_;  // -1 for CPU nodes
  std::vector<std::vector<size_t>> members_;
  uint64_t epoch_ = 0;
  std::vector<uint64_t> node_mark_, group_mark_;
};

void add_unique(std::vector<std::string>& list, const std::string& value) {
  if (std::find(list.begin(), list.end(), value) == list.end()) list.push_back(value);
}

}  // namespace

PartitionPlan partition_graph(const onnx::GraphProto& graph, const std::unordered_set<std::string>& constants,
                              const std::function<NodeSupport(size_t)>& supports) {
  size_t n = static_cast<size_t>(graph.node_size());
  std::unordered_map<std::string, size_t> producer;
  for (size_t i = 0; i < n; ++i)
    for (const auto& out : graph.node(static_cast<int>(i)).output())
      if (!out.empty()) producer[out] = i;

  std::vector<std::vector<std::string>> reads(n);
  std::vector<std::vector<size_t>> preds(n);
  std::vector<std::vector<size_t>> readers_of(n);  // node -> nodes reading any of its outputs
  for (size_t i = 0; i < n; ++i) {
    reads[i] = node_reads(graph.node(static_cast<int>(i)));
    for (const auto& value : reads[i]) {
      auto it = producer.find(value);
      if (it == producer.end() || it->second >= i) continue;
      if (std::find(preds[i].begin(), preds[i].end(), it->second) == preds[i].end()) preds[i].push_back(it->second);
    }
  }

  std::vector<bool> supported(n);
  std::vector<std::string> reasons(n);
  for (size_t i = 0; i < n; ++i) {
    NodeSupport s = supports(i);
    supported[i] = s.supported;
    reasons[i] = s.reason;
  }
  Grouping grouping(preds);
  grouping.assign(supported);
  const std::vector<int>& group_of = grouping.group_of();

  std::unordered_map<std::string, std::vector<int>> reader_groups;  // value -> groups of its readers (-1 = CPU)
  for (size_t i = 0; i < n; ++i)
    for (const auto& value : reads[i]) reader_groups[value].push_back(group_of[i]);
  std::unordered_set<std::string> graph_outputs;
  for (const auto& v : graph.output()) graph_outputs.insert(v.name());

  std::vector<Partition> groups(static_cast<size_t>(grouping.group_count()));
  for (size_t i = 0; i < n; ++i) {
    int g = group_of[i];
    if (g < 0) continue;
    Partition& part = groups[static_cast<size_t>(g)];
    part.nodes.push_back(i);
    for (const auto& value : reads[i]) {
      auto it = producer.find(value);
      bool inside = it != producer.end() && group_of[it->second] == g;
      if (inside) continue;
      add_unique(constants.count(value) ? part.constants : part.inputs, value);
    }
    for (const auto& out : graph.node(static_cast<int>(i)).output()) {
      if (out.empty()) continue;
      const auto& readers = reader_groups[out];
      bool used_outside = graph_outputs.count(out) ||
                          std::any_of(readers.begin(), readers.end(), [&](int r) { return r != g; });
      if (used_outside) add_unique(part.outputs, out);
    }
  }

  PartitionPlan plan;
  std::vector<bool> on_cpu(n, false);
  for (size_t i = 0; i < n; ++i) on_cpu[i] = group_of[i] < 0;
  for (auto& part : groups) {
    if (part.outputs.empty()) {
      // Nothing outside reads it: fusing it would only hide dead code, so leave it to ONNX Runtime.
      for (size_t i : part.nodes) {
        on_cpu[i] = true;
        reasons[i] = "its results are never used";
      }
      continue;
    }
    plan.partitions.push_back(std::move(part));
  }
  for (size_t i = 0; i < n; ++i) {
    if (!on_cpu[i]) continue;
    plan.cpu_nodes.push_back({i, reasons[i]});
    log().debug("node {} -> CPU: {}", describe_node(graph.node(static_cast<int>(i)), i), reasons[i]);
  }
  return plan;
}

}  // namespace ctxgen

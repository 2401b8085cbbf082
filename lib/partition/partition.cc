// Backend-neutral grouping of supported nodes into fusable partitions.
//
// Nodes are visited in topological order (ONNX requires the main graph to be sorted). A supported
// node joins an existing group G unless some path from G reaches the node through a node outside
// G: fusing G would then need its own output as an input, a cycle. To decide that cheaply, every
// node carries the set of groups among its ancestors ("reach"); the node may join G when none of
// its predecessors outside G has G in its reach.

#include <algorithm>
#include <unordered_map>

#include "ctxgen/log.h"
#include "ctxgen/model.h"
#include "ctxgen/partition.h"

namespace ctxgen {
namespace {

using GroupSet = std::vector<int>;  // sorted group ids

void merge_into(GroupSet& into, const GroupSet& from) {
  GroupSet merged;
  std::set_union(into.begin(), into.end(), from.begin(), from.end(), std::back_inserter(merged));
  into.swap(merged);
}

bool contains(const GroupSet& set, int group) { return std::binary_search(set.begin(), set.end(), group); }

struct Grouping {
  std::vector<int> group_of;  // -1 for CPU nodes
  int group_count = 0;
};

Grouping group_nodes(const std::vector<std::vector<size_t>>& preds, const std::vector<bool>& supported) {
  size_t n = preds.size();
  Grouping result;
  result.group_of.assign(n, -1);
  std::vector<GroupSet> reach(n);
  int last_group = -1;
  for (size_t i = 0; i < n; ++i) {
    for (size_t p : preds[i]) merge_into(reach[i], reach[p]);
    if (!supported[i]) continue;

    auto can_join = [&](int g) {
      return std::none_of(preds[i].begin(), preds[i].end(),
                          [&](size_t p) { return result.group_of[p] != g && contains(reach[p], g); });
    };
    // Prefer the group of a producer (keeps data flow inside one partition), then the group grown
    // last (fewer, larger partitions for independent branches).
    int chosen = -1;
    for (size_t p : preds[i]) {
      int g = result.group_of[p];
      if (g >= 0 && can_join(g)) {
        chosen = g;
        break;
      }
    }
    if (chosen < 0 && last_group >= 0 && can_join(last_group)) chosen = last_group;
    if (chosen < 0) chosen = result.group_count++;
    result.group_of[i] = chosen;
    last_group = chosen;
    merge_into(reach[i], GroupSet{chosen});
  }
  return result;
}

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
  Grouping grouping = group_nodes(preds, supported);

  std::unordered_map<std::string, std::vector<int>> reader_groups;  // value -> groups of its readers (-1 = CPU)
  for (size_t i = 0; i < n; ++i)
    for (const auto& value : reads[i]) reader_groups[value].push_back(grouping.group_of[i]);
  std::unordered_set<std::string> graph_outputs;
  for (const auto& v : graph.output()) graph_outputs.insert(v.name());

  std::vector<Partition> groups(static_cast<size_t>(grouping.group_count));
  for (size_t i = 0; i < n; ++i) {
    int g = grouping.group_of[i];
    if (g < 0) continue;
    Partition& part = groups[static_cast<size_t>(g)];
    part.nodes.push_back(i);
    for (const auto& value : reads[i]) {
      auto it = producer.find(value);
      bool inside = it != producer.end() && grouping.group_of[it->second] == g;
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
  for (size_t i = 0; i < n; ++i) on_cpu[i] = grouping.group_of[i] < 0;
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

#include "ordinary_graph.h"

#include <algorithm>
#include <set>
#include <unordered_set>

#include "ctxgen/error.h"
#include "ctxgen/pipeline.h"
#include "ort_api.h"
#include "ort_model.h"

namespace ctxgen::ort_ep {
namespace {

// A node's identity across ORT's graph, ctxgen's copy of it and the fused graphs ORT makes: its
// first output (value names are unique, node names need not be set).
std::string key_of(const OrtNode* node) {
  for (const OrtValueInfo* out : node_outputs(node))
    if (out != nullptr) return value_name(out);
  return {};
}

std::string key_of(const onnx::NodeProto& node) {
  for (const auto& out : node.output())
    if (!out.empty()) return out;
  return {};
}

}  // namespace

OrdinaryGraph::OrdinaryGraph(const OrtGraph* graph, const Backend& backend) : backend_(backend) {
  const std::vector<const OrtNode*> nodes = graph_nodes(graph);
  node_count_ = nodes.size();
  auto partitioned = partition_model(load_model(parse_ort_graph(graph), graph_label(graph)), backend);
  model_ = std::move(partitioned.model);
  plan_ = std::move(partitioned.plan);

  // Where each ORT node went: a partition, folded into a constant, or CPU (-1).
  std::unordered_map<std::string, size_t> ort_index;
  for (size_t i = 0; i < nodes.size(); ++i) ort_index.emplace(key_of(nodes[i]), i);
  constexpr int64_t kCpu = -1;
  std::vector<int64_t> group(nodes.size(), kCpu);
  std::unordered_set<std::string> kept;  // ORT nodes still in the specialised graph
  const auto& specialised = model_.graph();
  for (const auto& node : specialised.node()) kept.insert(key_of(node));
  for (size_t p = 0; p < plan_.partitions.size(); ++p)
    for (size_t k : plan_.partitions[p].nodes) {
      auto it = ort_index.find(key_of(specialised.node(static_cast<int>(k))));
      if (it == ort_index.end())
        throw Error(ErrorCode::kInternal, "partition " + std::to_string(p) + " holds a node ORT's graph does not have");
      group[it->second] = static_cast<int64_t>(p);
    }

  // Readers of each value among ORT's nodes; graph outputs are read by the caller, never a group.
  std::unordered_map<std::string, std::vector<size_t>> readers;
  std::unordered_set<std::string> graph_outputs;
  for (const auto& out : specialised.output()) graph_outputs.insert(out.name());
  for (size_t i = 0; i < nodes.size(); ++i) {
    for (const OrtValueInfo* in : node_inputs(nodes[i]))
      if (in != nullptr) readers[value_name(in)].push_back(i);
    size_t implicit = 0;
    check(api().ort->Node_GetNumImplicitInputs(nodes[i], &implicit), "Node_GetNumImplicitInputs");
    std::vector<const OrtValueInfo*> reads(implicit);
    if (implicit > 0) check(api().ort->Node_GetImplicitInputs(nodes[i], reads.data(), implicit), "Node_GetImplicitInputs");
    for (const OrtValueInfo* read : reads) readers[value_name(read)].push_back(i);
  }
  // A folded node joins the group that alone reads what it made; later nodes first, so a chain of
  // folded nodes follows its last one.
  std::vector<bool> folded(nodes.size(), false);
  for (size_t i = nodes.size(); i-- > 0;) {
    const std::string key = key_of(nodes[i]);
    if (kept.count(key) || !model_.constant(key)) continue;
    folded[i] = true;
    ++folded_;
    std::set<int64_t> targets;
    for (const OrtValueInfo* out : node_outputs(nodes[i])) {
      if (out == nullptr) continue;
      const std::string name = value_name(out);
      if (graph_outputs.count(name)) targets.insert(kCpu);
      for (size_t reader : readers[name]) targets.insert(group[reader]);
    }
    if (targets.size() == 1) group[i] = *targets.begin();
  }

  // A value of a group read outside it must leave the fused node, even when ctxgen's own graph
  // does not read it there (its reader was dead code that specialisation removed).
  groups_.resize(plan_.partitions.size());
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (group[i] == kCpu) continue;
    auto& partition = plan_.partitions[static_cast<size_t>(group[i])];
    groups_[static_cast<size_t>(group[i])].push_back(nodes[i]);
    partition_of_.emplace(key_of(nodes[i]), static_cast<size_t>(group[i]));
    if (folded[i]) continue;
    for (const OrtValueInfo* out : node_outputs(nodes[i])) {
      if (out == nullptr) continue;
      const std::string name = value_name(out);
      bool outside = graph_outputs.count(name) > 0;
      for (size_t reader : readers[name]) outside = outside || group[reader] != group[i];
      if (outside && std::find(partition.outputs.begin(), partition.outputs.end(), name) == partition.outputs.end())
        partition.outputs.push_back(name);
    }
  }
  // ORT lends its initializers for one call only (an external one is mapped for it): Compile binds
  // the bytes of the weights a partition reads again, from the graph ORT gives it.
  for (auto& weight : model_.weights)
    if (!weight.data.owner && !weight.data.file) weight.data.data = nullptr;
  std::set<std::string> open;
  for (const auto& input : specialised.input())
    for (const auto& dim : input.type().tensor_type().shape().dim())
      if (!dim.has_dim_value() && !dim.dim_param().empty()) open.insert(dim.dim_param());
  open_dims_.assign(open.begin(), open.end());
  for (const auto& cpu : plan_.cpu_nodes) {
    const auto& node = specialised.node(static_cast<int>(cpu.node));
    reasons_.push_back("node " + describe_node(node, cpu.node) + " stays on CPU: " + cpu.reason);
  }
}

size_t OrdinaryGraph::partition_of(const OrtGraph* fused) const {
  std::optional<size_t> partition;
  for (const OrtNode* node : graph_nodes(fused)) {
    auto it = partition_of_.find(key_of(node));
    if (it == partition_of_.end() || (partition && *partition != it->second))
      throw Error(ErrorCode::kInternal, "a fused graph is not a partition this EP proposed");
    partition = it->second;
  }
  if (!partition) throw Error(ErrorCode::kInternal, "a fused graph has no nodes");
  return *partition;
}

CompiledGraph OrdinaryGraph::compile(const OrtGraph* fused, const std::string& name, WeightStore& store,
                                     bool copy_weights) {
  const Partition& chosen = plan_.partitions[partition_of(fused)];
  std::unordered_set<std::string> reads(chosen.constants.begin(), chosen.constants.end());
  for (const OrtValueInfo* info : graph_initializers(fused)) {
    const std::string weight_name = value_name(info);
    auto it = model_.constants.find(weight_name);
    if (!reads.count(weight_name) || it == model_.constants.end()) continue;
    TensorData& data = model_.weights[it->second].data;
    if (data.owner || data.file) continue;
    const OrtValue* value = nullptr;
    check(api().ort->ValueInfo_GetInitializerValue(info, &value), "ValueInfo_GetInitializerValue");
    size_t size = 0;
    if (value != nullptr) check(api().ort->GetTensorSizeInBytes(value, &size), "GetTensorSizeInBytes");
    const void* bytes = nullptr;
    if (size > 0) check(api().ort->GetTensorData(value, &bytes), "GetTensorData");
    if (size != data.size)
      throw Error(ErrorCode::kInternal, "fused node '" + name + "': initializer '" + weight_name + "' has " +
                                            std::to_string(size) + " bytes, " + std::to_string(data.size) +
                                            " when its nodes were claimed");
    data.data = static_cast<const uint8_t*>(bytes);
    if (copy_weights && size > 0) {
      auto copy = std::make_shared<std::vector<uint8_t>>(data.data, data.data + size);
      data.data = copy->data();
      data.owner = std::move(copy);
    }
  }
  for (const auto& constant : chosen.constants) {
    const Weight* weight = model_.constant(constant);
    if (weight && weight->data.size > 0 && weight->data.data == nullptr)
      throw Error(ErrorCode::kInternal, "fused node '" + name + "': ORT's graph of it lacks initializer '" + constant + "'");
  }
  try {
    return backend_.compile(model_, chosen, name, store);
  } catch (const Error& e) {
    throw e.within(model_.path.string() + ": partition '" + name + "'");
  }
}

}  // namespace ctxgen::ort_ep

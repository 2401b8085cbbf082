#include "ordinary_graph.h"

#include <algorithm>
#include <set>
#include <unordered_set>

#include "ctxgen/error.h"
#include "ctxgen/partition.h"
#include "ctxgen/specialise.h"
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

// The EP a node is already assigned to (one ahead of this one in the session), or empty.
std::string assigned_ep(const OrtNode* node) {
  const char* ep = nullptr;
  check(api().ort->Node_GetEpName(node, &ep), "Node_GetEpName");
  return ep == nullptr ? std::string() : std::string(ep);
}

}  // namespace

// ctxgen's partitioner runs on ORT's graph, not on the specialised one: a node the specialise
// stage folded (a Shape of a runtime value, say) is gone from ctxgen's graph with its edges, but
// ORT still has both, and a fused node must be a valid cut of ORT's graph. Folded nodes are
// supported there (their value is a constant of the compiled partition); the backend decides for
// the others, as it does for the CLI.
OrdinaryGraph::OrdinaryGraph(const OrtGraph* graph, const Backend& backend, bool external_views) : backend_(backend) {
  const std::vector<const OrtNode*> nodes = model_order(graph);
  node_count_ = nodes.size();
  model_ = load_model(parse_ort_graph(graph, external_views), graph_label(graph));
  external_files_ = external_data_files(graph);
  const onnx::GraphProto ort_view = model_.graph();  // node i is nodes[i]
  if (static_cast<size_t>(ort_view.node_size()) != nodes.size())
    throw Error(ErrorCode::kInternal, "ORT's graph has " + std::to_string(nodes.size()) + " nodes, its copy " +
                                          std::to_string(ort_view.node_size()));
  SpecialiseOptions keep;
  keep.keep_folded_values = true;
  specialise(model_, keep);
  const auto& specialised = model_.graph();
  std::unordered_map<std::string, size_t> kept;  // ORT node key -> index in the specialised graph
  for (int k = 0; k < specialised.node_size(); ++k) kept.emplace(key_of(specialised.node(k)), static_cast<size_t>(k));

  std::unordered_set<std::string> constants;
  for (const auto& t : ort_view.initializer())
    if (model_.constants.count(t.name())) constants.insert(t.name());
  std::vector<bool> folded(nodes.size(), false);
  const PartitionPlan ort_plan = partition_graph(ort_view, constants, [&](size_t i) {
    if (const std::string ep = assigned_ep(nodes[i]); !ep.empty())
      return NodeSupport::no("assigned to " + ep + ", an EP ahead of this one in the session");
    const std::string key = key_of(ort_view.node(static_cast<int>(i)));
    if (auto it = kept.find(key); it != kept.end()) return backend_.supports(model_, specialised.node(static_cast<int>(it->second)));
    if (model_.constant(key)) {
      folded[i] = true;
      ++folded_;
      return NodeSupport::yes();
    }
    return NodeSupport::no("its outputs are read by nothing");
  });

  // Who reads each value in ORT's graph, and in ctxgen's.
  std::unordered_map<std::string, std::vector<size_t>> ort_readers, readers;
  for (int i = 0; i < ort_view.node_size(); ++i)
    for (const auto& value : node_reads(ort_view.node(i))) ort_readers[value].push_back(static_cast<size_t>(i));
  for (int k = 0; k < specialised.node_size(); ++k)
    for (const auto& value : node_reads(specialised.node(k))) readers[value].push_back(static_cast<size_t>(k));
  std::unordered_set<std::string> graph_outputs;
  for (const auto& out : specialised.output()) graph_outputs.insert(out.name());

  for (const Partition& group : ort_plan.partitions) {
    const std::unordered_set<size_t> members(group.nodes.begin(), group.nodes.end());
    Partition partition;
    for (size_t i : group.nodes)
      if (!folded[i]) partition.nodes.push_back(kept.at(key_of(ort_view.node(static_cast<int>(i)))));
    // A group of folded nodes alone computes nothing at run time: ORT keeps it.
    if (partition.nodes.empty()) continue;
    std::sort(partition.nodes.begin(), partition.nodes.end());
    const std::unordered_set<size_t> compiled(partition.nodes.begin(), partition.nodes.end());
    std::unordered_set<std::string> produced, listed;
    for (size_t k : partition.nodes)
      for (const auto& out : specialised.node(static_cast<int>(k)).output()) produced.insert(out);
    for (size_t k : partition.nodes)
      for (const auto& value : node_reads(specialised.node(static_cast<int>(k)))) {
        if (value.empty() || produced.count(value) || !listed.insert(value).second) continue;
        (model_.constant(value) ? partition.constants : partition.inputs).push_back(value);
      }
    // What leaves the fused node: whatever ORT's other nodes or the caller read, a folded member's
    // constant among them, and whatever ctxgen's own graph reads outside the partition.
    for (size_t i : group.nodes)
      for (const auto& value : ort_view.node(static_cast<int>(i)).output()) {
        if (value.empty()) continue;
        bool outside = graph_outputs.count(value) > 0;
        for (size_t reader : ort_readers[value]) outside = outside || !members.count(reader);
        for (size_t reader : readers[value]) outside = outside || (!folded[i] && !compiled.count(reader));
        if (outside) partition.outputs.push_back(value);
      }
    const size_t p = plan_.partitions.size();
    std::vector<const OrtNode*> claimed;
    for (size_t i : group.nodes) {
      claimed.push_back(nodes[i]);
      partition_of_.emplace(key_of(nodes[i]), p);
    }
    groups_.push_back(std::move(claimed));
    plan_.partitions.push_back(std::move(partition));
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
  for (const auto& cpu : ort_plan.cpu_nodes) {
    const auto& node = ort_view.node(static_cast<int>(cpu.node));
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

WeightlessSource OrdinaryGraph::weightless_source() const {
  WeightlessSource source{&model_, {}};
  for (const Partition& p : plan_.partitions) source.read.insert(source.read.end(), p.constants.begin(), p.constants.end());
  return source;
}

CompiledGraph OrdinaryGraph::compile(const OrtGraph* fused, const std::string& name, WeightStore& store,
                                     bool copy_weights, CompileCache* cache) {
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
    return cache ? cache->compile(model_, chosen, name, store) : backend_.compile(model_, chosen, name, store);
  } catch (const Error& e) {
    throw e.within(model_.path.string() + ": partition '" + name + "'");
  }
}

}  // namespace ctxgen::ort_ep

// One pass over the main graph in topological order types and folds every node (a node's inputs
// are final by the time it is reached, so the pass is already a fixed point), then a backward
// pass removes the nodes nothing reads.

#include "ctxgen/specialise.h"

#include <algorithm>
#include <memory>
#include <set>
#include <unordered_map>

#include "ctxgen/error.h"
#include "ctxgen/log.h"
#include "ctxgen/ref_evaluate.h"

namespace ctxgen {
namespace {

// The folded value becomes an initializer referring to a new weight, as load leaves every weight.
void add_folded_weight(Model& model, const std::string& name, const ValueType& type, std::vector<uint8_t> bytes) {
  auto& graph = *model.proto->mutable_graph();
  onnx::TensorProto* t = graph.add_initializer();
  t->set_name(name);
  t->set_data_type(type.elem_type);
  for (int64_t d : *type.dims) t->add_dims(d);
  t->set_data_location(onnx::TensorProto::EXTERNAL);
  auto* ref = t->add_external_data();
  ref->set_key(kWeightRefKey);
  ref->set_value(std::to_string(model.weights.size()));

  auto owned = std::make_shared<std::vector<uint8_t>>(std::move(bytes));
  Weight w;
  w.name = name;
  w.origin = WeightOrigin::kFolded;
  w.graph = "main";
  w.tensor = t;
  w.data.dtype = type.elem_type;
  w.data.dims = *type.dims;
  w.data.data = owned->data();
  w.data.size = owned->size();
  w.data.owner = owned;
  model.constants[name] = model.weights.size();
  model.value_types[name] = type;
  model.weights.push_back(std::move(w));
}

// The branch an If with a constant condition takes, or nullptr.
const onnx::GraphProto* taken_branch(const Model& model, const onnx::NodeProto& node) {
  if (node.op_type() != "If" || !is_onnx_domain(node.domain()) || node.input_size() != 1) return nullptr;
  const Weight* cond = model.constant(node.input(0));
  if (!cond || cond->data.size != 1) return nullptr;
  const char* name = cond->data.data[0] != 0 ? "then_branch" : "else_branch";
  for (const auto& a : node.attribute())
    if (a.name() == name && a.has_g()) return &a.g();
  return nullptr;
}

// Renames every value read inside `graph` (subgraphs included) by `rename`.
void rename_reads(onnx::GraphProto& graph, const std::unordered_map<std::string, std::string>& rename) {
  for (auto& n : *graph.mutable_node()) {
    for (auto& in : *n.mutable_input())
      if (auto it = rename.find(in); it != rename.end()) in = it->second;
    for (auto& a : *n.mutable_attribute()) {
      if (a.has_g()) rename_reads(*a.mutable_g(), rename);
      for (auto& g : *a.mutable_graphs()) rename_reads(g, rename);
    }
  }
}

// Every name the main graph defines or reads, for fresh names that collide with none.
std::set<std::string> names_in(const onnx::GraphProto& graph) {
  std::set<std::string> names;
  for (const auto& v : graph.input()) names.insert(v.name());
  for (const auto& v : graph.output()) names.insert(v.name());
  for (const auto& t : graph.initializer()) names.insert(t.name());
  for (const auto& n : graph.node()) {
    for (const auto& in : node_reads(n)) names.insert(in);
    for (const auto& out : n.output()) names.insert(out);
  }
  return names;
}

// Replaces node `index`, an If whose condition is constant, by the nodes of the branch it takes.
// Every value the branch defines gets a fresh name (sibling Ifs reuse names, and a branch
// initializer may shadow an outer one); the branch's outputs take the If's output names where a
// branch node produces them, otherwise an Identity forwards them.
void inline_branch(Model& model, int index, const onnx::GraphProto& taken, std::vector<bool>& removed) {
  onnx::GraphProto branch = taken;
  auto& graph = *model.proto->mutable_graph();
  const onnx::NodeProto node = graph.node(index);
  std::set<std::string> used = names_in(graph);
  std::unordered_map<std::string, std::string> rename;
  auto fresh = [&](const std::string& name) {
    std::string candidate = node.output(0) + "/" + name;
    for (int k = 1; used.count(candidate); ++k) candidate = node.output(0) + "/" + name + "_" + std::to_string(k);
    used.insert(candidate);
    return candidate;
  };
  std::set<std::string> produced;
  for (const auto& n : branch.node())
    for (const auto& out : n.output()) produced.insert(out);
  for (int k = 0; k < branch.output_size() && k < node.output_size(); ++k) {
    const std::string& inner = branch.output(k).name();
    if (produced.count(inner) && !rename.count(inner)) rename[inner] = node.output(k);
  }
  for (const auto& out : produced)
    if (!rename.count(out)) rename[out] = fresh(out);
  for (const auto& t : branch.initializer()) rename[t.name()] = fresh(t.name());
  std::vector<onnx::NodeProto> forwards;
  for (int k = 0; k < branch.output_size() && k < node.output_size(); ++k) {
    const std::string& inner = branch.output(k).name();
    auto it = rename.find(inner);
    if (it != rename.end() && it->second == node.output(k)) continue;
    onnx::NodeProto identity;
    identity.set_op_type("Identity");
    identity.set_name(node.name() + "/forward_" + std::to_string(k));
    identity.add_input(it == rename.end() ? inner : it->second);
    identity.add_output(node.output(k));
    forwards.push_back(identity);
  }
  rename_reads(branch, rename);
  for (auto& n : *branch.mutable_node())
    for (auto& out : *n.mutable_output())
      if (auto it = rename.find(out); it != rename.end()) out = it->second;
  for (auto& t : *branch.mutable_initializer()) {
    t.set_name(rename.at(t.name()));
    int64_t ref = weight_ref(t);
    if (ref >= 0) model.constants[t.name()] = static_cast<size_t>(ref);
    ValueType vt;
    vt.elem_type = t.data_type();
    vt.dims = std::vector<int64_t>(t.dims().begin(), t.dims().end());
    model.value_types[t.name()] = vt;
    *graph.add_initializer() = t;
  }
  for (const auto& v : branch.value_info()) {
    auto it = rename.find(v.name());
    model.value_types.emplace(it == rename.end() ? v.name() : it->second, value_type_of(v.type()));
  }
  google::protobuf::RepeatedPtrField<onnx::NodeProto> nodes;
  for (int i = 0; i < graph.node_size(); ++i) {
    if (i != index) {
      *nodes.Add() = std::move(*graph.mutable_node(i));
      continue;
    }
    for (auto& n : *branch.mutable_node()) *nodes.Add() = std::move(n);
    for (auto& n : forwards) *nodes.Add() = std::move(n);
  }
  graph.mutable_node()->Swap(&nodes);
  auto added = static_cast<size_t>(branch.node_size()) + forwards.size();
  removed.erase(removed.begin() + index);
  removed.insert(removed.begin() + index, added, false);
}

// How many live nodes (and graph outputs) read each value.
std::unordered_map<std::string, size_t> count_readers(const onnx::GraphProto& graph, const std::vector<bool>& removed) {
  std::unordered_map<std::string, size_t> readers;
  for (const auto& out : graph.output()) ++readers[out.name()];
  for (int i = 0; i < graph.node_size(); ++i)
    if (!removed[static_cast<size_t>(i)])
      for (const auto& name : node_reads(graph.node(i))) ++readers[name];
  return readers;
}

// Marks nodes whose outputs nothing live reads (no later node, no subgraph, no graph output).
size_t remove_dead(const onnx::GraphProto& graph, std::vector<bool>& removed) {
  auto readers = count_readers(graph, removed);
  size_t dead = 0;
  for (int i = graph.node_size(); i-- > 0;) {
    auto index = static_cast<size_t>(i);
    if (removed[index]) continue;
    const auto& node = graph.node(i);
    bool read = false;
    for (const auto& out : node.output()) read = read || (!out.empty() && readers[out] > 0);
    if (read) continue;
    removed[index] = true;
    ++dead;
    for (const auto& name : node_reads(node)) --readers[name];
  }
  return dead;
}

}  // namespace

SpecialiseSummary specialise(Model& model, const SpecialiseOptions& options) {
  SpecialiseSummary summary;
  auto& graph = *model.proto->mutable_graph();
  std::vector<bool> removed(static_cast<size_t>(graph.node_size()), false);
  // Live folded bytes, bounded whatever the model asks for; a folded value nothing reads any more
  // (a mask reduced to a scalar, say) gives its memory back at once.
  uint64_t folded_bytes = 0;
  auto readers = count_readers(graph, removed);
  auto drop_reads = [&](const onnx::NodeProto& node) {
    if (options.keep_folded_values) return;
    for (const auto& name : node_reads(node)) {
      if (--readers[name] > 0) continue;
      auto it = model.constants.find(name);
      if (it == model.constants.end()) continue;
      Weight& w = model.weights[it->second];
      if (w.origin != WeightOrigin::kFolded || !w.data.owner) continue;
      folded_bytes -= w.data.size;
      w.data.owner.reset();
      w.data.data = nullptr;
      w.data.size = 0;
    }
  };
  for (int i = 0; i < graph.node_size(); ++i) {
    if (const onnx::GraphProto* branch = taken_branch(model, graph.node(i))) {
      log().debug("{}: {} has a constant condition: inlined the {} nodes of the branch it takes", model.path.string(),
                  describe_node(graph.node(i), static_cast<size_t>(i)), branch->node_size());
      ++summary.inlined_branches;
      inline_branch(model, i, *branch, removed);
      readers = count_readers(graph, removed);
      --i;  // the branch's first node is next
      continue;
    }
    const auto& node = graph.node(i);
    std::optional<ref::Evaluated> result;
    try {
      uint64_t budget = options.max_total_folded_bytes > folded_bytes ? options.max_total_folded_bytes - folded_bytes : 0;
      result = ref::evaluate(model, node, std::min(options.max_folded_bytes, budget));
    } catch (const Error& e) {
      // The model computes something invalid from constants (an index out of range, a division
      // by zero): left to run, and fail, as it would in ONNX Runtime.
      log().debug("{}: not folded: {}", describe_node(node, static_cast<size_t>(i)), e.what());
      continue;
    }
    if (!result) continue;
    for (const auto& [name, type] : result->types) {
      const ValueType* known = model.type_of(name);
      if (known && known->is_static()) continue;
      model.value_types[name] = type;
      ++summary.typed_values;
    }
    if (!result->values) continue;
    for (size_t k = 0; k < result->types.size(); ++k) {
      folded_bytes += (*result->values)[k].size();
      add_folded_weight(model, result->types[k].first, result->types[k].second, std::move((*result->values)[k]));
    }
    removed[static_cast<size_t>(i)] = true;
    drop_reads(node);
    ++summary.folded_nodes;
    ++summary.folded_by_op[node.op_type()];
  }
  summary.removed_nodes = remove_dead(graph, removed);

  auto* nodes = graph.mutable_node();
  int kept = 0;
  for (int i = 0; i < nodes->size(); ++i) {
    if (removed[static_cast<size_t>(i)]) continue;
    if (kept != i) nodes->SwapElements(kept, i);
    ++kept;
  }
  while (nodes->size() > kept) nodes->RemoveLast();

  if (summary.folded_nodes > 0 || summary.removed_nodes > 0) {
    std::string ops;
    for (const auto& [op, count] : summary.folded_by_op) ops += (ops.empty() ? "" : ", ") + std::to_string(count) + " " + op;
    log().debug("{}: folded {} nodes ({}), removed {} dead nodes, typed {} values", model.path.string(),
                summary.folded_nodes, ops.empty() ? "none" : ops, summary.removed_nodes, summary.typed_values);
  }
  return summary;
}

}  // namespace ctxgen

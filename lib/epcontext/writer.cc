#include <algorithm>
#include <map>
#include <queue>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "ctxgen/epcontext.h"
#include "ctxgen/error.h"
#include "ctxgen/format.h"

namespace ctxgen {
namespace {

constexpr const char* kMsDomain = "com.microsoft";

void set_int(onnx::NodeProto& node, const std::string& name, int64_t value) {
  auto* a = node.add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INT);
  a->set_i(value);
}

void set_string(onnx::NodeProto& node, const std::string& name, const std::string& value) {
  auto* a = node.add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::STRING);
  a->set_s(value);
}

}  // namespace

onnx::NodeProto epcontext_node(const CompiledGraph& graph, bool main, const EpContextSettings& s,
                               const std::string& model_filename) {
  onnx::NodeProto node;
  node.set_op_type("EPContext");
  node.set_domain(kMsDomain);
  node.set_name(graph.name);
  for (const auto& in : graph.inputs) node.add_input(in.name);
  for (const auto& fixed : graph.fixed_inputs) node.add_input(fixed.io.name);
  for (const auto& out : graph.outputs) node.add_output(out.name);
  set_int(node, "main_context", main ? 1 : 0);
  if (main) set_string(node, "ep_cache_context", s.cache_context);
  set_int(node, "embed_mode", s.embed ? 1 : 0);
  set_string(node, "ep_sdk_version", s.identity.sdk_version);
  set_string(node, "hardware_architecture", s.identity.hardware_architecture);
  set_string(node, "partition_name", graph.name);
  set_string(node, "source", s.identity.backend);
  set_string(node, "onnx_model_filename", model_filename);
  set_string(node, "notes", "ctxgen " + s.producer_version + ": " + std::to_string(graph.node_count) +
                                " ONNX nodes compiled into graph '" + graph.name + "'");
  return node;
}

namespace {

// Nodes of the new graph in a topological order that stays as close as possible to the original:
// each fused node takes the place of its first member. A valid partition plan guarantees an order.
std::vector<onnx::NodeProto> ordered_nodes(const onnx::GraphProto& graph, std::vector<onnx::NodeProto> items,
                                           const std::vector<size_t>& rank) {
  std::unordered_map<std::string, size_t> producer;
  for (size_t i = 0; i < items.size(); ++i)
    for (const auto& out : items[i].output())
      if (!out.empty()) producer[out] = i;
  std::vector<std::vector<size_t>> users(items.size());
  std::vector<size_t> pending(items.size(), 0);
  for (size_t i = 0; i < items.size(); ++i) {
    std::set<size_t> deps;
    for (const auto& value : node_reads(items[i])) {
      auto it = producer.find(value);
      if (it != producer.end() && it->second != i) deps.insert(it->second);
    }
    pending[i] = deps.size();
    for (size_t d : deps) users[d].push_back(i);
  }
  using Item = std::pair<size_t, size_t>;  // (rank, item)
  std::priority_queue<Item, std::vector<Item>, std::greater<>> ready;
  for (size_t i = 0; i < items.size(); ++i)
    if (pending[i] == 0) ready.push({rank[i], i});
  std::vector<onnx::NodeProto> ordered;
  while (!ready.empty()) {
    size_t i = ready.top().second;
    ready.pop();
    ordered.push_back(std::move(items[i]));
    for (size_t u : users[i])
      if (--pending[u] == 0) ready.push({rank[u], u});
  }
  if (ordered.size() != items.size())
    throw Error(ErrorCode::kInternal, "graph '" + graph.name() + "': fused graph has a cycle");
  return ordered;
}

onnx::ValueInfoProto value_info(const IoSignature& sig) {
  onnx::ValueInfoProto v;
  v.set_name(sig.name);
  auto* t = v.mutable_type()->mutable_tensor_type();
  t->set_elem_type(sig.elem_type);
  auto* shape = t->mutable_shape();
  for (int64_t d : sig.dims) shape->add_dim()->set_dim_value(d);
  return v;
}

template <typename F>
void for_each_tensor(onnx::GraphProto& graph, F&& f) {
  for (auto& t : *graph.mutable_initializer()) f(t);
  for (auto& node : *graph.mutable_node())
    for (auto& a : *node.mutable_attribute()) {
      if (a.has_g()) for_each_tensor(*a.mutable_g(), f);
      for (auto& g : *a.mutable_graphs()) for_each_tensor(g, f);
    }
}

const Weight& referenced(const onnx::TensorProto& t, const Model& model) {
  int64_t ref = weight_ref(t);
  if (ref < 0 || static_cast<size_t>(ref) >= model.weights.size())
    throw Error(ErrorCode::kInternal, "tensor '" + t.name() + "' has no weight reference");
  return model.weights[static_cast<size_t>(ref)];
}

// The inputs --fix-value took out of the graph go back where the original declares them, as it
// declares them: a compiled model is a drop-in replacement.
void restore_fixed_inputs(onnx::GraphProto& g, const Model& model) {
  std::vector<const Model::FixedValue*> fixed;
  for (const auto& [name, value] : model.fixed_values) fixed.push_back(&value);
  std::sort(fixed.begin(), fixed.end(), [](const auto* a, const auto* b) { return a->position < b->position; });
  for (const auto* value : fixed) {
    *g.add_input() = value->declared;
    // Every input before it in the original is already in place.
    for (int i = g.input_size() - 1; i > static_cast<int>(value->position) && i > 0; --i) g.mutable_input()->SwapElements(i, i - 1);
  }
}

}  // namespace

onnx::ModelProto build_epcontext_model(const Model& model, const PartitionPlan& plan,
                                       const std::vector<CompiledGraph>& graphs, const EpContextSettings& settings) {
  if (graphs.size() != plan.partitions.size())
    throw Error(ErrorCode::kInternal, "one compiled graph per partition expected");
  const onnx::GraphProto& src = model.graph();
  onnx::ModelProto out;
  out.set_ir_version(model.proto->ir_version());
  out.set_producer_name("ctxgen");
  out.set_producer_version(settings.producer_version);
  out.set_domain(model.proto->domain());
  out.set_model_version(model.proto->model_version());
  out.set_doc_string(model.proto->doc_string());
  *out.mutable_metadata_props() = model.proto->metadata_props();
  // Replaced, so a copied key never carries a stale id.
  set_metadata(out, kContentIdMetadataKey, settings.content_id);
  set_metadata(out, kExternalWeightsIdMetadataKey, "");
  // ONNX Runtime judges this before a session on the model is created; a model with no EPContext
  // node does not need the EP, so it records none.
  set_metadata(out, kCompatibilityMetadataPrefix + settings.identity.backend,
               graphs.empty() ? "" : compatibility_info(settings.identity));
  *out.mutable_functions() = model.proto->functions();
  *out.mutable_opset_import() = model.proto->opset_import();
  bool has_ms = std::any_of(out.opset_import().begin(), out.opset_import().end(),
                            [](const onnx::OperatorSetIdProto& o) { return o.domain() == kMsDomain; });
  if (!has_ms) {
    auto* ms = out.add_opset_import();
    ms->set_domain(kMsDomain);
    ms->set_version(1);
  }

  onnx::GraphProto& g = *out.mutable_graph();
  g.set_name(src.name());
  g.set_doc_string(src.doc_string());
  *g.mutable_input() = src.input();
  restore_fixed_inputs(g, model);
  *g.mutable_output() = src.output();

  std::vector<onnx::NodeProto> items;
  std::vector<size_t> rank;
  for (const auto& cpu : plan.cpu_nodes) {
    items.push_back(src.node(static_cast<int>(cpu.node)));
    rank.push_back(cpu.node);
  }
  for (size_t p = 0; p < plan.partitions.size(); ++p) {
    items.push_back(epcontext_node(graphs[p], p == 0, settings, model.path.filename().string()));
    rank.push_back(plan.partitions[p].nodes.front());
  }
  for (auto& node : ordered_nodes(src, std::move(items), rank)) *g.add_node() = std::move(node);

  // Keep an initializer only if something left in the graph reads it (or it is a graph output or
  // an overridable input); weights only compiled partitions read live in the context binary.
  auto needed = names_in_use(g);
  for (const auto& t : src.initializer()) {
    // A fixed input's value is read from the input (the run is refused unless it is fed that value)
    // and is its default only where the original gave it one.
    const auto fixed = model.fixed_values.find(t.name());
    if (needed.count(t.name()) && (fixed == model.fixed_values.end() || fixed->second.had_default)) *g.add_initializer() = t;
  }
  for (const auto& t : src.sparse_initializer())
    if (needed.count(t.values().name())) *g.add_sparse_initializer() = t;

  // Value infos: keep those of values still produced; give every EPContext output its static type
  // so ONNX Runtime knows it without running inference on a node it has no schema logic for.
  std::unordered_set<std::string> produced, graph_outputs;
  for (const auto& node : g.node())
    if (node.op_type() != "EPContext")
      for (const auto& o : node.output()) produced.insert(o);
  for (const auto& v : src.output()) graph_outputs.insert(v.name());
  for (const auto& v : src.value_info())
    if (produced.count(v.name())) *g.add_value_info() = v;
  for (const auto& graph : graphs)
    for (const auto& sig : graph.outputs)
      if (!graph_outputs.count(sig.name)) *g.add_value_info() = value_info(sig);
  return out;
}

void embed_weights(onnx::ModelProto& out, const Model& model) {
  for_each_tensor(*out.mutable_graph(), [&](onnx::TensorProto& t) {
    if (weight_ref(t) < 0) return;
    const Weight& w = referenced(t, model);
    t.clear_external_data();
    t.clear_data_location();
    t.set_raw_data(w.data.data, w.data.size);
    w.data.blob().release();
  });
}

void ExternalWeightsFile::externalize(onnx::ModelProto& out, const Model& model) {
  for_each_tensor(*out.mutable_graph(), [&](onnx::TensorProto& t) {
    if (weight_ref(t) < 0) return;
    const Weight& w = referenced(t, model);
    uint32_t id = store_.intern(w.data.blob());
    if (id == offsets_.size()) {
      uint64_t offset = (end_ + kExternalDataAlignment - 1) / kExternalDataAlignment * kExternalDataAlignment;
      offsets_.push_back(offset);
      end_ = offset + w.data.size;
    }
    t.clear_external_data();
    auto add = [&](const char* key, const std::string& value) {
      auto* kv = t.add_external_data();
      kv->set_key(key);
      kv->set_value(value);
    };
    add("location", location_);
    add("offset", std::to_string(offsets_[id]));
    add("length", std::to_string(w.data.size));
  });
}

}  // namespace ctxgen

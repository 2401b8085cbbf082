#include "ep.h"

#include <cstring>
#include <new>

#include "binary_registry.h"
#include "compiled_node.h"
#include "context_path.h"
#include "ctxgen/error.h"
#include "ctxgen/weights.h"
#include "ort_api.h"
#include "plugin_backend.h"

namespace ctxgen::ort_ep {
namespace {

std::vector<std::string> value_names(const std::vector<const OrtValueInfo*>& values) {
  std::vector<std::string> names;
  names.reserve(values.size());
  for (const OrtValueInfo* value : values) names.push_back(value == nullptr ? std::string() : value_name(value));
  return names;
}

// Embedded payloads are copied to a buffer aligned like a mapped file, so weights can be used
// in place exactly as they are from a .bin.
std::shared_ptr<const uint8_t> aligned_copy(const std::string& bytes) {
  constexpr std::align_val_t alignment{kPayloadAlignment};
  auto* data = static_cast<uint8_t*>(::operator new(bytes.size(), alignment));
  std::memcpy(data, bytes.data(), bytes.size());
  return std::shared_ptr<const uint8_t>(data, [](const uint8_t* p) {
    ::operator delete(const_cast<uint8_t*>(p), std::align_val_t{kPayloadAlignment});
  });
}

// Every graph input must come from somewhere, so its slot is not optional.
std::vector<size_t> required_slots(const std::string& node, const std::vector<std::string>& wanted,
                                   const std::vector<std::string>& available) {
  std::vector<size_t> slots;
  for (const auto& slot : match_by_name(node, "input", wanted, available, true)) slots.push_back(*slot);
  return slots;
}

std::string join_labels(const std::vector<std::string>& labels) {
  std::string text;
  for (const std::string& label : labels) text += (text.empty() ? "" : ", ") + label;
  return text;
}

}  // namespace

SessionConfig SessionConfig::read(const OrtSessionOptions* options) {
  SessionConfig config;
  config.context_file_path = session_config(options, "ep.context_file_path");
  config.share_contexts = session_config(options, "ep.share_ep_contexts") == std::string("1");
  return config;
}

CtxgenEp::CtxgenEp(SessionConfig config, const OrtLogger* logger)
    : OrtEp{}, config_(std::move(config)), logger_(logger) {
  ort_version_supported = ORT_API_VERSION;
  GetName = GetNameImpl;
  GetCapability = GetCapabilityImpl;
  Compile = CompileImpl;
  ReleaseNodeComputeInfos = ReleaseNodeComputeInfosImpl;
  GetCompiledModelCompatibilityInfo = GetCompiledModelCompatibilityInfoImpl;
}

void CtxgenEp::log(OrtLoggingLevel level, const std::string& message) const {
  OrtStatus* status = api().ort->Logger_LogMessage(logger_, level, message.c_str(), __FILE__, __LINE__, "CtxgenEp");
  if (status != nullptr) api().ort->ReleaseStatus(status);
}

void CtxgenEp::claim(const OrtGraph* graph, OrtEpGraphSupportInfo* support) {
  size_t claimed = 0;
  for (const OrtNode* node : graph_nodes(graph)) {
    if (!is_our_ep_context_node(node)) continue;
    // One fused node per EPContext node: each runs its own graph of the context binary.
    check(api().ep->EpGraphSupportInfo_AddNodesToFuse(support, &node, 1, nullptr),
          "EpGraphSupportInfo_AddNodesToFuse");
    ++claimed;
  }
  if (claimed > 0) {
    log(ORT_LOGGING_LEVEL_INFO, "claimed " + std::to_string(claimed) + " EPContext node(s)");
    return;
  }
  claim_ordinary(graph, support);
}

void CtxgenEp::claim_ordinary(const OrtGraph* graph, OrtEpGraphSupportInfo* support) {
  const OrtNode* parent = nullptr;
  check(api().ort->Graph_GetParentNode(graph, &parent), "Graph_GetParentNode");
  if (parent != nullptr) {
    log(ORT_LOGGING_LEVEL_VERBOSE, "claims no nodes of the subgraphs of node '" + node_name(parent) + "' (" +
                                       node_op_type(parent) + "): control flow stays with ONNX Runtime");
    return;
  }
  std::unique_ptr<OrdinaryGraph> analysed;
  try {
    analysed = std::make_unique<OrdinaryGraph>(graph, backend());
  } catch (const Error& e) {
    // A graph ctxgen cannot read is still one ORT can run: without this EP.
    log(ORT_LOGGING_LEVEL_WARNING, std::string("claims no nodes: ") + e.what());
    return;
  }
  for (const std::string& reason : analysed->reasons()) log(ORT_LOGGING_LEVEL_VERBOSE, reason);
  size_t claimed = 0;
  for (const auto& group : analysed->groups()) {
    check(api().ep->EpGraphSupportInfo_AddNodesToFuse(support, group.data(), group.size(), nullptr),
          "EpGraphSupportInfo_AddNodesToFuse");
    claimed += group.size();
  }
  std::string open;
  for (const std::string& dim : analysed->open_dims()) open += (open.empty() ? "" : ", ") + dim;
  log(ORT_LOGGING_LEVEL_INFO,
      "claimed " + std::to_string(claimed) + " of " + std::to_string(analysed->node_count()) + " nodes in " +
          std::to_string(analysed->groups().size()) + " partition(s) (" + std::to_string(analysed->folded_nodes()) +
          " folded into constants); " + std::to_string(analysed->reasons().size()) + " stay on CPU" +
          (open.empty() || analysed->reasons().empty()
               ? std::string()
               : "; the inputs leave dims open (" + open +
                     "): fixing them with free dimension overrides lets shape-dependent nodes compile"));
  ordinary_ = std::move(analysed);
}

const CtxgenEp::LoadedBinary& CtxgenEp::keep(LoadedBinary loaded) {
  check_binary_identity(*loaded.binary, loaded.label);
  log(ORT_LOGGING_LEVEL_INFO, "loaded context binary " + loaded.label + " (" +
                                  std::to_string(loaded.binary->graphs().size()) + " graphs)");
  return loaded_.emplace_back(std::move(loaded));
}

const CtxgenEp::LoadedBinary& CtxgenEp::load_main_context(const EpContextNode& node, const std::string& model_path) {
  const std::string where = "EPContext node '" + node.name + "'";
  if (node.embed_mode) {
    if (node.cache_context.empty()) {
      throw Error(ErrorCode::kInvalidModel, where + ": embed_mode is 1 but ep_cache_context holds no payload");
    }
    const std::string label = "embedded in " + where;
    auto data = aligned_copy(node.cache_context);
    auto binary = ContextBinary::from_memory(data.get(), node.cache_context.size(), data, label);
    return keep({label, std::move(binary)});
  }
  const auto folder = context_folder(model_path, config_.context_file_path, node.name, node.cache_context);
  const std::string path = resolve_context_path(folder, node.cache_context, node.name).string();
  for (const LoadedBinary& loaded : loaded_) {
    if (loaded.label == path) return loaded;
  }
  try {
    return keep({path, BinaryRegistry::instance().open(path, config_.share_contexts)});
  } catch (const Error& e) {
    throw e.within(where + ": ep_cache_context '" + node.cache_context + "'");
  }
}

CtxgenEp::LoadedBinary CtxgenEp::find_graph(const EpContextNode& node, const LoadedBinary* own) const {
  const std::string& name = node.graph_name();
  if (own != nullptr && own->binary->find_graph(name) != nullptr) return *own;

  std::vector<LoadedBinary> hits;
  std::vector<std::string> searched;
  for (const LoadedBinary& loaded : loaded_) {
    searched.push_back(loaded.label);
    if (loaded.binary->find_graph(name) != nullptr) hits.push_back(loaded);
  }
  if (hits.empty() && config_.share_contexts) {
    for (SharedGraph& shared : BinaryRegistry::instance().find_shared_graph(name)) {
      hits.push_back({shared.path.string(), std::move(shared.binary)});
    }
  }
  const std::string where = "EPContext node '" + node.name + "': graph '" + name + "'";
  if (hits.size() > 1) {
    std::vector<std::string> labels;
    for (const LoadedBinary& hit : hits) labels.push_back(hit.label);
    throw Error(ErrorCode::kInvalidModel, where + " is in several context binaries (" + join_labels(labels) +
                                              "); graph names must be unique");
  }
  if (hits.empty()) {
    const std::string loaded = searched.empty() ? std::string("no context binary was loaded by a main_context=1 node")
                                                : "it is not in " + join_labels(searched);
    const std::string shared = config_.share_contexts
                                   ? " nor in a context shared by another live session"
                                   : " (set ep.share_ep_contexts=1 to use contexts loaded by earlier sessions)";
    throw Error(ErrorCode::kInvalidModel, where + " not found: " + loaded + shared);
  }
  return hits.front();
}

void CtxgenEp::compile(const OrtGraph** graphs, const OrtNode** fused_nodes, size_t count,
                       OrtNodeComputeInfo** infos) {
  struct Pending {
    size_t index;  // into graphs
    const OrtNode* ort_node;
    EpContextNode node;
    std::optional<LoadedBinary> own;
  };
  std::vector<Pending> pending;
  std::vector<size_t> ordinary;
  for (size_t i = 0; i < count; ++i) {
    const auto nodes = graph_nodes(graphs[i]);
    if (nodes.size() != 1 || !is_our_ep_context_node(nodes[0])) {
      ordinary.push_back(i);
      continue;
    }
    EpContextNode node = EpContextNode::read(nodes[0]);
    node.check_versions();
    pending.push_back({i, nodes[0], std::move(node), std::nullopt});
  }
  // Main contexts first: a main_context=0 node may name a graph that a later node loads.
  // Models from other tools, and ctxgen outputs from before content ids, record none.
  const std::optional<std::string> recorded =
      pending.empty() ? std::nullopt : model_metadata(graphs[pending[0].index], kContentIdMetadataKey);
  const auto check_pairing = [&](const EpContextNode& node, const ContextBinary& binary) {
    if (recorded) check_content_id(binary, *recorded, "EPContext node '" + node.name + "': the model");
  };
  for (Pending& p : pending) {
    if (!p.node.main_context) continue;
    p.own = load_main_context(p.node, graph_model_path(graphs[p.index]));
    // Before any graph is looked up, so a binary of another compilation is named as such.
    check_pairing(p.node, *p.own->binary);
  }

  std::vector<std::unique_ptr<CompiledNode>> compiled(count);
  for (const Pending& p : pending) {
    const EpContextNode& node = p.node;
    const LoadedBinary found = find_graph(node, p.own ? &*p.own : nullptr);
    check_pairing(node, *found.binary);
    std::shared_ptr<const GraphRunner> executable;
    try {
      executable = backend_runtime().load(found.binary, node.graph_name());
    } catch (const Error& e) {
      throw e.within("EPContext node '" + node.name + "': context binary " + found.label);
    }
    const auto inputs = node_inputs(p.ort_node);
    const auto outputs = node_outputs(p.ort_node);
    check_signature(node, executable->graph(), found.label, inputs, outputs);
    compiled[p.index] = std::make_unique<CompiledNode>(
        node.name, std::move(executable),
        required_slots(node.name, value_names(inputs), value_names(node_inputs(fused_nodes[p.index]))),
        match_by_name(node.name, "output", value_names(outputs), value_names(node_outputs(fused_nodes[p.index])), false),
        config_.virtual_device);
  }
  if (!ordinary.empty()) {
    std::vector<const OrtGraph*> ordinary_graphs;
    std::vector<const OrtNode*> ordinary_nodes;
    for (size_t i : ordinary) {
      ordinary_graphs.push_back(graphs[i]);
      ordinary_nodes.push_back(fused_nodes[i]);
    }
    auto nodes = compile_ordinary(ordinary_graphs, ordinary_nodes);
    for (size_t k = 0; k < ordinary.size(); ++k) compiled[ordinary[k]] = std::move(nodes[k]);
  }
  for (size_t i = 0; i < count; ++i) infos[i] = compiled[i].release();
}

std::vector<std::unique_ptr<CompiledNode>> CtxgenEp::compile_ordinary(const std::vector<const OrtGraph*>& graphs,
                                                                      const std::vector<const OrtNode*>& fused_nodes) {
  if (!ordinary_) throw Error(ErrorCode::kInternal, "Compile was given nodes no GetCapability of this EP claimed");
  WeightStore store;
  std::vector<CompiledGraph> compiled;
  for (size_t i = 0; i < graphs.size(); ++i) compiled.push_back(ordinary_->compile(graphs[i], node_name(fused_nodes[i]), store));
  std::vector<WeightPayload> payloads;
  for (uint32_t id = 0; id < store.size(); ++id) payloads.push_back({store.entry(id).hash, store.entry(id).blob});
  std::string bytes;
  write_context_binary(
      backend().identity(), compiled, payloads,
      [&](const uint8_t* data, size_t size) { bytes.append(reinterpret_cast<const char*>(data), size); },
      [&](uint64_t offset, const uint8_t* data, size_t size) {
        bytes.replace(offset, size, reinterpret_cast<const char*>(data), size);
      });
  // The binary holds its own copy of every weight: ORT may drop the initializers it fused away.
  ordinary_.reset();
  const std::string label = "compiled in session from " + std::to_string(graphs.size()) + " partition(s)";
  auto data = aligned_copy(bytes);
  const size_t size = bytes.size();
  std::string().swap(bytes);
  auto binary = ContextBinary::from_memory(data.get(), size, data, label);
  log(ORT_LOGGING_LEVEL_INFO, "compiled " + std::to_string(compiled.size()) + " partition(s) into a context binary of " +
                                  std::to_string(size) + " bytes held in memory");

  std::vector<std::unique_ptr<CompiledNode>> nodes;
  for (size_t i = 0; i < graphs.size(); ++i) {
    const std::string& name = compiled[i].name;
    std::shared_ptr<const GraphRunner> executable = backend_runtime().load(binary, name);
    std::vector<std::string> inputs, outputs;
    for (const auto& in : executable->graph().inputs) inputs.push_back(in.name);
    for (const auto& out : executable->graph().outputs) outputs.push_back(out.name);
    nodes.push_back(std::make_unique<CompiledNode>(
        name, std::move(executable), required_slots(name, inputs, value_names(node_inputs(fused_nodes[i]))),
        match_by_name(name, "output", outputs, value_names(node_outputs(fused_nodes[i])), false),
        config_.virtual_device));
  }
  return nodes;
}

const char* ORT_API_CALL CtxgenEp::GetNameImpl(const OrtEp*) noexcept { return backend_identity().backend.c_str(); }

OrtStatus* ORT_API_CALL CtxgenEp::GetCapabilityImpl(OrtEp* self, const OrtGraph* graph,
                                                    OrtEpGraphSupportInfo* support) noexcept {
  return guarded(ORT_EP_FAIL, [&] { static_cast<CtxgenEp*>(self)->claim(graph, support); });
}

OrtStatus* ORT_API_CALL CtxgenEp::CompileImpl(OrtEp* self, const OrtGraph** graphs, const OrtNode** fused_nodes,
                                              size_t count, OrtNodeComputeInfo** infos, OrtNode**) noexcept {
  return guarded(ORT_EP_FAIL, [&] { static_cast<CtxgenEp*>(self)->compile(graphs, fused_nodes, count, infos); });
}

void ORT_API_CALL CtxgenEp::ReleaseNodeComputeInfosImpl(OrtEp*, OrtNodeComputeInfo** infos, size_t count) noexcept {
  for (size_t i = 0; i < count; ++i) delete static_cast<CompiledNode*>(infos[i]);
}

const char* ORT_API_CALL CtxgenEp::GetCompiledModelCompatibilityInfoImpl(OrtEp*, const OrtGraph*) noexcept {
  return compatibility_info().c_str();
}

}  // namespace ctxgen::ort_ep

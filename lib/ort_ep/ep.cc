#include "ep.h"

#include <cstring>
#include <new>

#include "binary_registry.h"
#include "compiled_node.h"
#include "context_path.h"
#include "ctxgen/error.h"
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

void CtxgenEp::claim(const OrtGraph* graph, OrtEpGraphSupportInfo* support) const {
  size_t claimed = 0;
  for (const OrtNode* node : graph_nodes(graph)) {
    if (!is_our_ep_context_node(node)) continue;
    // One fused node per EPContext node: each runs its own graph of the context binary.
    check(api().ep->EpGraphSupportInfo_AddNodesToFuse(support, &node, 1, nullptr),
          "EpGraphSupportInfo_AddNodesToFuse");
    ++claimed;
  }
  if (claimed > 0) log(ORT_LOGGING_LEVEL_INFO, "claimed " + std::to_string(claimed) + " EPContext node(s)");
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
    const OrtNode* ort_node;
    EpContextNode node;
    std::optional<LoadedBinary> own;
  };
  std::vector<Pending> pending;
  for (size_t i = 0; i < count; ++i) {
    const auto nodes = graph_nodes(graphs[i]);
    if (nodes.size() != 1) {
      throw Error(ErrorCode::kInternal, "fused graph " + std::to_string(i) + " has " + std::to_string(nodes.size()) +
                                            " nodes; this EP fuses each EPContext node alone");
    }
    EpContextNode node = EpContextNode::read(nodes[0]);
    node.check_versions();
    pending.push_back({nodes[0], std::move(node), std::nullopt});
  }
  // Main contexts first: a main_context=0 node may name a graph that a later node loads.
  // Models from other tools, and ctxgen outputs from before content ids, record none.
  const std::optional<std::string> recorded = count > 0 ? model_metadata(graphs[0], kContentIdMetadataKey) : std::nullopt;
  const auto check_pairing = [&](const EpContextNode& node, const ContextBinary& binary) {
    if (recorded) check_content_id(binary, *recorded, "EPContext node '" + node.name + "': the model");
  };
  for (size_t i = 0; i < count; ++i) {
    if (!pending[i].node.main_context) continue;
    pending[i].own = load_main_context(pending[i].node, graph_model_path(graphs[i]));
    // Before any graph is looked up, so a binary of another compilation is named as such.
    check_pairing(pending[i].node, *pending[i].own->binary);
  }

  std::vector<std::unique_ptr<CompiledNode>> compiled;
  for (size_t i = 0; i < count; ++i) {
    const EpContextNode& node = pending[i].node;
    const LoadedBinary found = find_graph(node, pending[i].own ? &*pending[i].own : nullptr);
    check_pairing(node, *found.binary);
    std::shared_ptr<const GraphRunner> executable;
    try {
      executable = backend_runtime().load(found.binary, node.graph_name());
    } catch (const Error& e) {
      throw e.within("EPContext node '" + node.name + "': context binary " + found.label);
    }
    const auto inputs = node_inputs(pending[i].ort_node);
    const auto outputs = node_outputs(pending[i].ort_node);
    check_signature(node, executable->graph(), found.label, inputs, outputs);
    compiled.push_back(std::make_unique<CompiledNode>(
        node.name, std::move(executable),
        required_slots(node.name, value_names(inputs), value_names(node_inputs(fused_nodes[i]))),
        match_by_name(node.name, "output", value_names(outputs), value_names(node_outputs(fused_nodes[i])), false),
        config_.virtual_device));
  }
  for (size_t i = 0; i < count; ++i) infos[i] = compiled[i].release();
}

const char* ORT_API_CALL CtxgenEp::GetNameImpl(const OrtEp*) noexcept { return backend_identity().backend.c_str(); }

OrtStatus* ORT_API_CALL CtxgenEp::GetCapabilityImpl(OrtEp* self, const OrtGraph* graph,
                                                    OrtEpGraphSupportInfo* support) noexcept {
  return guarded(ORT_EP_FAIL, [&] { static_cast<const CtxgenEp*>(self)->claim(graph, support); });
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

#include "ep.h"

#include <algorithm>
#include <cctype>

#include "binary_registry.h"
#include "compiled_node.h"
#include "ctxgen/context_path.h"
#include "ctxgen/error.h"
#include "ort_api.h"
#include "plugin_backend.h"

namespace fs = std::filesystem;

namespace ctxgen::ort_ep {
namespace {

std::string join_labels(const std::vector<std::string>& labels) {
  std::string text;
  for (const std::string& label : labels) text += (text.empty() ? "" : ", ") + label;
  return text;
}

}  // namespace

SessionConfig SessionConfig::read(const OrtSessionOptions* options) {
  // Provider options reach an EP as session config entries "ep.<lowercase EP name>.<key>"; this EP
  // has one, so any other is a mistake to report, not to ignore.
  std::string prefix = "ep." + backend_identity().backend + ".";
  std::transform(prefix.begin(), prefix.end(), prefix.begin(), [](unsigned char c) { return std::tolower(c); });
  SessionConfig config;
  for (const auto& [key, value] : session_config_entries(options)) {
    if (key.rfind(prefix, 0) != 0) continue;
    if (key == prefix + "cache_dir") {
      config.cache_dir = value;
      continue;
    }
    throw Error(ErrorCode::kUsage, backend_identity().backend + " takes one provider option, cache_dir; got '" +
                                       key.substr(prefix.size()) + "=" + value + "'");
  }
  const auto set = [options](const char* key) { return session_config(options, key) == std::string("1"); };
  config.context_file_path = session_config(options, "ep.context_file_path");
  config.share_contexts = set("ep.share_ep_contexts");
  config.context_enable = set("ep.context_enable");
  config.embed_mode = set("ep.context_embed_mode");
  config.node_name_prefix = session_config(options, "ep.context_node_name_prefix").value_or("");
  config.stop_share = set("ep.stop_share_ep_contexts");
  config.compile_only = set("session.compile_only");
  config.weightless = set("ep.enable_weightless");
  config.data = context_data_functions(options);
  const void* source_bytes = nullptr;
  size_t source_size = 0;
  check(api().ep->SessionOptionsGetWeightlessSourceModelBuffer(options, &source_bytes, &source_size),
        "SessionOptionsGetWeightlessSourceModelBuffer");
  config.source_model_bytes = source_bytes != nullptr;
  config.source_model_path = session_config(options, "ep.context_source_model_path");
  return config;
}

std::string SessionConfig::cannot_run() const {
  if (virtual_device)
    return "this session uses " + backend_identity().backend +
           "'s virtual device (offered when the environment allows virtual devices, as a library registered under a "
           "name ending in '.virtual' does); it loads and checks models but cannot run them. Run on the EP's CPU "
           "device instead";
  if (compile_only) return "this session only compiles (session.compile_only=1, as ORT's Compile API sets it)";
  return {};
}

CtxgenEp::CtxgenEp(SessionConfig config, const OrtLogger* logger)
    : OrtEp{}, config_(std::move(config)), logger_(logger), compiler_(make_session_compiler(config_, logger)) {
  if (config_.context_enable && !compiler_)
    throw Error(ErrorCode::kUsage, "this " + backend_identity().backend +
                                       " library only runs compiled models and cannot generate EPContext models "
                                       "(ep.context_enable=1, as ORT's Compile API sets it); compile with ctxgen, "
                                       "or register the full library (libctxgen_ort_ep.so)");
  ort_version_supported = ORT_API_VERSION;
  GetName = GetNameImpl;
  GetCapability = GetCapabilityImpl;
  Compile = CompileImpl;
  ReleaseNodeComputeInfos = ReleaseNodeComputeInfosImpl;
  GetCompiledModelCompatibilityInfo = GetCompiledModelCompatibilityInfoImpl;
  GetWeightlessSupport = GetWeightlessSupportImpl;
}

void CtxgenEp::log(OrtLoggingLevel level, const std::string& message) const { log_message(logger_, level, message); }

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
  if (compiler_) {
    compiler_->claim(graph, support);
    return;
  }
  const OrtNode* parent = nullptr;
  check(api().ort->Graph_GetParentNode(graph, &parent), "Graph_GetParentNode");
  if (parent == nullptr)
    log(ORT_LOGGING_LEVEL_WARNING,
        "claims no nodes: the model has no EPContext nodes of " + backend_identity().backend +
            ", and this plugin library only runs compiled models. Compile the model with ctxgen, or register the "
            "full library (libctxgen_ort_ep.so) to compile it in the session");
}

const CtxgenEp::LoadedBinary& CtxgenEp::keep(LoadedBinary loaded) {
  const Judgement judged = check_binary_identity(*loaded.binary, loaded.label);
  if (judged.fit == Fit::kRuns) log(ORT_LOGGING_LEVEL_WARNING, "context binary " + loaded.label + ": " + judged.why);
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
    auto data = aligned_copy(reinterpret_cast<const uint8_t*>(node.cache_context.data()), node.cache_context.size());
    auto binary = ContextBinary::from_memory(data.get(), node.cache_context.size(), data, label);
    return keep({label, std::move(binary)});
  }
  if (config_.data.read != nullptr) {
    // The application stores its binaries itself (encrypted, say): the name is its key for them.
    const std::string label = "'" + node.cache_context + "' from the application's EPContext data read function";
    for (const LoadedBinary& loaded : loaded_)
      if (loaded.label == label) return loaded;
    // Sessions sharing binaries share one copy of each that one read function gives.
    const std::string key = "read function " + std::to_string(reinterpret_cast<uintptr_t>(config_.data.read)) + "/" +
                            std::to_string(reinterpret_cast<uintptr_t>(config_.data.read_state)) + ": " +
                            node.cache_context;
    try {
      return keep({label, BinaryRegistry::instance().open(key, config_.share_contexts, [&] {
                     size_t size = 0;
                     std::shared_ptr<const uint8_t> bytes = read_context_data(config_.data, node.cache_context, size);
                     if (reinterpret_cast<uintptr_t>(bytes.get()) % kPayloadAlignment != 0)
                       bytes = aligned_copy(bytes.get(), size);  // weights are used in place, aligned as in a file
                     return ContextBinary::from_memory(bytes.get(), size, bytes, label);
                   })});
    } catch (const Error& e) {
      throw e.within(where);
    }
  }
  const auto folder = context_folder(model_path, config_.context_file_path, node.name, node.cache_context);
  const ContextFile file = open_context_file(folder, node.cache_context, node.name);
  for (const LoadedBinary& loaded : loaded_) {
    if (loaded.label == file.path) return loaded;
  }
  try {
    return keep({file.path.string(), BinaryRegistry::instance().open(file, config_.share_contexts,
                                                                     [&]() -> std::optional<std::filesystem::path> { return source_folder(node, folder); })});
  } catch (const Error& e) {
    throw e.within(where + ": ep_cache_context '" + node.cache_context + "'");
  }
}

// The order ORT documents for finding a weightless binary's source model: the application's bytes
// of it, ep.context_source_model_path, the node's onnx_model_filename beside the compiled model.
std::filesystem::path CtxgenEp::source_folder(const EpContextNode& node, const std::filesystem::path& model_folder) const {
  // Bytes of the source model do not say where its external data is: beside the compiled model,
  // in the folder ORT reports for it (session.model_external_initializers_file_folder_path's, if set).
  if (config_.source_model_bytes) return model_folder;
  return source_data_folder(model_folder, config_.source_model_path, node.onnx_model_filename, node.name);
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

void CtxgenEp::compile(const OrtGraph** graphs, const OrtNode** fused_nodes, size_t count, OrtNodeComputeInfo** infos,
                       OrtNode** ep_context_nodes) {
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
        config_.cannot_run());
  }
  if (!ordinary.empty()) {
    if (!pending.empty())
      throw Error(ErrorCode::kInternal, "Compile was given EPContext nodes and ordinary nodes together");
    if (!compiler_) throw Error(ErrorCode::kInternal, "Compile was given nodes no GetCapability of this EP claimed");
    auto nodes = compiler_->compile(std::vector<const OrtGraph*>(graphs, graphs + count),
                                    std::vector<const OrtNode*>(fused_nodes, fused_nodes + count), ep_context_nodes);
    for (size_t i = 0; i < count; ++i) compiled[i] = std::move(nodes[i]);
  }
  for (size_t i = 0; i < count; ++i) infos[i] = compiled[i].release();
}

const char* ORT_API_CALL CtxgenEp::GetNameImpl(const OrtEp*) noexcept { return backend_identity().backend.c_str(); }

OrtStatus* ORT_API_CALL CtxgenEp::GetCapabilityImpl(OrtEp* self, const OrtGraph* graph,
                                                    OrtEpGraphSupportInfo* support) noexcept {
  return guarded(ORT_EP_FAIL, [&] { static_cast<CtxgenEp*>(self)->claim(graph, support); });
}

OrtStatus* ORT_API_CALL CtxgenEp::CompileImpl(OrtEp* self, const OrtGraph** graphs, const OrtNode** fused_nodes,
                                              size_t count, OrtNodeComputeInfo** infos,
                                              OrtNode** ep_context_nodes) noexcept {
  return guarded(ORT_EP_FAIL,
                 [&] { static_cast<CtxgenEp*>(self)->compile(graphs, fused_nodes, count, infos, ep_context_nodes); });
}

void ORT_API_CALL CtxgenEp::ReleaseNodeComputeInfosImpl(OrtEp*, OrtNodeComputeInfo** infos, size_t count) noexcept {
  for (size_t i = 0; i < count; ++i) delete static_cast<CompiledNode*>(infos[i]);
}

const char* ORT_API_CALL CtxgenEp::GetCompiledModelCompatibilityInfoImpl(OrtEp*, const OrtGraph*) noexcept {
  return compatibility_info().c_str();
}

// External data only: weights the model embeds stay in the binary (ref lays some out anew there).
OrtStatus* ORT_API_CALL CtxgenEp::GetWeightlessSupportImpl(const OrtEp* self, OrtWeightlessSupport* support) noexcept {
  *support = static_cast<const CtxgenEp*>(self)->compiler_ ? OrtWeightlessSupport_EXTERNAL_ONLY : OrtWeightlessSupport_NONE;
  return nullptr;
}

}  // namespace ctxgen::ort_ep

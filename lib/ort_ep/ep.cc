#include "ep.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <new>

#include "binary_registry.h"
#include "compiled_node.h"
#include "ctxgen/context_path.h"
#include "ctxgen/error.h"
#include "ctxgen/pipeline.h"
#include "ctxgen/weights.h"
#include "generate.h"
#include "ort_api.h"
#include "plugin_backend.h"

namespace fs = std::filesystem;

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
  // Provider options reach an EP as session config entries "ep.<lowercase EP name>.<key>"; this EP
  // has none, so any is a mistake to report, not to ignore.
  std::string prefix = "ep." + backend_identity().backend + ".";
  std::transform(prefix.begin(), prefix.end(), prefix.begin(), [](unsigned char c) { return std::tolower(c); });
  for (const auto& [key, value] : session_config_entries(options))
    if (key.rfind(prefix, 0) == 0)
      throw Error(ErrorCode::kUsage, backend_identity().backend + " takes no provider options; got '" +
                                         key.substr(prefix.size()) + "=" + value + "'");
  const auto set = [options](const char* key) { return session_config(options, key) == std::string("1"); };
  SessionConfig config;
  config.context_file_path = session_config(options, "ep.context_file_path");
  config.share_contexts = set("ep.share_ep_contexts");
  config.context_enable = set("ep.context_enable");
  config.embed_mode = set("ep.context_embed_mode");
  config.node_name_prefix = session_config(options, "ep.context_node_name_prefix").value_or("");
  config.stop_share = set("ep.stop_share_ep_contexts");
  config.compile_only = set("session.compile_only");
  return config;
}

std::string CtxgenEp::cannot_run() const {
  if (config_.virtual_device)
    return "this session uses " + backend_identity().backend +
           "'s virtual device (offered when the environment allows virtual devices, as a library registered under a "
           "name ending in '.virtual' does); it loads and checks models but cannot run them. Run on the EP's CPU "
           "device instead";
  if (config_.compile_only) return "this session only compiles (session.compile_only=1, as ORT's Compile API sets it)";
  return {};
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
  // The last session of a shared compile group ends it even when it compiles nothing (ORT then
  // never calls Compile): the group's binary is written for the models before it.
  struct EndGroup {
    CtxgenEp& ep;
    bool claimed = false;
    ~EndGroup() {
      if (claimed || !ep.config_.context_enable || !ep.config_.share_contexts || !ep.config_.stop_share) return;
      try {
        HeldWorkspace held = shared_workspace();
        ep.finish_group(held.workspace);
      } catch (const std::exception& e) {
        ep.log(ORT_LOGGING_LEVEL_ERROR, std::string("the shared context binary was not written: ") + e.what());
      }
    }
  } end_group{*this};
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
  end_group.claimed = claimed > 0;
  ordinary_ = std::move(analysed);
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
    auto data = aligned_copy(node.cache_context);
    auto binary = ContextBinary::from_memory(data.get(), node.cache_context.size(), data, label);
    return keep({label, std::move(binary)});
  }
  const auto folder = context_folder(model_path, config_.context_file_path, node.name, node.cache_context);
  const ContextFile file = open_context_file(folder, node.cache_context, node.name);
  for (const LoadedBinary& loaded : loaded_) {
    if (loaded.label == file.path) return loaded;
  }
  try {
    return keep({file.path.string(), BinaryRegistry::instance().open(file, config_.share_contexts)});
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
        cannot_run());
  }
  if (!ordinary.empty()) {
    if (!pending.empty())
      throw Error(ErrorCode::kInternal, "Compile was given EPContext nodes and ordinary nodes together");
    auto nodes = compile_ordinary(std::vector<const OrtGraph*>(graphs, graphs + count),
                                  std::vector<const OrtNode*>(fused_nodes, fused_nodes + count), ep_context_nodes);
    for (size_t i = 0; i < count; ++i) compiled[i] = std::move(nodes[i]);
  }
  for (size_t i = 0; i < count; ++i) infos[i] = compiled[i].release();
}

std::vector<std::unique_ptr<CompiledNode>> CtxgenEp::compile_ordinary(const std::vector<const OrtGraph*>& graphs,
                                                                      const std::vector<const OrtNode*>& fused_nodes,
                                                                      OrtNode** ep_context_nodes) {
  if (!ordinary_) throw Error(ErrorCode::kInternal, "Compile was given nodes no GetCapability of this EP claimed");
  // Its views of ORT's memory end with this call, whatever happens.
  struct Done {
    std::unique_ptr<OrdinaryGraph>& graph;
    ~Done() { graph.reset(); }
  } done{ordinary_};
  const bool generate = config_.context_enable && ep_context_nodes != nullptr;
  const bool shared = generate && config_.share_contexts;
  if (shared && config_.embed_mode)
    throw Error(ErrorCode::kUsage, "ep.context_embed_mode=1 cannot be combined with ep.share_ep_contexts=1: an "
                                   "embedded context belongs to one model, so the models cannot share one binary");
  const std::string input_model = graph_model_path(graphs.front());
  const GenerationPaths paths = generation_paths(input_model, config_.context_file_path, backend().name());
  // Named as the CLI names a model's partitions, so a binary ORT compiled reads like one ctxgen wrote.
  std::vector<std::string> names;
  for (size_t i = 0; i < graphs.size(); ++i)
    names.push_back(generate ? config_.node_name_prefix + paths.stem + "_" + backend().name() + "_" +
                                   std::to_string(ordinary_->partition_of(graphs[i]))
                             : node_name(fused_nodes[i]));

  // A shared group compiles into the process's workspace, holding its own copies of the weights
  // (the binary is written by a later session); otherwise into this call's store.
  CompileWorkspace local;
  std::optional<HeldWorkspace> held;
  if (shared) held.emplace(shared_workspace());
  CompileWorkspace& workspace = held ? held->workspace : local;
  if (shared) {
    // Refusals leave the group as it was: a refused last session can be given again.
    const fs::path& binary = paths.binary_or_throw();
    if (!workspace.binary.empty() && workspace.binary.parent_path() != binary.parent_path())
      throw Error(ErrorCode::kUsage, "the sessions of a shared group must write their models into one folder: this "
                                     "one writes " + paths.model.string() + ", the group's context binary is " +
                                     workspace.binary.string());
    for (const CompiledGraph& earlier : workspace.graphs)
      if (std::find(names.begin(), names.end(), earlier.name) != names.end())
        throw Error(ErrorCode::kUsage, "graph '" + earlier.name + "' is already in the context binary this session " +
                                           "group shares (two models with the same file name?); give each session "
                                           "its own ep.context_node_name_prefix");
    if (workspace.binary.empty()) workspace.binary = binary;
  }
  // A session of a shared group that fails from here takes the group's work with it: a binary
  // missing its graphs is never written; the sessions after it start a new group.
  struct Abandon {
    CompileWorkspace* workspace;
    ~Abandon() {
      if (workspace != nullptr) *workspace = CompileWorkspace();
    }
  } abandon{shared ? &workspace : nullptr};
  const size_t first = workspace.graphs.size();
  for (size_t i = 0; i < graphs.size(); ++i)
    workspace.graphs.push_back(ordinary_->compile(graphs[i], names[i], workspace.store, shared));
  const std::vector<CompiledGraph> mine(workspace.graphs.begin() + static_cast<std::ptrdiff_t>(first),
                                        workspace.graphs.end());

  // Everything that can fail before any file is written: the node ORT will place, the slots.
  const BinaryIdentity identity = backend().identity();
  std::string payload;  // the binary in memory: to embed, or to run from when nothing is written
  const bool written = generate && !config_.embed_mode;
  if (!written || (shared && cannot_run().empty())) payload = context_binary_bytes(identity, workspace.graphs, workspace.store);
  const std::string cache_context = !generate            ? std::string()
                                    : config_.embed_mode ? payload
                                    : shared             ? workspace.binary.filename().string()
                                                         : paths.binary_or_throw().filename().string();
  const EpContextSettings settings{identity, config_.embed_mode, cache_context, CTXGEN_VERSION, ""};
  std::vector<std::vector<size_t>> input_slots;
  std::vector<std::vector<std::optional<size_t>>> output_slots;
  for (size_t i = 0; i < mine.size(); ++i) {
    std::vector<std::string> inputs, outputs;
    for (const auto& in : mine[i].inputs) inputs.push_back(in.name);
    for (const auto& out : mine[i].outputs) outputs.push_back(out.name);
    input_slots.push_back(required_slots(mine[i].name, inputs, value_names(node_inputs(fused_nodes[i]))));
    output_slots.push_back(match_by_name(mine[i].name, "output", outputs, value_names(node_outputs(fused_nodes[i])), false));
    if (generate)
      ep_context_nodes[i] = create_ep_context_node(mine[i], node_name(fused_nodes[i]), i == 0, settings,
                                                   fs::path(input_model).filename().string());
  }

  std::shared_ptr<const ContextBinary> binary;
  if (written && !shared) {
    write_context_binary_file(paths.binary, identity, workspace.graphs, workspace.store);
    log(ORT_LOGGING_LEVEL_INFO, "wrote context binary " + paths.binary.string());
    if (cannot_run().empty()) binary = BinaryRegistry::instance().open(paths.binary);
  } else if (cannot_run().empty()) {
    // Held in memory, aligned like a mapped file so weights are used in place.
    auto data = aligned_copy(payload);
    binary = ContextBinary::from_memory(data.get(), payload.size(), data,
                                        "compiled in session from " + std::to_string(mine.size()) + " partition(s)");
  }
  if (shared && config_.stop_share) finish_group(workspace);
  abandon.workspace = nullptr;
  log(ORT_LOGGING_LEVEL_INFO, "compiled " + std::to_string(mine.size()) + " partition(s)" +
                                  (generate ? " into EPContext nodes" : std::string()));

  std::vector<std::unique_ptr<CompiledNode>> nodes;
  for (size_t i = 0; i < mine.size(); ++i) {
    std::shared_ptr<const GraphRunner> executable;
    if (binary) executable = backend_runtime().load(binary, mine[i].name);
    nodes.push_back(std::make_unique<CompiledNode>(mine[i].name, std::move(executable), std::move(input_slots[i]),
                                                   std::move(output_slots[i]), cannot_run()));
  }
  return nodes;
}

void CtxgenEp::finish_group(CompileWorkspace& workspace) {
  if (!workspace.graphs.empty()) {
    write_context_binary_file(workspace.binary, backend().identity(), workspace.graphs, workspace.store);
    log(ORT_LOGGING_LEVEL_INFO, "wrote the shared context binary " + workspace.binary.string() + " (" +
                                    std::to_string(workspace.graphs.size()) + " graphs, " +
                                    std::to_string(workspace.store.size()) + " distinct weights)");
  }
  workspace = CompileWorkspace();
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

}  // namespace ctxgen::ort_ep

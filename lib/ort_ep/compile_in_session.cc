#include "compile_in_session.h"

#include <algorithm>
#include <optional>

#include "binary_registry.h"
#include "compiled_node.h"
#include "ctxgen/error.h"
#include "ctxgen/pipeline.h"
#include "generate.h"
#include "ordinary_graph.h"
#include "ort_api.h"
#include "plugin_backend.h"

namespace fs = std::filesystem;

namespace ctxgen::ort_ep {
namespace {

class InSessionCompiler : public SessionCompiler {
 public:
  InSessionCompiler(std::unique_ptr<Backend> backend, SessionConfig config, const OrtLogger* logger)
      : backend_(backend->with({"", config.weightless})), config_(std::move(config)), logger_(logger) {}

  void claim(const OrtGraph* graph, OrtEpGraphSupportInfo* support) override;
  std::vector<std::unique_ptr<CompiledNode>> compile(const std::vector<const OrtGraph*>& graphs,
                                                     const std::vector<const OrtNode*>& fused_nodes,
                                                     OrtNode** ep_context_nodes) override;

 private:
  // Writes a shared compile group's binary (when it has graphs) and empties the workspace.
  void finish_group(CompileWorkspace& workspace);
  void log(OrtLoggingLevel level, const std::string& message) const { log_message(logger_, level, message); }

  std::unique_ptr<Backend> backend_;
  SessionConfig config_;
  const OrtLogger* logger_;
  std::unique_ptr<OrdinaryGraph> ordinary_;  // what the last claim decided, until Compile
};

void InSessionCompiler::claim(const OrtGraph* graph, OrtEpGraphSupportInfo* support) {
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
    InSessionCompiler& compiler;
    bool claimed = false;
    ~EndGroup() {
      if (claimed || !compiler.config_.context_enable || !compiler.config_.share_contexts || !compiler.config_.stop_share) return;
      try {
        HeldWorkspace held = shared_workspace();
        compiler.finish_group(held.workspace);
      } catch (const std::exception& e) {
        compiler.log(ORT_LOGGING_LEVEL_ERROR, std::string("the shared context binary was not written: ") + e.what());
      }
    }
  } end_group{*this};
  std::unique_ptr<OrdinaryGraph> analysed;
  try {
    analysed = std::make_unique<OrdinaryGraph>(graph, *backend_, config_.weightless);
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

std::vector<std::unique_ptr<CompiledNode>> InSessionCompiler::compile(const std::vector<const OrtGraph*>& graphs,
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
  const GenerationPaths paths = generation_paths(input_model, config_.context_file_path, backend_->name());
  if (config_.weightless) {
    // The binary names the source model's external data, which only a binary written as a file
    // beside one model's compiled model can do.
    const auto refuse = [](const std::string& why) {
      throw Error(ErrorCode::kUsage, "weightless mode (ep.enable_weightless=1): " + why);
    };
    if (!generate) refuse("CtxgenRef makes weightless binaries only when it writes an EPContext model (ORT's Compile API)");
    if (config_.embed_mode) refuse("an embedded binary cannot refer to the model's external data; set ep.context_embed_mode=0");
    if (config_.data.write != nullptr) refuse("a binary given to the application's write function cannot refer to files");
    if (shared) refuse("the sessions of a shared group (ep.share_ep_contexts=1) write one binary, which is not weightless");
    if (input_model.empty()) refuse("the model was given from memory, so its external data has no folder");
  }
  // ORT writes the model, this EP the binary: neither may replace the weights they are made from.
  if (generate) {
    for (const fs::path& out : {paths.model, paths.binary}) {
      std::error_code ec;
      for (const fs::path& read : ordinary_->external_files())
        if (!out.empty() && fs::equivalent(out, read, ec))
          throw Error(ErrorCode::kUsage, out.string() + " would replace " + read.string() + ", which " + input_model +
                                             " reads its weights from; write the compiled model elsewhere");
    }
  }
  // Named as the CLI names a model's partitions, so a binary ORT compiled reads like one ctxgen wrote.
  std::vector<std::string> names;
  for (size_t i = 0; i < graphs.size(); ++i)
    names.push_back(generate ? config_.node_name_prefix + paths.stem + "_" + backend_->name() + "_" +
                                   std::to_string(ordinary_->partition_of(graphs[i]))
                             : node_name(fused_nodes[i]));

  // The compile cache (provider option cache_dir), for a session that writes its binary in this
  // call: what it takes from the cache lives no longer than the call. Declared before the store,
  // whose weights may be read from it, so it outlives it.
  std::unique_ptr<CompileCache> cache;
  if (!config_.cache_dir.empty() && !shared) cache = std::make_unique<CompileCache>(config_.cache_dir, *backend_, config_.weightless);
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
    workspace.graphs.push_back(ordinary_->compile(graphs[i], names[i], workspace.store, shared, cache.get()));
  if (cache)
    log(ORT_LOGGING_LEVEL_INFO, "cache_dir " + config_.cache_dir + ": " + std::to_string(cache->stats().hits) + " of " +
                                    std::to_string(graphs.size()) + " partitions from cache");
  const std::vector<CompiledGraph> mine(workspace.graphs.begin() + static_cast<std::ptrdiff_t>(first),
                                        workspace.graphs.end());

  // Everything that can fail before any file is written: the node ORT will place, the slots.
  const BinaryIdentity identity = backend_->identity();
  std::string payload;  // the binary in memory: to embed, or to run from when nothing is written
  const bool written = generate && !config_.embed_mode;
  // An application that stores binaries itself (its write function) gets them as bytes, never as a file.
  const bool to_application = written && config_.data.write != nullptr;
  // A shared group's binary is made once, by the session that ends the group (finish_group).
  if (!written || (to_application && !shared) || (shared && config_.cannot_run().empty()))
    payload = context_binary_bytes(identity, workspace.graphs, workspace.store);
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
  if (written && !shared && to_application) {
    write_context_data(config_.data, cache_context, payload);
    log(ORT_LOGGING_LEVEL_INFO, "gave context binary '" + cache_context + "' to the application's write function");
  } else if (written && !shared) {
    write_context_binary_file(paths.binary, identity, workspace.graphs, workspace.store,
                              config_.weightless ? std::vector<WeightlessSource>{ordinary_->weightless_source()}
                                                 : std::vector<WeightlessSource>{});
    log(ORT_LOGGING_LEVEL_INFO, "wrote context binary " + paths.binary.string());
    if (config_.cannot_run().empty())
      binary = BinaryRegistry::instance().open(paths.binary, [&]() -> std::optional<fs::path> {
        return external_data_folder(input_model);
      });
  }
  if (!binary && config_.cannot_run().empty() && !payload.empty()) {
    // Held in memory, aligned like a mapped file so weights are used in place.
    auto data = aligned_copy(reinterpret_cast<const uint8_t*>(payload.data()), payload.size());
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
                                                   std::move(output_slots[i]), config_.cannot_run()));
  }
  return nodes;
}

void InSessionCompiler::finish_group(CompileWorkspace& workspace) {
  if (!workspace.graphs.empty()) {
    const bool to_application = config_.data.write != nullptr;
    if (to_application)
      write_context_data(config_.data, workspace.binary.filename().string(),
                         context_binary_bytes(backend_->identity(), workspace.graphs, workspace.store));
    else
      write_context_binary_file(workspace.binary, backend_->identity(), workspace.graphs, workspace.store);
    log(ORT_LOGGING_LEVEL_INFO, (to_application ? "gave the application's write function the shared context binary '" +
                                                      workspace.binary.filename().string() + "'"
                                                : "wrote the shared context binary " + workspace.binary.string()) + " (" +
                                    std::to_string(workspace.graphs.size()) + " graphs, " +
                                    std::to_string(workspace.store.size()) + " distinct weights)");
  }
  workspace = CompileWorkspace();
}

}  // namespace

std::unique_ptr<SessionCompiler> compile_in_session(std::unique_ptr<Backend> backend, SessionConfig config,
                                                    const OrtLogger* logger) {
  return std::make_unique<InSessionCompiler>(std::move(backend), std::move(config), logger);
}

}  // namespace ctxgen::ort_ep

#pragma once
// The OrtEp of one session. On a model with this EP's EPContext nodes it claims those and runs
// each with its graph of a context binary; on an ordinary model it claims the nodes its backend
// supports and compiles them, as `ctxgen compile` would, into a context binary it keeps in memory.

#include <onnxruntime_c_api.h>

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ctxgen/format.h"
#include "ep_context.h"
#include "generate.h"
#include "ordinary_graph.h"

namespace ctxgen::ort_ep {

// The session options the EP reads in CreateEp (it may not keep the options themselves).
struct SessionConfig {
  std::optional<std::string> context_file_path;  // ep.context_file_path
  bool share_contexts = false;                   // ep.share_ep_contexts=1
  bool virtual_device = false;                   // the session's device is a virtual one: no runs
  // Generating EPContext models (ep.context_enable=1, as ORT's Compile API sets it):
  bool context_enable = false;
  bool embed_mode = false;       // ep.context_embed_mode=1: the binary goes into the main node
  std::string node_name_prefix;  // ep.context_node_name_prefix
  bool stop_share = false;       // ep.stop_share_ep_contexts=1: the last session of a shared group
  bool compile_only = false;     // session.compile_only=1: the session never runs

  static SessionConfig read(const OrtSessionOptions* options);
};

class CompiledNode;

class CtxgenEp : public OrtEp {
 public:
  CtxgenEp(SessionConfig config, const OrtLogger* logger);

 private:
  // A context binary loaded by one of this session's main_context=1 nodes.
  struct LoadedBinary {
    std::string label;  // canonical path, or "embedded in EPContext node 'N'"
    std::shared_ptr<const ContextBinary> binary;
  };

  void claim(const OrtGraph* graph, OrtEpGraphSupportInfo* support);
  void claim_ordinary(const OrtGraph* graph, OrtEpGraphSupportInfo* support);
  void compile(const OrtGraph** graphs, const OrtNode** fused_nodes, size_t count, OrtNodeComputeInfo** infos,
               OrtNode** ep_context_nodes);
  // The fused nodes of an ordinary model, compiled into one context binary: held in memory, or,
  // when the session generates an EPContext model, written as the CLI writes it (shared across the
  // sessions of a group) with one EPContext node per fused node in `ep_context_nodes`.
  std::vector<std::unique_ptr<CompiledNode>> compile_ordinary(const std::vector<const OrtGraph*>& graphs,
                                                              const std::vector<const OrtNode*>& fused_nodes,
                                                              OrtNode** ep_context_nodes);
  // Why a node of this session cannot run (a virtual device, a compile-only session), or empty.
  std::string cannot_run() const;
  // Writes a shared compile group's binary (when it has graphs) and empties the workspace.
  void finish_group(CompileWorkspace& workspace);
  const LoadedBinary& load_main_context(const EpContextNode& node, const std::string& model_path);
  const LoadedBinary& keep(LoadedBinary loaded);
  LoadedBinary find_graph(const EpContextNode& node, const LoadedBinary* own) const;
  void log(OrtLoggingLevel level, const std::string& message) const;

  static const char* ORT_API_CALL GetNameImpl(const OrtEp* self) noexcept;
  static OrtStatus* ORT_API_CALL GetCapabilityImpl(OrtEp* self, const OrtGraph* graph,
                                                   OrtEpGraphSupportInfo* support) noexcept;
  static OrtStatus* ORT_API_CALL CompileImpl(OrtEp* self, const OrtGraph** graphs, const OrtNode** fused_nodes,
                                             size_t count, OrtNodeComputeInfo** infos,
                                             OrtNode** ep_context_nodes) noexcept;
  static void ORT_API_CALL ReleaseNodeComputeInfosImpl(OrtEp* self, OrtNodeComputeInfo** infos,
                                                       size_t count) noexcept;
  static const char* ORT_API_CALL GetCompiledModelCompatibilityInfoImpl(OrtEp* self,
                                                                        const OrtGraph* graph) noexcept;

  SessionConfig config_;
  const OrtLogger* logger_;
  std::vector<LoadedBinary> loaded_;
  std::unique_ptr<OrdinaryGraph> ordinary_;  // what the last GetCapability decided, until Compile
};

}  // namespace ctxgen::ort_ep

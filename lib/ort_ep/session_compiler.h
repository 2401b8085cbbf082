#pragma once
// Compiling the ordinary models a session is given (ones without this EP's EPContext nodes). The
// full plugin library does it as `ctxgen compile` would (compile_in_session.h); the runtime-only
// library, which links neither ONNX nor protobuf, has no compiler and leaves such nodes to ORT.

#include <onnxruntime_c_api.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ort_api.h"

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
  // ep.enable_weightless=1 (ORT's weightless mode, which ModelCompilationOptions_SetWeightlessEnabled
  // sets): the binary refers to the weights the model keeps in external data (external only).
  bool weightless = false;
  ContextDataFunctions data;     // the application's own storage for context binaries, if any
  // Where a weightless binary's source model is: given as bytes (SessionOptionsSetWeightlessSourceModelBuffer),
  // which say nothing of its folder; else where ep.context_source_model_path names it.
  bool source_model_bytes = false;
  std::optional<std::string> source_model_path;
  // The provider option cache_dir (ep.ctxgenref.cache_dir): the compile cache an ordinary model's
  // partitions are taken from and kept in (docs/ort-plugin-ep.md); empty: none.
  std::string cache_dir;

  static SessionConfig read(const OrtSessionOptions* options);
  // Why a node of this session cannot run (a virtual device, a compile-only session), or empty.
  std::string cannot_run() const;
};

class CompiledNode;

class SessionCompiler {
 public:
  virtual ~SessionCompiler() = default;
  // GetCapability on a graph without this EP's EPContext nodes: claims what the backend compiles.
  virtual void claim(const OrtGraph* graph, OrtEpGraphSupportInfo* support) = 0;
  // Compile of the fused nodes of the last claim, one CompiledNode each; with ep.context_enable=1
  // also their EPContext nodes in `ep_context_nodes` (as OrtEp::Compile hands it over).
  virtual std::vector<std::unique_ptr<CompiledNode>> compile(const std::vector<const OrtGraph*>& graphs,
                                                             const std::vector<const OrtNode*>& fused_nodes,
                                                             OrtNode** ep_context_nodes) = 0;
};

// Defined by each plugin library beside make_backend_runtime(): the compiler of one session, or
// nullptr when the library only runs compiled models.
std::unique_ptr<SessionCompiler> make_session_compiler(const SessionConfig& config, const OrtLogger* logger);

}  // namespace ctxgen::ort_ep

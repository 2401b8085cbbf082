#pragma once
// The OrtEp of one session. On a model with this EP's EPContext nodes it claims those and runs
// each with its graph of a context binary; an ordinary model goes to the library's session
// compiler, when it has one (session_compiler.h).

#include <onnxruntime_c_api.h>

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ctxgen/format.h"
#include "ep_context.h"
#include "session_compiler.h"

namespace ctxgen::ort_ep {

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
  void compile(const OrtGraph** graphs, const OrtNode** fused_nodes, size_t count, OrtNodeComputeInfo** infos,
               OrtNode** ep_context_nodes);
  const LoadedBinary& load_main_context(const EpContextNode& node, const std::string& model_path);
  std::filesystem::path source_folder(const EpContextNode& node, const std::filesystem::path& model_folder) const;
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
  static OrtStatus* ORT_API_CALL GetWeightlessSupportImpl(const OrtEp* self, OrtWeightlessSupport* support) noexcept;

  SessionConfig config_;
  const OrtLogger* logger_;
  std::vector<LoadedBinary> loaded_;
  std::unique_ptr<SessionCompiler> compiler_;  // null in a library that only runs compiled models
};

}  // namespace ctxgen::ort_ep

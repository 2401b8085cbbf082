// The `ref` backend's runtime-only plugin EP library (libctxgen_ort_ep_runtime.so, EP CtxgenRef):
// the shared EP code serving the ref runtime and no compiler, so that it links neither ONNX nor
// protobuf; ordinary models stay with ONNX Runtime.

#include "ctxgen/runtime.h"
#include "plugin_backend.h"
#include "session_compiler.h"

std::unique_ptr<ctxgen::BackendRuntime> ctxgen::ort_ep::make_backend_runtime() { return runtime::make_ref_runtime(); }
std::unique_ptr<ctxgen::ort_ep::SessionCompiler> ctxgen::ort_ep::make_session_compiler(const SessionConfig&,
                                                                                       const OrtLogger*) {
  return nullptr;
}

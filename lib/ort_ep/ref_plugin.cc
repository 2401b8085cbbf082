// The `ref` backend's plugin EP library (libctxgen_ort_ep.so, EP CtxgenRef): the shared EP code
// serving the ref runtime, and the ref compiler for the ordinary models a session is given.

#include "compile_in_session.h"
#include "ctxgen/backend.h"
#include "ctxgen/runtime.h"
#include "plugin_backend.h"

std::unique_ptr<ctxgen::BackendRuntime> ctxgen::ort_ep::make_backend_runtime() { return runtime::make_ref_runtime(); }
std::unique_ptr<ctxgen::ort_ep::SessionCompiler> ctxgen::ort_ep::make_session_compiler(const SessionConfig& config,
                                                                                       const OrtLogger* logger) {
  return compile_in_session(make_ref_backend(), config, logger);
}

// The `ref` backend's plugin EP library (libctxgen_ort_ep.so, EP CtxgenRef): the shared EP code
// serving the ref runtime and compiler.

#include "ctxgen/backend.h"
#include "ctxgen/runtime.h"
#include "plugin_backend.h"

std::unique_ptr<ctxgen::BackendRuntime> ctxgen::ort_ep::make_backend_runtime() { return runtime::make_ref_runtime(); }
std::unique_ptr<ctxgen::Backend> ctxgen::ort_ep::make_backend() { return make_ref_backend(); }

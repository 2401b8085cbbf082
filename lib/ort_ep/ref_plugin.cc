// The `ref` backend's plugin EP library (libctxgen_ort_ep.so, EP CtxgenRef): the shared EP code
// serving the ref runtime.

#include "ctxgen/runtime.h"
#include "plugin_backend.h"

std::unique_ptr<ctxgen::BackendRuntime> ctxgen::ort_ep::make_backend_runtime() { return runtime::make_ref_runtime(); }

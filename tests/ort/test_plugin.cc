// The test backend's plugin EP library: the shared EP code serving its runtime and compiler.

#include "plugin_backend.h"
#include "test_backend.h"

std::unique_ptr<ctxgen::BackendRuntime> ctxgen::ort_ep::make_backend_runtime() { return testing::make_test_runtime(); }
std::unique_ptr<ctxgen::Backend> ctxgen::ort_ep::make_backend() { return testing::make_test_backend(); }

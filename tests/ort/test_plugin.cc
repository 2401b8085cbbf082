// The test backend's plugin EP library: the shared EP code serving its runtime and compiler.

#include "compile_in_session.h"
#include "plugin_backend.h"
#include "test_backend.h"

std::unique_ptr<ctxgen::BackendRuntime> ctxgen::ort_ep::make_backend_runtime() { return testing::make_test_runtime(); }
std::unique_ptr<ctxgen::ort_ep::SessionCompiler> ctxgen::ort_ep::make_session_compiler(const SessionConfig& config,
                                                                                       const OrtLogger* logger) {
  return compile_in_session(testing::make_test_backend(), config, logger);
}

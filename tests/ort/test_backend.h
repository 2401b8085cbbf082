#pragma once
// A second backend, for the tests that prove backends are pluggable: the ref compiler and runtime
// under an identity of their own (EP CtxgenTest, SDK ctxgen-test 1.0). The pipeline, the plugin EP
// code and verify meet it only through the Backend and BackendRuntime interfaces, so whatever
// works for it works for a vendor's backend. Its plugin library is ctxgen_test_ep (test_plugin.cc).

#include <memory>

#include "ctxgen/backend.h"
#include "ctxgen/backend_runtime.h"

namespace ctxgen::testing {

BinaryIdentity test_identity();
std::unique_ptr<BackendRuntime> make_test_runtime();  // test_runtime.cc, in the plugin too
std::unique_ptr<Backend> make_test_backend();         // test_backend.cc: -e test, <stem>_test.bin; in the plugin too

// The model a backend is asked about, as text: every graph input, output, node (attributes with
// their defaults, in name order; nodes sorted), constant (type, dims and a hash of its bytes) and typed value,
// in a fixed order. With CTXGEN_TEST_BACKEND_MODELS=DIR set, the test backend writes it for the
// first model it is asked about to DIR/model.txt: how a test sees what the plugin's GetCapability
// handed it.
std::string describe_model(const Model& model);

}  // namespace ctxgen::testing

#pragma once
// A second backend, for the tests that prove backends are pluggable: the ref compiler and runtime
// under an identity of their own (EP CtxgenTest, SDK ctxgen-test 1.0). The pipeline, the plugin EP
// code and verify meet it only through the Backend and BackendRuntime interfaces, so whatever
// works for it works for a vendor's backend. Its plugin library is ctxgen_test_ep (test_plugin.cc).

#include <memory>

#include "ctxgen/backend_runtime.h"

namespace ctxgen {
class Backend;  // ctxgen/backend.h: the compile side, which the plugin library does without
}  // namespace ctxgen

namespace ctxgen::testing {

BinaryIdentity test_identity();
std::unique_ptr<BackendRuntime> make_test_runtime();  // test_runtime.cc, in the plugin too
std::unique_ptr<Backend> make_test_backend();         // test_backend.cc: -e test, <stem>_test.bin

}  // namespace ctxgen::testing

#include "ctxgen/runtime.h"
#include "test_backend.h"

namespace ctxgen::testing {
namespace {

class TestRuntime final : public BackendRuntime {
 public:
  BinaryIdentity identity() const override { return test_identity(); }
  std::unique_ptr<GraphRunner> load(std::shared_ptr<const ContextBinary> binary, const std::string& graph_name) const override {
    return ref_->load(std::move(binary), graph_name);
  }

 private:
  std::unique_ptr<BackendRuntime> ref_ = runtime::make_ref_runtime();
};

}  // namespace

BinaryIdentity test_identity() {
  BinaryIdentity identity = runtime::ref_identity();
  identity.backend = "CtxgenTest";
  identity.sdk_version = "ctxgen-test 1.0";
  return identity;
}

std::unique_ptr<BackendRuntime> make_test_runtime() { return std::make_unique<TestRuntime>(); }

}  // namespace ctxgen::testing

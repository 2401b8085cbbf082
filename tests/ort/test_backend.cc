#include "test_backend.h"

#include "ctxgen/backend.h"

namespace ctxgen::testing {
namespace {

class TestBackend final : public Backend {
 public:
  std::string name() const override { return "test"; }
  BinaryIdentity identity() const override { return test_identity(); }
  std::string description() const override { return "the ref backend under another identity, for tests"; }
  NodeSupport supports(const Model& model, const onnx::NodeProto& node) const override {
    return ref_->supports(model, node);
  }
  CompiledGraph compile(const Model& model, const Partition& partition, const std::string& graph_name,
                        WeightStore& store) const override {
    return ref_->compile(model, partition, graph_name, store);
  }

 private:
  std::unique_ptr<Backend> ref_ = make_ref_backend();
};

}  // namespace

std::unique_ptr<Backend> make_test_backend() { return std::make_unique<TestBackend>(); }

}  // namespace ctxgen::testing

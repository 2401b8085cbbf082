// The `ref` backend: a CPU reference that behaves like an NPU toolchain (static shapes, float32,
// a fixed op set, weight transforms and a static memory plan at compile time).

#include "ctxgen/backend.h"
#include "ctxgen/error.h"
#include "ctxgen/ref_identity.h"
#include "ctxgen/runtime.h"
#include "lower.h"
#include "node_view.h"
#include "normalise.h"

namespace ctxgen {
namespace {

class RefBackend final : public Backend {
 public:
  std::string name() const override { return ref::kBackendName; }
  BinaryIdentity identity() const override { return runtime::ref_identity(); }
  std::string description() const override {
    return "CPU reference NPU: float32 ops on static shapes, BatchNorm folding, activation fusion, "
           "static memory plan (docs/ops.md)";
  }

  void target(const std::string& level) const override { runtime::target_cpu(level); }
  void weightless(bool on) const override { weightless_ = on; }

  NodeSupport supports(const Model& model, const onnx::NodeProto& node) const override {
    try {
      refc::normalise_all(model, node);
      return NodeSupport::yes();
    } catch (const refc::Refusal& r) {
      return NodeSupport::no(r.reason);
    }
  }

  CompiledGraph compile(const Model& model, const Partition& partition, const std::string& graph_name,
                        WeightStore& store) const override {
    try {
      auto lowered = refc::lower_partition(model, partition, store, weightless_);
      CompiledGraph graph;
      graph.name = graph_name;
      graph.inputs = std::move(lowered.inputs);
      graph.outputs = std::move(lowered.outputs);
      graph.program = ref::serialize(lowered.program);
      graph.weight_ids = std::move(lowered.weight_ids);
      graph.node_count = partition.nodes.size();
      return graph;
    } catch (const Error& e) {
      throw e.within("partition '" + graph_name + "'");
    }
  }

  std::optional<std::vector<uint8_t>> renumber_weights(const std::vector<uint8_t>& program,
                                                       const std::function<uint32_t(uint32_t)>& id_of) const override {
    ref::Program p = ref::deserialize(program.data(), program.size());
    for (ref::Value& v : p.values)
      if (v.kind == ref::ValueKind::kWeight) v.index = id_of(static_cast<uint32_t>(v.index));
    return ref::serialize(p);
  }

 private:
  mutable bool weightless_ = false;
};

}  // namespace

std::unique_ptr<Backend> make_ref_backend() { return std::make_unique<RefBackend>(); }

}  // namespace ctxgen

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
  explicit RefBackend(const BackendSettings& settings) : target_{runtime::CpuTarget::of(settings.target), settings.weightless} {}

  std::string name() const override { return ref::kBackendName; }
  BinaryIdentity identity() const override {
    BinaryIdentity id = runtime::ref_identity();
    id.hardware_architecture = target_.cpu->architecture();
    return id;
  }
  std::string description() const override {
    return "CPU reference NPU: float32 ops on static shapes, BatchNorm folding, activation fusion, "
           "static memory plan (docs/ops.md)";
  }

  std::unique_ptr<Backend> with(const BackendSettings& settings) const override {
    return std::make_unique<RefBackend>(settings);
  }

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
      auto lowered = refc::lower_partition(model, partition, store, target_);
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

  std::optional<std::vector<uint64_t>> weight_reads(const std::vector<uint8_t>& program, size_t weight_count) const override {
    const ref::Program p = ref::deserialize(program.data(), program.size());
    runtime::validate(p, weight_count);  // bounds each weight's index
    std::vector<uint64_t> reads(weight_count);
    for (const ref::Value& v : p.values)
      if (v.kind == ref::ValueKind::kWeight) ++reads[v.index];
    return reads;
  }

 private:
  const refc::LowerTarget target_;
};

}  // namespace

std::unique_ptr<Backend> make_ref_backend(const BackendSettings& settings) { return std::make_unique<RefBackend>(settings); }

}  // namespace ctxgen

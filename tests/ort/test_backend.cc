#include "test_backend.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>

#include <onnx/defs/schema.h>

#include "ctxgen/backend.h"

namespace ctxgen::testing {
namespace {

std::string type_text(const ValueType* type) {
  if (type == nullptr) return "untyped";
  std::string text = std::to_string(type->elem_type);
  if (!type->dims) return text + "[?]";
  for (int64_t d : *type->dims) text += " " + std::to_string(d);
  return text;
}

// Writes the first model it is asked about to the folder CTXGEN_TEST_BACKEND_MODELS names.
void record(const Model& model) {
  const char* folder = std::getenv("CTXGEN_TEST_BACKEND_MODELS");
  if (folder == nullptr) return;
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  const std::filesystem::path file = std::filesystem::path(folder) / "model.txt";
  if (!std::filesystem::exists(file)) std::ofstream(file) << describe_model(model);
}

class TestBackend final : public Backend {
 public:
  std::string name() const override { return "test"; }
  BinaryIdentity identity() const override { return test_identity(); }
  std::string description() const override { return "the ref backend under another identity, for tests"; }
  std::unique_ptr<Backend> with(const BackendSettings& settings) const override {
    refuse_settings(settings);
    return std::make_unique<TestBackend>();
  }
  NodeSupport supports(const Model& model, const onnx::NodeProto& node) const override {
    record(model);
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

std::string describe_model(const Model& model) {
  const auto& graph = model.graph();
  std::string text;
  for (const auto& in : graph.input()) text += "input " + in.name() + ": " + type_text(model.type_of(in.name())) + "\n";
  for (const auto& out : graph.output()) text += "output " + out.name() + ": " + type_text(model.type_of(out.name())) + "\n";
  std::vector<std::string> nodes;  // sorted: ORT may order independent nodes differently
  for (onnx::NodeProto node : graph.node()) {
    // An attribute left out means its default: spelled out, a node reads the same either way.
    if (const auto* schema = onnx::OpSchemaRegistry::Schema(node.op_type(), default_opset(*model.proto), node.domain()))
      for (const auto& entry : schema->attributes()) {
        const bool set = std::any_of(node.attribute().begin(), node.attribute().end(),
                                     [&](const auto& a) { return a.name() == entry.first; });
        if (!set && entry.second.default_value.has_type()) *node.add_attribute() = entry.second.default_value;
      }
    if (node.domain().empty()) node.clear_domain();
    std::sort(node.mutable_attribute()->begin(), node.mutable_attribute()->end(),
              [](const auto& a, const auto& b) { return a.name() < b.name(); });
    nodes.push_back("node " + node.ShortDebugString() + "\n");
  }
  std::sort(nodes.begin(), nodes.end());
  for (const auto& line : nodes) text += line;
  const std::map<std::string, size_t> constants(model.constants.begin(), model.constants.end());
  for (const auto& [name, index] : constants) {
    const TensorData& data = model.weights[index].data;
    ValueType type{data.dtype, data.dims, {}};
    text += "constant " + name + ": " + type_text(&type) + " bytes " + xxh3_128(data.data, data.size).hex() + "\n";
  }
  const std::map<std::string, ValueType> types(model.value_types.begin(), model.value_types.end());
  for (const auto& [name, type] : types) text += "value " + name + ": " + type_text(&type) + "\n";
  return text;
}

}  // namespace ctxgen::testing

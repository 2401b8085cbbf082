#pragma once
// Builds small ONNX models in code and loads them through load_model, so the backend sees real
// shape-inferred Models. Shared by the backend tests.

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "ctxgen/backend.h"
#include "ctxgen/model.h"
#include "ctxgen/partition.h"

namespace ctxgen::testing {

class TestModel {
 public:
  explicit TestModel(int64_t opset = 17) {
    proto_.set_ir_version(8);
    auto* op = proto_.add_opset_import();
    op->set_domain("");
    op->set_version(opset);
    proto_.mutable_graph()->set_name("test");
  }

  // dims: -1 is a symbolic dim named "N".
  TestModel& input(const std::string& name, const std::vector<int64_t>& dims, int32_t type = onnx::TensorProto::FLOAT) {
    auto* v = proto_.mutable_graph()->add_input();
    v->set_name(name);
    auto* t = v->mutable_type()->mutable_tensor_type();
    t->set_elem_type(type);
    set_shape(*t, dims);
    return *this;
  }
  // The onnx checker needs a shape on graph outputs that inference cannot give (dims: -1 = "N").
  TestModel& output(const std::string& name, int32_t type = onnx::TensorProto::FLOAT,
                    const std::optional<std::vector<int64_t>>& dims = std::nullopt) {
    auto* v = proto_.mutable_graph()->add_output();
    v->set_name(name);
    auto* t = v->mutable_type()->mutable_tensor_type();
    t->set_elem_type(type);
    if (dims) set_shape(*t, *dims);
    return *this;
  }
  TestModel& floats(const std::string& name, const std::vector<int64_t>& dims, const std::vector<float>& values) {
    return raw(name, dims, onnx::TensorProto::FLOAT, values.data(), values.size() * 4);
  }
  TestModel& int64s(const std::string& name, const std::vector<int64_t>& dims, const std::vector<int64_t>& values) {
    return raw(name, dims, onnx::TensorProto::INT64, values.data(), values.size() * 8);
  }
  TestModel& int32s(const std::string& name, const std::vector<int64_t>& dims, const std::vector<int32_t>& values) {
    return raw(name, dims, onnx::TensorProto::INT32, values.data(), values.size() * 4);
  }
  // An initializer of any element type, from its little-endian bytes.
  TestModel& tensor(const std::string& name, const std::vector<int64_t>& dims, int32_t type, const std::vector<uint8_t>& bytes) {
    return raw(name, dims, type, bytes.data(), bytes.size());
  }
  TestModel& node(const std::string& op, const std::vector<std::string>& ins, const std::vector<std::string>& outs,
                  const std::string& domain = "") {
    auto* n = proto_.mutable_graph()->add_node();
    n->set_op_type(op);
    n->set_name(outs.empty() ? op : outs[0] + "_node");
    n->set_domain(domain);
    for (const auto& i : ins) n->add_input(i);
    for (const auto& o : outs) n->add_output(o);
    return *this;
  }
  // Attributes apply to the last node added.
  TestModel& attr(const std::string& name, int64_t v) {
    auto* a = new_attr(name, onnx::AttributeProto::INT);
    a->set_i(v);
    return *this;
  }
  TestModel& attr(const std::string& name, float v) {
    auto* a = new_attr(name, onnx::AttributeProto::FLOAT);
    a->set_f(v);
    return *this;
  }
  TestModel& attr(const std::string& name, const std::string& v) {
    auto* a = new_attr(name, onnx::AttributeProto::STRING);
    a->set_s(v);
    return *this;
  }
  TestModel& attr(const std::string& name, const onnx::GraphProto& g) {
    auto* a = new_attr(name, onnx::AttributeProto::GRAPH);
    *a->mutable_g() = g;
    return *this;
  }
  TestModel& attr(const std::string& name, const std::vector<int64_t>& v) {
    auto* a = new_attr(name, onnx::AttributeProto::INTS);
    for (int64_t x : v) a->add_ints(x);
    return *this;
  }

  onnx::ModelProto& proto() { return proto_; }

  Model load(const LoadOptions& options = {}) const {
    static std::atomic<int> counter{0};
    auto path = std::filesystem::temp_directory_path() /
                ("ctxgen_backend_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++) + ".onnx");
    {
      std::ofstream out(path, std::ios::binary);
      proto_.SerializeToOstream(&out);
    }
    struct Remove {
      std::filesystem::path path;
      ~Remove() { std::filesystem::remove(path); }
    } remove{path};  // also when loading throws
    return load_model(path, options);
  }

 private:
  TestModel& raw(const std::string& name, const std::vector<int64_t>& dims, int32_t type, const void* data, size_t size) {
    auto* t = proto_.mutable_graph()->add_initializer();
    t->set_name(name);
    t->set_data_type(type);
    for (int64_t d : dims) t->add_dims(d);
    t->set_raw_data(std::string(static_cast<const char*>(data), size));
    return *this;
  }
  static void set_shape(onnx::TypeProto_Tensor& t, const std::vector<int64_t>& dims) {
    auto* shape = t.mutable_shape();
    for (int64_t d : dims) {
      auto* dim = shape->add_dim();
      if (d < 0) dim->set_dim_param("N");
      else dim->set_dim_value(d);
    }
  }
  onnx::AttributeProto* new_attr(const std::string& name, onnx::AttributeProto::AttributeType type) {
    auto* a = proto_.mutable_graph()->mutable_node()->rbegin()->add_attribute();
    a->set_name(name);
    a->set_type(type);
    return a;
  }

  onnx::ModelProto proto_;
};

inline std::vector<uint8_t> bytes_of_floats(const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// A QDQ Conv as ONNX Runtime's quantizer lays it out: x quantized (uint8 or uint16) and
// dequantized, an int8 per-channel weight and an int32 bias through DequantizeLinear, the output
// quantized and dequantized again; `domain` is "" or com.microsoft.
// The bias scale is 0.005 and 0.001 as written, or exactly x_scale * w_scale in float32 with
// `exact_bias_scale` (as ONNX Runtime's quantizer computes it), which makes the unit fusable.
inline TestModel qdq_conv_unit(const std::string& domain, int32_t activation_type, const std::vector<uint8_t>& zero_point,
                               bool exact_bias_scale = false) {
  TestModel t(13);
  if (!domain.empty()) {
    auto* ms = t.proto().add_opset_import();
    ms->set_domain(domain);
    ms->set_version(1);
  }
  t.input("x", {1, 1, 3, 3})
      .floats("x_scale", {}, {0.05f})
      .tensor("x_zp", {}, activation_type, zero_point)
      .tensor("w", {2, 1, 2, 2}, onnx::TensorProto::INT8, {1, 2, 3, 4, 0xFF, 0xFE, 0xFD, 0x7F})
      .floats("w_scale", {2}, {0.1f, 0.02f})
      .tensor("w_zp", {2}, onnx::TensorProto::INT8, {0, 0})
      .tensor("b", {2}, onnx::TensorProto::INT32, {10, 0, 0, 0, 0xF6, 0xFF, 0xFF, 0xFF})
      .floats("b_scale", {2}, exact_bias_scale ? std::vector<float>{0.05f * 0.1f, 0.05f * 0.02f} : std::vector<float>{0.005f, 0.001f})
      .floats("y_scale", {}, {0.02f})
      .tensor("y_zp", {}, activation_type, zero_point)
      .node("QuantizeLinear", {"x", "x_scale", "x_zp"}, {"xq"}, domain)
      .node("DequantizeLinear", {"xq", "x_scale", "x_zp"}, {"xd"}, domain)
      .node("DequantizeLinear", {"w", "w_scale", "w_zp"}, {"wd"}, domain)
      .attr("axis", int64_t{0})
      .node("DequantizeLinear", {"b", "b_scale"}, {"bd"}, domain)
      .attr("axis", int64_t{0})
      .node("Conv", {"xd", "wd", "bd"}, {"c"})
      .node("QuantizeLinear", {"c", "y_scale", "y_zp"}, {"cq"}, domain)
      .node("DequantizeLinear", {"cq", "y_scale", "y_zp"}, {"y"}, domain)
      .output("y");
  return t;
}

// Support answer for the model's only (or first) node with the given op type.
inline NodeSupport support_of(const Model& m, const std::string& op_type) {
  auto backend = make_ref_backend();
  for (const auto& n : m.graph().node())
    if (n.op_type() == op_type) return backend->supports(m, n);
  ADD_FAILURE() << "no " << op_type << " node";
  return NodeSupport::no("no node");
}

// Every node of `m` in one partition, as the partitioner would form it; fails the test when
// some node is not supported or the graph splits.
inline Partition whole_graph(const Model& m) {
  auto backend = make_ref_backend();
  std::unordered_set<std::string> constants;
  for (const auto& [name, index] : m.constants) constants.insert(name);
  auto plan = partition_graph(m.graph(), constants, [&](size_t i) {
    return backend->supports(m, m.graph().node(static_cast<int>(i)));
  });
  for (const auto& cpu : plan.cpu_nodes) ADD_FAILURE() << "node " << cpu.node << " not supported: " << cpu.reason;
  if (plan.partitions.size() != 1) {
    ADD_FAILURE() << "expected one partition, got " << plan.partitions.size();
    return {};
  }
  return plan.partitions[0];
}

}  // namespace ctxgen::testing

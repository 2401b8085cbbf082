#include "float64.h"

#include <cstring>
#include <functional>
#include <map>
#include <regex>
#include <set>
#include <unordered_map>

#include "ctxgen/error.h"
#include "ctxgen/model.h"
#include "ctxgen/verify.h"

namespace ctxgen::verify {
namespace {

constexpr int32_t kFloat = onnx::TensorProto_DataType_FLOAT;
constexpr int32_t kDouble = onnx::TensorProto_DataType_DOUBLE;

// The types widened to float64: float32, and float16 and bfloat16 (a half-precision model's
// values are held exactly too, so the reference is exact arithmetic on its weights).
bool widened_type(int32_t type) {
  return type == kFloat || type == onnx::TensorProto_DataType_FLOAT16 || type == onnx::TensorProto_DataType_BFLOAT16;
}
// The in-memory "file" the widened weights are read from.
constexpr const char* kWeightsName = "ctxgen_float64.weights";
constexpr size_t kEmbeddedBytes = 4096;
const std::set<std::string> kRandomOps = {"Bernoulli", "Multinomial", "RandomNormal", "RandomNormalLike",
                                          "RandomUniform", "RandomUniformLike"};

// The values of `size` bytes of a widened type, as float64.
std::vector<uint8_t> widen(int32_t type, const uint8_t* data, size_t size) {
  const ElementKind kind = *element_kind(static_cast<ONNXTensorElementDataType>(type));
  std::vector<uint8_t> out(size / kind.size * 8);
  for (size_t i = 0; i < size / kind.size; ++i) {
    const double d = kind.read(data + kind.size * i);
    std::memcpy(out.data() + 8 * i, &d, 8);
  }
  return out;
}

onnx::AttributeProto* attribute_of(onnx::NodeProto& node, const char* name) {
  for (auto& a : *node.mutable_attribute())
    if (a.name() == name) return &a;
  return nullptr;
}

void widen_type(onnx::ValueInfoProto& value) {
  auto* type = value.mutable_type();
  if (type->has_tensor_type() && widened_type(type->tensor_type().elem_type())) type->mutable_tensor_type()->set_elem_type(kDouble);
}

// Declared types, casts to float and float-typed attributes become double, in subgraphs too, so
// the widened graph is consistent.
void widen_types(onnx::GraphProto& graph) {
  for (auto* list : {graph.mutable_input(), graph.mutable_output(), graph.mutable_value_info()})
    for (auto& v : *list) widen_type(v);
  for (auto& node : *graph.mutable_node()) {
    const bool onnx_op = is_onnx_domain(node.domain());
    // What makes float32 without saying so: ConstantOfShape's default value, the Mean and
    // InvStdDev of a normalisation (stash_type, default float).
    if (onnx_op && node.op_type() == "ConstantOfShape" && !attribute_of(node, "value")) {
      auto* a = node.add_attribute();
      a->set_name("value");
      a->set_type(onnx::AttributeProto_AttributeType_TENSOR);
      a->mutable_t()->set_data_type(kFloat);
      a->mutable_t()->add_dims(1);
      a->mutable_t()->add_float_data(0);
    }
    if (onnx_op && (node.op_type() == "LayerNormalization" || node.op_type() == "RMSNormalization") &&
        !attribute_of(node, "stash_type")) {
      auto* a = node.add_attribute();
      a->set_name("stash_type");
      a->set_type(onnx::AttributeProto_AttributeType_INT);
      a->set_i(kFloat);
    }
    for (auto& a : *node.mutable_attribute()) {
      if (onnx_op && (a.name() == "to" || a.name() == "dtype" || a.name() == "stash_type") &&
          widened_type(static_cast<int32_t>(a.i())))
        a.set_i(kDouble);
      // Cast-1 names the type
      if (onnx_op && a.name() == "to" && (a.s() == "FLOAT" || a.s() == "FLOAT16" || a.s() == "BFLOAT16")) a.set_s("DOUBLE");
      if (a.has_t() && widened_type(a.t().data_type()) && weight_ref(a.t()) < 0) {
        auto bytes = tensor_bytes(a.t());
        auto wide = widen(a.t().data_type(), bytes.data(), bytes.size());
        onnx::TensorProto t;
        t.set_name(a.t().name());
        *t.mutable_dims() = a.t().dims();
        t.set_data_type(kDouble);
        t.set_raw_data(wide.data(), wide.size());
        *a.mutable_t() = std::move(t);
      }
      if (a.has_g()) widen_types(*a.mutable_g());
      for (auto& g : *a.mutable_graphs()) widen_types(g);
    }
  }
}

// Float weights are widened. Large ones of the main graph move to one in-memory file. Small ones
// are embedded: ONNX Runtime's shape inference reads shapes, pads and axes only from the model
// itself. So are those of subgraphs: it reads their external data from real files only.
std::vector<char> move_weights(Model& model) {
  auto embedded = [](const Weight& w, size_t size) {
    return size <= kEmbeddedBytes || w.origin == WeightOrigin::kSubgraphInitializer ||
           w.origin == WeightOrigin::kSubgraphConstantNode;
  };
  auto wide_size = [](const Weight& w) {
    return !widened_type(w.data.dtype) ? w.data.size : w.data.size / element_size(w.data.dtype) * 8;
  };
  size_t total = 0;  // reserved: growing it would hold the old and the new copy at once
  for (const auto& w : model.weights)
    if (!embedded(w, wide_size(w))) total = (total + 63) / 64 * 64 + wide_size(w);
  std::vector<char> file;
  file.reserve(total);
  for (auto& w : model.weights) {
    std::vector<uint8_t> wide;
    const uint8_t* data = w.data.data;
    size_t size = w.data.size;
    if (widened_type(w.data.dtype)) {
      wide = widen(w.data.dtype, data, size);
      data = wide.data();
      size = wide.size();
      w.tensor->set_data_type(kDouble);
    }
    w.tensor->clear_external_data();
    if (embedded(w, size)) {
      w.tensor->set_data_location(onnx::TensorProto_DataLocation_DEFAULT);
      w.tensor->set_raw_data(data, size);
      continue;
    }
    file.resize((file.size() + 63) / 64 * 64);
    const size_t offset = file.size();
    file.insert(file.end(), data, data + size);
    w.tensor->set_data_location(onnx::TensorProto_DataLocation_EXTERNAL);
    for (auto [key, value] : {std::pair<const char*, std::string>{"location", kWeightsName},
                              {"offset", std::to_string(offset)}, {"length", std::to_string(size)}}) {
      auto* entry = w.tensor->add_external_data();
      entry->set_key(key);
      entry->set_value(value);
    }
  }
  return file;
}

// Names not yet used in the graph, for the values and nodes verify adds.
class Names {
 public:
  explicit Names(const onnx::GraphProto& graph) {
    for (const auto& node : graph.node()) {
      used_.insert(node.name());
      used_.insert(node.input().begin(), node.input().end());
      used_.insert(node.output().begin(), node.output().end());
    }
    for (const auto* list : {&graph.input(), &graph.output(), &graph.value_info()})
      for (const auto& v : *list) used_.insert(v.name());
    for (const auto& t : graph.initializer()) used_.insert(t.name());
  }
  std::string fresh(const std::string& base) {
    std::string name = base;
    for (size_t k = 1; !used_.insert(name).second; ++k) name = base + "_" + std::to_string(k);
    return name;
  }

 private:
  std::set<std::string> used_;
};

// Appends a node casting `from` to `to`, of element type `type`.
void add_cast(google::protobuf::RepeatedPtrField<onnx::NodeProto>& nodes, Names& names, const std::string& from,
              const std::string& to, int32_t type) {
  auto* c = nodes.Add();
  c->set_op_type("Cast");
  c->set_name(names.fresh(to + "/cast"));
  c->add_input(from);
  c->add_output(to);
  auto* a = c->add_attribute();
  a->set_name("to");
  a->set_type(onnx::AttributeProto_AttributeType_INT);
  a->set_i(type);
}

// Nodes of the kept op types read float32 and write float32, with casts from and to the widened
// values around them; one kept node reading another's output reads its float32 value directly.
void keep_float32(onnx::GraphProto& graph, const std::set<std::string>& kept, const std::function<bool(const std::string&)>& was_float,
                  Names names) {
  if (kept.empty()) return;
  google::protobuf::RepeatedPtrField<onnx::NodeProto> nodes;
  std::map<std::string, std::string> narrow_of;  // a float value -> its float32 twin
  auto cast = [&](const std::string& from, const std::string& to, int32_t type) { add_cast(nodes, names, from, to, type); };
  for (auto& node : *graph.mutable_node()) {
    if (!kept.count(node.op_type())) {
      *nodes.Add() = std::move(node);
      continue;
    }
    if (auto* stash = attribute_of(node, "stash_type"); stash != nullptr && stash->i() == kDouble) stash->set_i(kFloat);
    for (auto& input : *node.mutable_input()) {
      if (input.empty() || !was_float(input)) continue;
      auto [it, added] = narrow_of.emplace(input, std::string());
      if (added) {
        it->second = names.fresh(input + "/float32");
        cast(input, it->second, kFloat);
      }
      input = it->second;
    }
    std::vector<std::pair<std::string, std::string>> widened;  // (float32 output, its widened name)
    for (auto& output : *node.mutable_output()) {
      if (output.empty() || !was_float(output)) continue;
      const std::string narrow = names.fresh(output + "/float32");
      narrow_of[output] = narrow;
      widened.emplace_back(narrow, output);
      output = narrow;
    }
    *nodes.Add() = std::move(node);
    for (const auto& [narrow, wide] : widened) cast(narrow, wide, kDouble);
  }
  graph.mutable_node()->Swap(&nodes);
}

// Each Cast in `rounding` (by node name) casts to its half type again, and a Cast to float64 after
// it gives the widened value its consumers read.
void round_where_cast(onnx::GraphProto& graph, const std::map<std::string, int32_t>& rounding, Names& names) {
  if (rounding.empty()) return;
  google::protobuf::RepeatedPtrField<onnx::NodeProto> nodes;
  for (auto& node : *graph.mutable_node()) {
    auto it = rounding.find(node.name());
    if (it == rounding.end() || node.output_size() != 1) {
      *nodes.Add() = std::move(node);
      continue;
    }
    attribute_of(node, "to")->set_i(it->second);
    const std::string wide = node.output(0), half = names.fresh(wide + "/half");
    node.set_output(0, half);
    *nodes.Add() = std::move(node);
    add_cast(nodes, names, half, wide, kDouble);
  }
  graph.mutable_node()->Swap(&nodes);
}

// Which values of the main graph are float. Where onnx 1.12's inference left a type unknown (ops of
// newer opsets), a value made by an op whose first output has its first input's type takes that
// input's; a wrong guess only means ONNX Runtime refuses the model and verify falls back to float32.
class FloatValues {
 public:
  explicit FloatValues(const Model& model) : model_(model) {
    for (const auto& node : model.graph().node()) {
      // A DequantizeLinear makes float32 in either domain (onnx 1.12 types neither 16-bit form).
      const bool dequantizes = node.op_type() == "DequantizeLinear" &&
                               (is_onnx_domain(node.domain()) || node.domain() == "com.microsoft");
      // A Cast to a float type makes float.
      const auto* to = attribute_of(const_cast<onnx::NodeProto&>(node), "to");
      const bool casts_to_float = is_onnx_domain(node.domain()) && node.op_type() == "Cast" && to && widened_type(static_cast<int32_t>(to->i()));
      const auto other = kFollowsInput.find({is_onnx_domain(node.domain()) ? "" : node.domain(), node.op_type()});
      for (int i = 0; i < node.output_size(); ++i)
        if ((dequantizes || casts_to_float) && i == 0)
          made_float_.insert(node.output(i));
        else if (is_onnx_domain(node.domain()) && (i == 0 || node.op_type() == "Split") && kSameType.count(node.op_type()) &&
                 node.input_size() > 0)
          follows_[node.output(i)] = node.input(0);
        else if (i == 0 && other != kFollowsInput.end() && node.input_size() > other->second)
          follows_[node.output(i)] = node.input(other->second);
    }
  }
  bool operator()(const std::string& name) const {
    if (const Weight* w = model_.constant(name)) return widened_type(w->data.dtype);
    if (made_float_.count(name)) return true;
    const ValueType* type = model_.type_of(name);
    if (type != nullptr && type->elem_type != 0) return widened_type(type->elem_type);
    auto it = follows_.find(name);
    return it != follows_.end() && (*this)(it->second);
  }

 private:
  static inline const std::set<std::string> kSameType = {
      "Abs", "Add", "AveragePool", "BatchNormalization", "Clip", "Concat", "Conv", "ConvTranspose", "Cos", "DepthToSpace",
      "Div", "Erf", "Exp", "Expand", "Flatten", "Gather", "Gelu", "Gemm", "GlobalAveragePool", "GlobalMaxPool",
      "Identity", "InstanceNormalization", "LayerNormalization", "LeakyRelu", "Log", "MatMul", "Max", "MaxPool", "Min",
      "Mul", "Neg", "Pad", "Pow", "ReduceMax", "ReduceMean", "ReduceMin", "ReduceSum", "Relu", "Reshape", "Range", "Reciprocal", "Resize",
      "Sigmoid", "Sin", "Slice", "Softmax", "SpaceToDepth", "Split", "Sqrt", "Squeeze", "Sub", "Tanh", "Tile", "Transpose",
      "Trilu", "Unsqueeze"};
  // Ops (by domain, "" the default one, and type) whose output has the type of another input than
  // the first: Where's X, MatMulNBits' A, GatherBlockQuantized's scales.
  static inline const std::map<std::pair<std::string, std::string>, int> kFollowsInput = {
      {{"", "Where"}, 1}, {{"com.microsoft", "MatMulNBits"}, 0}, {{"com.microsoft", "GatherBlockQuantized"}, 2}};
  const Model& model_;
  std::unordered_map<std::string, std::string> follows_;
  std::set<std::string> made_float_;
};

// The node an ONNX Runtime load error names, in any of the ways it names one.
std::optional<std::string> named_node(const std::string& message) {
  static const std::regex patterns[] = {std::regex("node with name '([^']*)'"), std::regex("in node \\(([^)]*)\\)"),
                                        std::regex("Node \\(([^)]*)\\)")};
  std::smatch match;
  for (const auto& pattern : patterns)
    if (std::regex_search(message, match, pattern)) return match[1].str();
  return std::nullopt;
}

}  // namespace

Tensor widened(const Tensor& tensor) {
  if (!widened_type(tensor.type)) return tensor;
  return Tensor{ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE, tensor.dims, widen(tensor.type, tensor.bytes.data(), tensor.bytes.size())};
}

std::optional<Float64Reference> float64_reference(const std::filesystem::path& original, OrtHost& host, std::string& why) {
  Model model = load_model(original);
  // A widened random op draws other numbers: no reference to compare with.
  for (const auto& node : model.graph().node())
    if (is_onnx_domain(node.domain()) && kRandomOps.count(node.op_type())) {
      why = "it draws random numbers (" + node.op_type() + "), which a float64 run would draw differently";
      return std::nullopt;
    }
  // Every node named, uniquely, so ONNX Runtime's errors say which one it refuses.
  Names names(model.graph());
  for (auto& node : *model.proto->mutable_graph()->mutable_node())
    if (node.name().empty()) node.set_name(names.fresh("ctxgen_float64_node"));
  const FloatValues was_float(model);
  std::vector<char> weights = move_weights(model);
  // The model's own Casts to float16 or bfloat16 round, in the reference too: exact arithmetic
  // between them, but not through them.
  std::map<std::string, int32_t> rounding;  // node name -> the half type it casts to
  for (const auto& node : model.graph().node())
    if (const auto* to = attribute_of(const_cast<onnx::NodeProto&>(node), "to");
        is_onnx_domain(node.domain()) && node.op_type() == "Cast" && to && widened_type(static_cast<int32_t>(to->i())) &&
        to->i() != kFloat)
      rounding[node.name()] = static_cast<int32_t>(to->i());
  widen_types(*model.proto->mutable_graph());
  round_where_cast(*model.proto->mutable_graph(), rounding, names);
  std::set<std::string> kept;
  for (;;) {
    onnx::ModelProto attempt = *model.proto;
    keep_float32(*attempt.mutable_graph(), kept, was_float, names);
    try {
      return Float64Reference{host.cpu_session(attempt.SerializeAsString(), kWeightsName, weights),
                              std::vector<std::string>(kept.begin(), kept.end())};
    } catch (const Error& e) {
      why = e.what();
      auto name = named_node(why);
      std::string op;
      for (const auto& node : model.graph().node())
        if (name && node.name() == *name) op = node.op_type();
      if (const int64_t opset = default_opset(*model.proto); !op.empty() && opset < 6) {
        why += " (the model imports opset " + std::to_string(opset) +
               ": before opset 6 Cast names its type, a Cast ONNX Runtime does not run, so no op can be kept in float32)";
        return std::nullopt;
      }
      if (op.empty() || !kept.insert(op).second) return std::nullopt;
    }
  }
}

}  // namespace ctxgen::verify

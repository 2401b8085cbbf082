// Input types checked against each op's definition, as ONNX Runtime checks them when it loads a
// model: what it refuses to load (a QuantizeLinear zero point of int32, a DequantizeLinear whose
// zero point is not of its input's type, a QLinearConv bias of float) is refused here, instead of
// being left on CPU in a compiled model ONNX Runtime refuses in turn.

#include <algorithm>
#include <map>
#include <set>
#include <string>

#include <onnx/defs/data_type_utils.h>
#include <onnx/defs/schema.h>

#include "ctxgen/error.h"
#include "ctxgen/model.h"
#include "internal.h"

namespace fs = std::filesystem;

namespace ctxgen::model_detail {
namespace {

std::string type_text(int32_t elem_type) { return "tensor(" + onnx::Utils::DataTypeUtils::ToDataTypeString(elem_type) + ")"; }

// A type onnx 1.12 names (not 0, unknown; not a newer one, which its schemas cannot judge).
bool is_tensor_type(int32_t elem_type) { return elem_type > 0 && onnx::TensorProto_DataType_IsValid(elem_type); }

// Of the types onnx 1.12 names, those a QuantizeLinear zero point may have at the newest opset
// ONNX Runtime reads (8- and 16-bit integers since opset 21): the rule for a model beyond what
// onnx 1.12 knows, whose older schema would refuse types newer opsets allow. The types it does not
// name (4-bit, float8) are not checked.
bool quantizes_to(int32_t elem_type) {
  static const std::set<int32_t> kTypes = {onnx::TensorProto::INT8, onnx::TensorProto::UINT8, onnx::TensorProto::INT16,
                                           onnx::TensorProto::UINT16};
  return kTypes.count(elem_type) > 0;
}

class TypeCheck {
 public:
  TypeCheck(const fs::path& path, const onnx::GraphProto& graph, int64_t opset, bool beyond)
      : path_(path), opset_(opset), beyond_(beyond) {
    for (const auto& t : graph.initializer()) types_[t.name()] = t.data_type();
    for (const auto* list : {&graph.input(), &graph.value_info(), &graph.output()})
      for (const auto& v : *list)
        if (v.type().has_tensor_type()) types_.emplace(v.name(), v.type().tensor_type().elem_type());
  }

  void node(const onnx::NodeProto& node, size_t index) {
    if (!is_onnx_domain(node.domain())) return;
    const std::string who = "node " + (node.name().empty() ? "#" + std::to_string(index) : "'" + node.name() + "'") + " (" +
                            node.op_type() + ")";
    const auto type_of = [&](int i) {
      if (i >= node.input_size() || node.input(i).empty()) return 0;
      const auto it = types_.find(node.input(i));
      return it == types_.end() || !is_tensor_type(it->second) ? 0 : it->second;
    };
    // Whatever the opset: a zero point is of the type of what it quantizes.
    if (node.op_type() == "DequantizeLinear" && type_of(0) && type_of(2) && type_of(0) != type_of(2))
      refuse(who + ": input 2 '" + node.input(2) + "' (the zero point) is " + type_text(type_of(2)) + " where input 0 is " +
             type_text(type_of(0)) + ": a zero point has the type of the values it dequantizes");
    if (node.op_type() == "QuantizeLinear" && type_of(2) && !quantizes_to(type_of(2)))
      refuse(who + ": input 2 '" + node.input(2) + "' (the zero point) is " + type_text(type_of(2)) +
             ", which no QuantizeLinear takes (a zero point is an 8-, 16- or 4-bit integer or a float8)");
    // Beyond opset 17 an op may take types onnx 1.12's schema of it does not list (bfloat16,
    // strings for Equal, ...): only the rules above, which hold at every opset, apply there.
    if (beyond_ || !known_to_onnx(node, beyond_)) return;
    const onnx::OpSchema* schema = onnx::OpSchemaRegistry::Schema(node.op_type(), static_cast<int>(opset_), "");
    if (schema == nullptr || schema->inputs().empty()) return;
    std::map<std::string, std::pair<onnx::DataType, int>> bound;  // type parameter -> the first input's type
    const auto& formals = schema->inputs();
    for (int i = 0; i < node.input_size(); ++i) {
      const bool variadic = formals.back().GetOption() == onnx::OpSchema::Variadic;
      if (static_cast<size_t>(i) >= formals.size() && !variadic) break;
      const auto& formal = formals[std::min(static_cast<size_t>(i), formals.size() - 1)];
      if (!type_of(i)) continue;
      onnx::TypeProto proto;
      proto.mutable_tensor_type()->set_elem_type(type_of(i));
      const onnx::DataType type = onnx::Utils::DataTypeUtils::ToType(proto);
      if (!formal.GetTypes().empty() && formal.GetTypes().count(type) == 0)
        refuse(who + ": input " + std::to_string(i) + " '" + node.input(i) + "' is " + *type + ", which " + node.op_type() +
               " (opset " + std::to_string(schema->since_version()) + ") does not take as " + formal.GetTypeStr());
      const bool homogeneous = static_cast<size_t>(i) < formals.size() - 1 || !variadic || formal.GetIsHomogeneous();
      if (!homogeneous) continue;
      const auto [first, fresh] = bound.emplace(formal.GetTypeStr(), std::make_pair(type, i));
      if (!fresh && first->second.first != type)
        refuse(who + ": input " + std::to_string(i) + " '" + node.input(i) + "' is " + *type + " where input " +
               std::to_string(first->second.second) + " is " + *first->second.first + "; both are " + formal.GetTypeStr() +
               ", one type");
    }
  }

 private:
  [[noreturn]] void refuse(const std::string& why) const {
    throw Error(ErrorCode::kInvalidModel, path_.string() + ": " + why + " (ONNX Runtime refuses to load such a model)");
  }

  const fs::path& path_;
  int64_t opset_;
  bool beyond_;
  std::map<std::string, int32_t> types_;
};

}  // namespace

void check_input_types(const fs::path& path, const onnx::ModelProto& model) {
  const bool beyond = beyond_onnx(model);
  TypeCheck check(path, model.graph(), std::min(default_opset(model), kOnnxOpset), beyond);
  for (int i = 0; i < model.graph().node_size(); ++i) check.node(model.graph().node(i), static_cast<size_t>(i));
}

}  // namespace ctxgen::model_detail

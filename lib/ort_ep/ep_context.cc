#include "ep_context.h"

#include "ctxgen/error.h"
#include "plugin_backend.h"
#include "ort_api.h"

namespace ctxgen::ort_ep {
namespace {

constexpr const char* kEpContextOp = "EPContext";
constexpr const char* kMsDomain = "com.microsoft";

bool read_flag(const OrtNode* node, const std::string& name, const char* attribute) {
  const int64_t value = int_attribute(node, attribute).value_or(1);  // both default to 1
  if (value != 0 && value != 1) {
    throw Error(ErrorCode::kInvalidModel, "EPContext node '" + name + "': attribute '" + attribute +
                                              "' is " + std::to_string(value) + ", expected 0 or 1");
  }
  return value == 1;
}

void check_one_version(const std::string& node, const char* attribute, const std::optional<std::string>& found,
                       const std::string& expected) {
  if (found && *found != expected) {
    throw Error(ErrorCode::kMismatch, "EPContext node '" + node + "': attribute " + attribute + " is '" +
                                          *found + "' but this EP is '" + expected + "'");
  }
}

void check_values(const EpContextNode& node, const std::string& graph_label, const char* direction,
                  const std::vector<const OrtValueInfo*>& values, const std::vector<IoSignature>& signature) {
  const std::string where = "EPContext node '" + node.name + "'";
  if (values.size() != signature.size()) {
    throw Error(ErrorCode::kMismatch, where + " has " + std::to_string(values.size()) + " " + direction +
                                          "s but " + graph_label + " has " + std::to_string(signature.size()));
  }
  for (size_t i = 0; i < values.size(); ++i) {
    const IoSignature& expected = signature[i];
    const std::string value = where + ": " + direction + " " + std::to_string(i);
    if (values[i] == nullptr) {
      throw Error(ErrorCode::kMismatch, value + " is missing; " + graph_label + " needs '" + expected.name + "'");
    }
    const std::string named = value + " '" + value_name(values[i]) + "'";
    const DeclaredTensor declared = value_type(values[i]);
    if (declared.elem_type != expected.elem_type) {
      throw Error(ErrorCode::kMismatch, named + " has element type " + elem_type_name(declared.elem_type) +
                                            " but " + graph_label + " " + direction + " '" + expected.name +
                                            "' is " + elem_type_name(expected.elem_type));
    }
    // Unknown rank or symbolic dims are left to the run-time check on the actual tensors.
    if (!declared.dims) continue;
    bool differs = declared.dims->size() != expected.dims.size();
    for (size_t d = 0; !differs && d < expected.dims.size(); ++d) {
      differs = (*declared.dims)[d] >= 0 && (*declared.dims)[d] != expected.dims[d];
    }
    if (differs) {
      throw Error(ErrorCode::kMismatch, named + " has shape " + dims_string(*declared.dims) + " but " +
                                            graph_label + " " + direction + " '" + expected.name + "' is " +
                                            dims_string(expected.dims));
    }
  }
}

}  // namespace

bool is_our_ep_context_node(const OrtNode* node) {
  if (node_op_type(node) != kEpContextOp || node_domain(node) != kMsDomain) return false;
  // A node of ours with a malformed `source` is not ours; someone else may claim it.
  try {
    return string_attribute(node, "source") == backend_identity().backend;
  } catch (const Error&) {
    return false;
  }
}

EpContextNode EpContextNode::read(const OrtNode* ort_node) {
  EpContextNode node;
  node.name = node_name(ort_node);
  node.main_context = read_flag(ort_node, node.name, "main_context");
  node.embed_mode = read_flag(ort_node, node.name, "embed_mode");
  node.cache_context = string_attribute(ort_node, "ep_cache_context").value_or("");
  node.partition_name = string_attribute(ort_node, "partition_name").value_or("");
  node.ep_sdk_version = string_attribute(ort_node, "ep_sdk_version");
  node.hardware_architecture = string_attribute(ort_node, "hardware_architecture");
  node.onnx_model_filename = string_attribute(ort_node, "onnx_model_filename");
  if (node.graph_name().empty()) {
    throw Error(ErrorCode::kInvalidModel,
                "an EPContext node of this EP has neither a name nor a partition_name, so it names no graph");
  }
  return node;
}

void EpContextNode::check_versions() const {
  check_one_version(name, "ep_sdk_version", ep_sdk_version, backend_identity().sdk_version);
  if (!hardware_architecture) return;
  BinaryIdentity recorded = backend_identity();
  recorded.hardware_architecture = *hardware_architecture;
  const Judgement judged = backend_runtime().judge(recorded);
  if (judged.fit == Fit::kUnsupported)
    throw Error(ErrorCode::kMismatch, "EPContext node '" + name + "': attribute " + judged.why);
}

Judgement check_binary_identity(const ContextBinary& binary, const std::string& label) {
  // The reader already refused any format version but its own, naming both.
  Judgement judged = backend_runtime().judge(binary.identity());
  if (judged.fit == Fit::kUnsupported) throw Error(ErrorCode::kMismatch, "context binary " + label + ": " + judged.why);
  return judged;
}

void check_signature(const EpContextNode& node, const GraphRecord& graph, const std::string& label,
                     const std::vector<const OrtValueInfo*>& inputs,
                     const std::vector<const OrtValueInfo*>& outputs) {
  const std::string graph_label = "graph '" + graph.name + "' in " + label;
  check_values(node, graph_label, "input", inputs, ctxgen::node_inputs(graph));
  check_values(node, graph_label, "output", outputs, graph.outputs);
}

std::string elem_type_name(int32_t elem_type) {
  switch (elem_type) {
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT: return "float32";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8: return "uint8";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8: return "int8";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32: return "int32";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64: return "int64";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL: return "bool";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16: return "float16";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE: return "float64";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED: return "undefined (not a tensor)";
    default: return "type " + std::to_string(elem_type);
  }
}

std::string dims_string(const std::vector<int64_t>& dims) {
  std::string text = "[";
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i > 0) text += ",";
    text += dims[i] < 0 ? std::string("?") : std::to_string(dims[i]);
  }
  return text + "]";
}

}  // namespace ctxgen::ort_ep

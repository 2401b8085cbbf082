#include "ort_model.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <unordered_set>

#include "ctxgen/embedded.h"
#include "ctxgen/error.h"
#include "ort_api.h"

namespace ctxgen::ort_ep {
namespace {

using TypeShape = std::unique_ptr<OrtTensorTypeAndShapeInfo, void (*)(OrtTensorTypeAndShapeInfo*)>;

TypeShape type_shape_of(const OrtValue* value) {
  OrtTensorTypeAndShapeInfo* info = nullptr;
  check(api().ort->GetTensorTypeAndShape(value, &info), "GetTensorTypeAndShape");
  return TypeShape(info, [](OrtTensorTypeAndShapeInfo* i) { api().ort->ReleaseTensorTypeAndShapeInfo(i); });
}

std::vector<int64_t> dims_of(const OrtTensorTypeAndShapeInfo* info) {
  size_t rank = 0;
  check(api().ort->GetDimensionsCount(info, &rank), "GetDimensionsCount");
  std::vector<int64_t> dims(rank);
  if (rank > 0) check(api().ort->GetDimensions(info, dims.data(), rank), "GetDimensions");
  return dims;
}

// The declared type of a value: ORT's element types are ONNX's, so the numbers carry over; an
// open dim keeps its symbol, when ORT knows one, so --fix-dim style names stay visible in reasons.
bool set_type(const OrtValueInfo* value, onnx::TypeProto& type) {
  const OrtTypeInfo* info = nullptr;
  check(api().ort->GetValueInfoTypeInfo(value, &info), "GetValueInfoTypeInfo");
  if (info == nullptr) return false;
  const OrtTensorTypeAndShapeInfo* tensor = nullptr;
  check(api().ort->CastTypeInfoToTensorInfo(info, &tensor), "CastTypeInfoToTensorInfo");
  if (tensor == nullptr) return false;
  ONNXTensorElementDataType elem = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  check(api().ort->GetTensorElementType(tensor, &elem), "GetTensorElementType");
  auto& out = *type.mutable_tensor_type();
  out.set_elem_type(static_cast<int32_t>(elem));
  if (!api().ort->TensorTypeAndShape_HasShape(tensor)) return true;
  const std::vector<int64_t> dims = dims_of(tensor);
  std::vector<const char*> symbols(dims.size(), nullptr);
  if (!dims.empty()) check(api().ort->GetSymbolicDimensions(tensor, symbols.data(), symbols.size()), "GetSymbolicDimensions");
  auto& shape = *out.mutable_shape();
  for (size_t i = 0; i < dims.size(); ++i) {
    auto& dim = *shape.add_dim();
    if (dims[i] >= 0) dim.set_dim_value(dims[i]);
    else if (symbols[i] != nullptr && symbols[i][0] != '\0') dim.set_dim_param(symbols[i]);
  }
  return true;
}

onnx::ValueInfoProto value_info(const OrtValueInfo* value) {
  onnx::ValueInfoProto info;
  info.set_name(value_name(value));
  set_type(value, *info.mutable_type());
  return info;
}

// A tensor's bytes into `tensor`: copied when shape inference may read them (small, or integers
// for shape arithmetic, the rule the file loader follows) or when there is no `parsed` to hold a
// view, otherwise a view of ORT's memory.
void take_tensor(const OrtValue* value, const std::string& name, onnx::TensorProto& tensor, ParsedModel* parsed,
                 bool view_small = false) {
  tensor.set_name(name);
  const TypeShape info = type_shape_of(value);
  ONNXTensorElementDataType elem = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  check(api().ort->GetTensorElementType(info.get(), &elem), "GetTensorElementType");
  tensor.set_data_type(static_cast<int32_t>(elem));
  const std::vector<int64_t> dims = dims_of(info.get());
  for (int64_t d : dims) tensor.add_dims(d);
  if (elem == ONNX_TENSOR_ELEMENT_DATA_TYPE_STRING) {
    size_t elements = 0;
    check(api().ort->GetTensorShapeElementCount(info.get(), &elements), "GetTensorShapeElementCount");
    size_t bytes = 0;
    check(api().ort->GetStringTensorDataLength(value, &bytes), "GetStringTensorDataLength");
    std::string text(bytes, '\0');
    std::vector<size_t> offsets(elements);
    if (elements > 0)
      check(api().ort->GetStringTensorContent(value, text.data(), bytes, offsets.data(), elements), "GetStringTensorContent");
    for (size_t i = 0; i < elements; ++i) {
      const size_t end = i + 1 < elements ? offsets[i + 1] : bytes;
      tensor.add_string_data(text.substr(offsets[i], end - offsets[i]));
    }
    return;
  }
  size_t size = 0;
  check(api().ort->GetTensorSizeInBytes(value, &size), "GetTensorSizeInBytes");
  const void* data = nullptr;
  if (size > 0) check(api().ort->GetTensorData(value, &data), "GetTensorData");
  const bool integer = elem == ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64 || elem == ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32;
  if (parsed == nullptr || integer || (size < kMinEmbeddedView && !view_small)) {
    tensor.set_raw_data(static_cast<const char*>(data), size);
    return;
  }
  TensorData view;
  view.dtype = tensor.data_type();
  view.dims = dims;
  view.data = static_cast<const uint8_t*>(data);
  view.size = size;
  mark_held(tensor, parsed->held.size());
  parsed->held.push_back(std::move(view));
}

template <typename T>
T read_one(const OrtOpAttr* attr, OrtOpAttrType type) {
  T value{};
  size_t size = 0;
  check(api().ort->ReadOpAttr(attr, type, &value, sizeof(value), &size), "ReadOpAttr");
  return value;
}

// An INTS or FLOATS attribute: the first call only reports the size (and fails for want of room).
template <typename T>
std::vector<T> read_array(const OrtOpAttr* attr, OrtOpAttrType type) {
  size_t bytes = 0;
  OrtStatus* sizing = api().ort->ReadOpAttr(attr, type, nullptr, 0, &bytes);
  if (sizing != nullptr) api().ort->ReleaseStatus(sizing);
  std::vector<T> values(bytes / sizeof(T));
  if (!values.empty()) check(api().ort->ReadOpAttr(attr, type, values.data(), bytes, &bytes), "ReadOpAttr");
  return values;
}

// ORT hands a list of strings out NUL-terminated, back to back.
std::vector<std::string> read_strings(const OrtOpAttr* attr, OrtOpAttrType type) {
  size_t bytes = 0;
  OrtStatus* sizing = api().ort->ReadOpAttr(attr, type, nullptr, 0, &bytes);
  if (sizing != nullptr) api().ort->ReleaseStatus(sizing);
  std::string text(bytes, '\0');
  if (bytes > 0) check(api().ort->ReadOpAttr(attr, type, text.data(), bytes, &bytes), "ReadOpAttr");
  // One string is handed out whole, NULs and all; ORT versions differ on adding a terminator.
  if (type == ORT_OP_ATTR_STRING) {
    if (!text.empty() && text.back() == '\0') text.pop_back();
    return {text};
  }
  std::vector<std::string> values;
  size_t start = 0;
  for (size_t i = 0; i < bytes; ++i) {
    if (text[i] != '\0') continue;
    values.push_back(text.substr(start, i - start));
    start = i + 1;
  }
  if (start < bytes) values.push_back(text.substr(start, bytes - start));
  return values;
}

// Copies one attribute; false for a graph attribute, which the caller handles.
bool copy_attribute(const OrtOpAttr* attr, onnx::AttributeProto& out) {
  const char* name = nullptr;
  check(api().ort->OpAttr_GetName(attr, &name), "OpAttr_GetName");
  OrtOpAttrType type = ORT_OP_ATTR_UNDEFINED;
  check(api().ort->OpAttr_GetType(attr, &type), "OpAttr_GetType");
  out.set_name(name);
  switch (type) {
    case ORT_OP_ATTR_INT:
      out.set_type(onnx::AttributeProto::INT);
      out.set_i(read_one<int64_t>(attr, type));
      return true;
    case ORT_OP_ATTR_FLOAT:
      out.set_type(onnx::AttributeProto::FLOAT);
      out.set_f(read_one<float>(attr, type));
      return true;
    case ORT_OP_ATTR_INTS:
      out.set_type(onnx::AttributeProto::INTS);
      for (int64_t v : read_array<int64_t>(attr, type)) out.add_ints(v);
      return true;
    case ORT_OP_ATTR_FLOATS:
      out.set_type(onnx::AttributeProto::FLOATS);
      for (float v : read_array<float>(attr, type)) out.add_floats(v);
      return true;
    case ORT_OP_ATTR_STRING:
      out.set_type(onnx::AttributeProto::STRING);
      if (auto values = read_strings(attr, type); !values.empty()) out.set_s(values.front());
      return true;
    case ORT_OP_ATTR_STRINGS:
      out.set_type(onnx::AttributeProto::STRINGS);
      for (auto& s : read_strings(attr, type)) out.add_strings(std::move(s));
      return true;
    case ORT_OP_ATTR_TENSOR: {
      OrtValue* value = nullptr;
      check(api().ort->OpAttr_GetTensorAttributeAsOrtValue(attr, &value), "OpAttr_GetTensorAttributeAsOrtValue");
      std::unique_ptr<OrtValue, void (*)(OrtValue*)> owned(value, [](OrtValue* v) { api().ort->ReleaseValue(v); });
      out.set_type(onnx::AttributeProto::TENSOR);
      take_tensor(value, "", *out.mutable_t(), nullptr);  // a copy ORT made for us, released here
      return true;
    }
    default:
      return false;
  }
}

size_t count_subgraphs(const OrtNode* node) {
  size_t count = 0;
  check(api().ort->Node_GetNumSubgraphs(node, &count), "Node_GetNumSubgraphs");
  return count;
}

void add_node(const OrtNode* node, onnx::GraphProto& graph) {
  auto& out = *graph.add_node();
  out.set_name(node_name(node));
  out.set_op_type(node_op_type(node));
  if (std::string domain = node_domain(node); !domain.empty()) out.set_domain(domain);
  for (const OrtValueInfo* in : node_inputs(node)) out.add_input(in == nullptr ? std::string() : value_name(in));
  for (const OrtValueInfo* o : node_outputs(node)) out.add_output(o == nullptr ? std::string() : value_name(o));
  if (count_subgraphs(node) > 0) {
    // What it reads from outside through its subgraphs is part of what it depends on.
    for (const OrtValueInfo* read : node_implicit_inputs(node)) out.add_input(value_name(read));
    out.set_domain(kOpaqueDomain);
    return;
  }
  size_t count = 0;
  check(api().ort->Node_GetNumAttributes(node, &count), "Node_GetNumAttributes");
  std::vector<const OrtOpAttr*> attributes(count);
  if (count > 0) check(api().ort->Node_GetAttributes(node, attributes.data(), count), "Node_GetAttributes");
  for (const OrtOpAttr* attr : attributes) {
    onnx::AttributeProto copy;
    if (copy_attribute(attr, copy)) *out.add_attribute() = std::move(copy);
  }
}

}  // namespace

std::vector<const OrtNode*> model_order(const OrtGraph* graph) {
  const std::vector<const OrtNode*> topological = graph_nodes(graph);
  std::vector<std::pair<size_t, const OrtNode*>> by_id;
  for (const OrtNode* node : topological) {
    size_t id = 0;
    check(api().ort->Node_GetId(node, &id), "Node_GetId");
    by_id.emplace_back(id, node);
  }
  std::sort(by_id.begin(), by_id.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  // Nodes ORT inserted get later numbers than the nodes that read them: then its order it is.
  std::unordered_set<std::string> produced;
  for (const auto& [id, node] : by_id)
    for (const OrtValueInfo* out : node_outputs(node))
      if (out != nullptr) produced.insert(value_name(out));
  std::unordered_set<std::string> ready;
  std::vector<const OrtNode*> ordered;
  for (const auto& [id, node] : by_id) {
    std::vector<const OrtValueInfo*> reads = node_inputs(node);
    for (const OrtValueInfo* read : node_implicit_inputs(node)) reads.push_back(read);
    for (const OrtValueInfo* in : reads)
      if (in != nullptr && produced.count(value_name(in)) && !ready.count(value_name(in))) return topological;
    for (const OrtValueInfo* out : node_outputs(node))
      if (out != nullptr) ready.insert(value_name(out));
    ordered.push_back(node);
  }
  return ordered;
}

std::string graph_label(const OrtGraph* graph) {
  const std::string path = graph_model_path(graph);
  return path.empty() ? std::string("<model in memory>") : path;
}

namespace {

using ExternalInfo = std::unique_ptr<OrtExternalInitializerInfo, void (*)(OrtExternalInitializerInfo*)>;

// Where ORT read an initializer from, when that is external data.
ExternalInfo external_info(const OrtValueInfo* v) {
  OrtExternalInitializerInfo* info = nullptr;
  check(api().ort->ValueInfo_GetExternalInitializerInfo(v, &info), "ValueInfo_GetExternalInitializerInfo");
  return ExternalInfo(info, [](OrtExternalInitializerInfo* i) {
    if (i != nullptr) api().ort->ReleaseExternalInitializerInfo(i);
  });
}

// The file `info` names, canonical (its path is relative to the model's canonical `folder`); empty
// when it cannot be resolved.
std::filesystem::path external_file(const OrtExternalInitializerInfo* info, const std::filesystem::path& folder) {
  std::error_code ec;
  const std::filesystem::path file =
      std::filesystem::weakly_canonical(folder / api().ort->ExternalInitializerInfo_GetFilePath(info), ec);
  return ec ? std::filesystem::path() : file;
}

// Makes the view `held` (of ORT's memory) a view of the external data `info` says ORT read it from,
// when that is a file inside the model's folder.
void view_external_file(const OrtExternalInitializerInfo* info, const std::filesystem::path& folder, TensorData& held,
                        std::map<std::filesystem::path, std::shared_ptr<const MappedFile>>& files) {
  const std::filesystem::path file = external_file(info, folder);
  const int64_t offset = api().ort->ExternalInitializerInfo_GetFileOffset(info);
  const std::filesystem::path inside = file.lexically_relative(folder);
  if (file.empty() || inside.empty() || *inside.begin() == ".." || offset < 0 ||
      api().ort->ExternalInitializerInfo_GetByteSize(info) != held.size)
    return;
  auto& mapped = files[file];
  if (!mapped) mapped = MappedFile::open(file);
  if (static_cast<uint64_t>(offset) > mapped->size() || mapped->size() - static_cast<uint64_t>(offset) < held.size) return;
  held.data = mapped->data() + offset;
  held.owner = mapped;
  held.file = mapped;
  held.file_offset = static_cast<size_t>(offset);
}

}  // namespace

std::set<std::filesystem::path> external_data_files(const OrtGraph* graph) {
  std::set<std::filesystem::path> files;
  const std::string model_path = graph_model_path(graph);
  if (model_path.empty()) return files;
  const std::filesystem::path folder = external_data_folder(model_path);
  for (const OrtValueInfo* v : graph_initializers(graph)) {
    const ExternalInfo info = external_info(v);
    if (info) files.insert(external_file(info.get(), folder));
  }
  return files;
}

ParsedModel parse_ort_graph(const OrtGraph* graph, bool external_views) {
  ParsedModel parsed;
  parsed.proto = std::make_unique<onnx::ModelProto>();
  auto& model = *parsed.proto;
  int64_t ir_version = 0;
  check(api().ort->Graph_GetOnnxIRVersion(graph, &ir_version), "Graph_GetOnnxIRVersion");
  model.set_ir_version(ir_version);
  size_t opsets = 0;
  check(api().ort->Graph_GetNumOperatorSets(graph, &opsets), "Graph_GetNumOperatorSets");
  std::vector<const char*> domains(opsets);
  std::vector<int64_t> versions(opsets);
  if (opsets > 0) check(api().ort->Graph_GetOperatorSets(graph, domains.data(), versions.data(), opsets), "Graph_GetOperatorSets");
  for (size_t i = 0; i < opsets; ++i) {
    auto& opset = *model.add_opset_import();
    opset.set_domain(domains[i]);
    opset.set_version(versions[i]);
  }
  auto& g = *model.mutable_graph();
  const char* name = nullptr;
  check(api().ort->Graph_GetName(graph, &name), "Graph_GetName");
  g.set_name(name == nullptr || name[0] == '\0' ? "main" : name);

  for (const OrtValueInfo* v : graph_inputs(graph)) *g.add_input() = value_info(v);
  for (const OrtValueInfo* v : graph_outputs(graph)) *g.add_output() = value_info(v);
  const std::string model_path = graph_model_path(graph);
  const bool views = external_views && !model_path.empty();
  const std::filesystem::path folder = views ? external_data_folder(model_path) : std::filesystem::path();
  std::map<std::filesystem::path, std::shared_ptr<const MappedFile>> files;
  for (const OrtValueInfo* v : graph_initializers(graph)) {
    const OrtValue* value = nullptr;
    check(api().ort->ValueInfo_GetInitializerValue(v, &value), "ValueInfo_GetInitializerValue");
    if (value == nullptr) continue;
    const size_t held = parsed.held.size();
    ExternalInfo info(nullptr, [](OrtExternalInitializerInfo*) {});
    if (views) info = external_info(v);
    take_tensor(value, value_name(v), *g.add_initializer(), &parsed, info != nullptr);
    if (info && parsed.held.size() > held) view_external_file(info.get(), folder, parsed.held.back(), files);
  }

  bool opaque = false;
  std::unordered_set<std::string> declared;
  for (const auto& v : g.input()) declared.insert(v.name());
  for (const auto& v : g.output()) declared.insert(v.name());
  for (const OrtNode* node : model_order(graph)) {
    add_node(node, g);
    opaque = opaque || g.node(g.node_size() - 1).domain() == kOpaqueDomain;
    for (const OrtValueInfo* o : node_outputs(node)) {
      if (o == nullptr) continue;
      onnx::ValueInfoProto info = value_info(o);
      if (info.has_type() && declared.insert(info.name()).second) *g.add_value_info() = std::move(info);
    }
  }
  if (opaque) {
    auto& opset = *model.add_opset_import();
    opset.set_domain(kOpaqueDomain);
    opset.set_version(1);
  }
  return parsed;
}

}  // namespace ctxgen::ort_ep

#include "ort_api.h"

#include <exception>
#include <memory>

#include "ctxgen/error.h"

ORT_RUNTIME_CLASS(EpContextConfig);  // onnxruntime_experimental_c_api.h's, which cannot be included

namespace ctxgen::ort_ep {
namespace {

Api g_api;

// Owns an OrtStatus we received and only inspect.
struct StatusHolder {
  OrtStatus* status;
  ~StatusHolder() {
    if (status != nullptr) api().ort->ReleaseStatus(status);
  }
};

}  // namespace

void init_api(const OrtApi* ort) {
  g_api.ort = ort;
  g_api.ep = ort->GetEpApi();
}

const Api& api() { return g_api; }

void check(OrtStatus* status, const char* what) {
  if (status == nullptr) return;
  StatusHolder holder{status};
  throw OrtCodeError(api().ort->GetErrorCode(status), std::string(what) + ": " + api().ort->GetErrorMessage(status));
}

OrtStatus* make_status(OrtErrorCode code, const std::string& message) noexcept {
  return api().ort->CreateStatus(code, message.c_str());
}

OrtStatus* status_from_exception(OrtErrorCode fallback) noexcept {
  try {
    throw;
  } catch (const OrtCodeError& e) {
    return make_status(e.code(), e.what());
  } catch (const Error& e) {
    switch (e.code()) {
      case ErrorCode::kInvalidModel:
      case ErrorCode::kInvalidBinary:
      case ErrorCode::kMismatch:
        return make_status(ORT_INVALID_GRAPH, e.what());
      case ErrorCode::kUsage:
        return make_status(ORT_INVALID_ARGUMENT, e.what());
      default:
        return make_status(fallback, e.what());
    }
  } catch (const std::exception& e) {
    return make_status(fallback, std::string("ctxgen plugin EP: ") + e.what());
  } catch (...) {
    return make_status(fallback, "ctxgen plugin EP: unknown exception");
  }
}

namespace {

// One of a graph's or node's lists, through its pair of count and fill functions.
template <typename Owner, typename T>
std::vector<T> listed(const Owner* owner, OrtStatus*(ORT_API_CALL* count_of)(const Owner*, size_t*),
                      OrtStatus*(ORT_API_CALL* fill)(const Owner*, T*, size_t), const char* what) {
  size_t count = 0;
  check(count_of(owner, &count), what);
  std::vector<T> items(count);
  if (count > 0) check(fill(owner, items.data(), count), what);
  return items;
}

}  // namespace

void log_message(const OrtLogger* logger, OrtLoggingLevel level, const std::string& message) {
  OrtStatus* status = api().ort->Logger_LogMessage(logger, level, message.c_str(), __FILE__, __LINE__, "CtxgenEp");
  if (status != nullptr) api().ort->ReleaseStatus(status);
}

std::vector<const OrtNode*> graph_nodes(const OrtGraph* graph) {
  return listed(graph, api().ort->Graph_GetNumNodes, api().ort->Graph_GetNodes, "Graph_GetNodes");
}

std::vector<const OrtValueInfo*> graph_inputs(const OrtGraph* graph) {
  return listed(graph, api().ort->Graph_GetNumInputs, api().ort->Graph_GetInputs, "Graph_GetInputs");
}

std::vector<const OrtValueInfo*> graph_outputs(const OrtGraph* graph) {
  return listed(graph, api().ort->Graph_GetNumOutputs, api().ort->Graph_GetOutputs, "Graph_GetOutputs");
}

std::vector<const OrtValueInfo*> graph_initializers(const OrtGraph* graph) {
  return listed(graph, api().ort->Graph_GetNumInitializers, api().ort->Graph_GetInitializers,
                    "Graph_GetInitializers");
}

std::string graph_model_path(const OrtGraph* graph) {
  const ORTCHAR_T* path = nullptr;
  check(api().ort->Graph_GetModelPath(graph, &path), "Graph_GetModelPath");
  return path == nullptr ? std::string() : std::string(path);
}

std::optional<std::string> model_metadata(const OrtGraph* graph, const char* key) {
  OrtModelMetadata* metadata = nullptr;
  check(api().ort->Graph_GetModelMetadata(graph, &metadata), "Graph_GetModelMetadata");
  std::unique_ptr<OrtModelMetadata, void (*)(OrtModelMetadata*)> owned(
      metadata, [](OrtModelMetadata* m) { api().ort->ReleaseModelMetadata(m); });
  OrtAllocator* allocator = nullptr;
  check(api().ort->GetAllocatorWithDefaultOptions(&allocator), "GetAllocatorWithDefaultOptions");
  char* value = nullptr;
  check(api().ort->ModelMetadataLookupCustomMetadataMap(metadata, allocator, key, &value),
        "ModelMetadataLookupCustomMetadataMap");
  if (value == nullptr) return std::nullopt;
  std::string text(value);
  allocator->Free(allocator, value);
  return text;
}

std::string node_name(const OrtNode* node) {
  const char* name = nullptr;
  check(api().ort->Node_GetName(node, &name), "Node_GetName");
  return name == nullptr ? std::string() : std::string(name);
}

std::string node_op_type(const OrtNode* node) {
  const char* type = nullptr;
  check(api().ort->Node_GetOperatorType(node, &type), "Node_GetOperatorType");
  return type == nullptr ? std::string() : std::string(type);
}

std::string node_domain(const OrtNode* node) {
  const char* domain = nullptr;
  check(api().ort->Node_GetDomain(node, &domain), "Node_GetDomain");
  return domain == nullptr ? std::string() : std::string(domain);
}

std::vector<const OrtValueInfo*> node_inputs(const OrtNode* node) {
  return listed(node, api().ort->Node_GetNumInputs, api().ort->Node_GetInputs, "Node_GetInputs");
}

std::vector<const OrtValueInfo*> node_outputs(const OrtNode* node) {
  return listed(node, api().ort->Node_GetNumOutputs, api().ort->Node_GetOutputs, "Node_GetOutputs");
}

std::vector<const OrtValueInfo*> node_implicit_inputs(const OrtNode* node) {
  return listed(node, api().ort->Node_GetNumImplicitInputs, api().ort->Node_GetImplicitInputs, "Node_GetImplicitInputs");
}

namespace {

// An attribute the schema knows but the node does not set comes back as nullptr; a name the
// schema does not know is an error status, which for our purposes means the same.
const OrtOpAttr* find_attribute(const OrtNode* node, const char* name) {
  const OrtOpAttr* attr = nullptr;
  StatusHolder holder{api().ort->Node_GetAttributeByName(node, name, &attr)};
  return holder.status == nullptr ? attr : nullptr;
}

const char* attribute_type_name(OrtOpAttrType type) {
  switch (type) {
    case ORT_OP_ATTR_INT: return "int";
    case ORT_OP_ATTR_INTS: return "ints";
    case ORT_OP_ATTR_FLOAT: return "float";
    case ORT_OP_ATTR_FLOATS: return "floats";
    case ORT_OP_ATTR_STRING: return "string";
    case ORT_OP_ATTR_STRINGS: return "strings";
    case ORT_OP_ATTR_GRAPH: return "graph";
    case ORT_OP_ATTR_TENSOR: return "tensor";
    default: return "undefined";
  }
}

void expect_attribute_type(const OrtNode* node, const OrtOpAttr* attr, const char* name,
                           OrtOpAttrType expected) {
  OrtOpAttrType type = ORT_OP_ATTR_UNDEFINED;
  check(api().ort->OpAttr_GetType(attr, &type), "OpAttr_GetType");
  if (type != expected) {
    throw Error(ErrorCode::kInvalidModel, "node '" + node_name(node) + "': attribute '" + name +
                                              "' is of type " + attribute_type_name(type) +
                                              ", expected " + attribute_type_name(expected));
  }
}

}  // namespace

std::optional<std::string> string_attribute(const OrtNode* node, const char* name) {
  const OrtOpAttr* attr = find_attribute(node, name);
  if (attr == nullptr) return std::nullopt;
  expect_attribute_type(node, attr, name, ORT_OP_ATTR_STRING);
  // The first call only reports the size; it fails because the buffer is too small.
  size_t size = 0;
  StatusHolder sizing{api().ort->ReadOpAttr(attr, ORT_OP_ATTR_STRING, nullptr, 0, &size)};
  std::string value(size, '\0');
  if (size > 0) {
    check(api().ort->ReadOpAttr(attr, ORT_OP_ATTR_STRING, value.data(), size, &size), "ReadOpAttr");
    value.resize(size);
  }
  return value;
}

std::optional<int64_t> int_attribute(const OrtNode* node, const char* name) {
  const OrtOpAttr* attr = find_attribute(node, name);
  if (attr == nullptr) return std::nullopt;
  expect_attribute_type(node, attr, name, ORT_OP_ATTR_INT);
  int64_t value = 0;
  size_t size = 0;
  check(api().ort->ReadOpAttr(attr, ORT_OP_ATTR_INT, &value, sizeof(value), &size), "ReadOpAttr");
  return value;
}

std::string value_name(const OrtValueInfo* value) {
  const char* name = nullptr;
  check(api().ort->GetValueInfoName(value, &name), "GetValueInfoName");
  return name == nullptr ? std::string() : std::string(name);
}

DeclaredTensor value_type(const OrtValueInfo* value) {
  DeclaredTensor result;
  const OrtTypeInfo* type = nullptr;
  check(api().ort->GetValueInfoTypeInfo(value, &type), "GetValueInfoTypeInfo");
  const OrtTensorTypeAndShapeInfo* tensor = nullptr;
  if (type == nullptr) return result;
  check(api().ort->CastTypeInfoToTensorInfo(type, &tensor), "CastTypeInfoToTensorInfo");
  if (tensor == nullptr) return result;
  ONNXTensorElementDataType elem = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  check(api().ort->GetTensorElementType(tensor, &elem), "GetTensorElementType");
  result.elem_type = static_cast<int32_t>(elem);
  if (api().ort->TensorTypeAndShape_HasShape(tensor)) {
    size_t rank = 0;
    check(api().ort->GetDimensionsCount(tensor, &rank), "GetDimensionsCount");
    std::vector<int64_t> dims(rank);
    if (rank > 0) check(api().ort->GetDimensions(tensor, dims.data(), rank), "GetDimensions");
    result.dims = std::move(dims);
  }
  return result;
}

std::optional<std::string> session_config(const OrtSessionOptions* options, const char* key) {
  int present = 0;
  check(api().ort->HasSessionConfigEntry(options, key, &present), "HasSessionConfigEntry");
  if (present == 0) return std::nullopt;
  size_t size = 0;
  check(api().ort->GetSessionConfigEntry(options, key, nullptr, &size), "GetSessionConfigEntry");
  std::string value(size, '\0');
  check(api().ort->GetSessionConfigEntry(options, key, value.data(), &size), "GetSessionConfigEntry");
  // The reported size counts the terminating NUL.
  if (!value.empty() && value.back() == '\0') value.pop_back();
  return value;
}

std::vector<std::pair<std::string, std::string>> session_config_entries(const OrtSessionOptions* options) {
  OrtKeyValuePairs* pairs = nullptr;
  check(api().ort->GetSessionOptionsConfigEntries(options, &pairs), "GetSessionOptionsConfigEntries");
  std::unique_ptr<OrtKeyValuePairs, void (*)(OrtKeyValuePairs*)> owned(
      pairs, [](OrtKeyValuePairs* p) { api().ort->ReleaseKeyValuePairs(p); });
  const char* const* keys = nullptr;
  const char* const* values = nullptr;
  size_t count = 0;
  api().ort->GetKeyValuePairs(pairs, &keys, &values, &count);
  std::vector<std::pair<std::string, std::string>> entries;
  for (size_t i = 0; i < count; ++i) entries.emplace_back(keys[i], values[i] == nullptr ? "" : values[i]);
  return entries;
}

ContextDataFunctions context_data_functions(const OrtSessionOptions* options) {
  using GetConfig = OrtStatus*(ORT_API_CALL*)(const OrtSessionOptions*, OrtEpContextConfig**);
  using ReleaseConfig = void(ORT_API_CALL*)(OrtEpContextConfig*);
  using GetRead = OrtStatus*(ORT_API_CALL*)(const OrtEpContextConfig*, ReadNamedBuffer*, void**);
  using GetWrite = OrtStatus*(ORT_API_CALL*)(const OrtEpContextConfig*, WriteNamedBuffer*, void**);
  const auto find = [](const char* name) { return api().ort->GetExperimentalFunction(name); };
  auto* get_config = reinterpret_cast<GetConfig>(find("OrtEpApi_SessionOptions_GetEpContextConfig_SinceV28"));
  auto* release = reinterpret_cast<ReleaseConfig>(find("OrtEpApi_ReleaseEpContextConfig_SinceV28"));
  auto* get_read = reinterpret_cast<GetRead>(find("OrtEpApi_EpContextConfig_GetEpContextDataReadFunc_SinceV28"));
  auto* get_write = reinterpret_cast<GetWrite>(find("OrtEpApi_EpContextConfig_GetEpContextDataWriteFunc_SinceV28"));
  ContextDataFunctions functions;
  if (get_config == nullptr || release == nullptr || get_read == nullptr || get_write == nullptr) return functions;
  OrtEpContextConfig* config = nullptr;
  check(get_config(options, &config), "OrtEpApi_SessionOptions_GetEpContextConfig");
  // The handle holds copies of the pointers; the state stays the application's.
  const std::unique_ptr<OrtEpContextConfig, ReleaseConfig> owned(config, release);
  check(get_read(config, &functions.read, &functions.read_state), "OrtEpApi_EpContextConfig_GetEpContextDataReadFunc");
  check(get_write(config, &functions.write, &functions.write_state), "OrtEpApi_EpContextConfig_GetEpContextDataWriteFunc");
  return functions;
}

namespace {

std::string application_message(OrtStatus* status) {
  StatusHolder holder{status};
  return api().ort->GetErrorMessage(status);
}

}  // namespace

std::shared_ptr<const uint8_t> read_context_data(const ContextDataFunctions& functions, const std::string& name,
                                                 size_t& size) {
  OrtAllocator* allocator = nullptr;
  check(api().ort->GetAllocatorWithDefaultOptions(&allocator), "GetAllocatorWithDefaultOptions");
  void* buffer = nullptr;
  size = 0;
  if (OrtStatus* status = functions.read(functions.read_state, name.c_str(), allocator, &buffer, &size))
    throw Error(ErrorCode::kInvalidModel, "the application's EPContext data read function failed for '" + name +
                                              "': " + application_message(status));
  std::shared_ptr<const uint8_t> bytes(static_cast<const uint8_t*>(buffer), [allocator](const uint8_t* p) {
    if (p != nullptr) allocator->Free(allocator, const_cast<uint8_t*>(p));
  });
  if (buffer == nullptr || size == 0)
    throw Error(ErrorCode::kInvalidModel, "the application's EPContext data read function gave no bytes for '" + name + "'");
  return bytes;
}

void write_context_data(const ContextDataFunctions& functions, const std::string& name, const std::string& bytes) {
  if (OrtStatus* status = functions.write(functions.write_state, name.c_str(), bytes.data(), bytes.size()))
    throw Error(ErrorCode::kIo, "the application's EPContext data write function failed for '" + name +
                                    "': " + application_message(status));
}

}  // namespace ctxgen::ort_ep

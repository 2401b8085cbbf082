#pragma once
// Access to the ONNX Runtime C API tables from inside the plugin, and the two directions of error
// translation: ORT status -> C++ exception (so our code reads straight through) and C++ exception ->
// ORT status at every entry point ORT calls (so nothing ever throws across the C boundary).

#include <onnxruntime_c_api.h>

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <memory>
#include <vector>

namespace ctxgen::ort_ep {

struct Api {
  const OrtApi* ort = nullptr;
  const OrtEpApi* ep = nullptr;
};

// Set once in CreateEpFactories, before ORT can call anything else in the library.
void init_api(const OrtApi* ort);
const Api& api();

// An error bound for ORT with a given status code: ORT's own errors passing back through us, and
// inputs that do not fit a compiled graph at run time.
class OrtCodeError : public std::runtime_error {
 public:
  OrtCodeError(OrtErrorCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
  OrtErrorCode code() const { return code_; }

 private:
  OrtErrorCode code_;
};

// Throws OrtCodeError with ORT's code and message, prefixed by `what`, when `status` is an error.
void check(OrtStatus* status, const char* what);

OrtStatus* make_status(OrtErrorCode code, const std::string& message) noexcept;

// Maps the exception in flight to a status: problems with the model or its context binary are
// ORT_INVALID_GRAPH (what the EPContext design asks of EPs), an OrtCodeError keeps its code,
// anything else is `fallback`.
OrtStatus* status_from_exception(OrtErrorCode fallback) noexcept;

// Runs `body` and turns any exception into a status; for the bodies of ORT callbacks.
template <typename Body>
OrtStatus* guarded(OrtErrorCode fallback, Body&& body) noexcept {
  try {
    body();
    return nullptr;
  } catch (...) {
    return status_from_exception(fallback);
  }
}

// Writes `message` to the session's log (a failure to log is dropped: there is nowhere to report it).
void log_message(const OrtLogger* logger, OrtLoggingLevel level, const std::string& message);

// Graph access: thin, throwing wrappers over the OrtApi graph functions.
std::vector<const OrtNode*> graph_nodes(const OrtGraph* graph);
std::vector<const OrtValueInfo*> graph_inputs(const OrtGraph* graph);
std::vector<const OrtValueInfo*> graph_outputs(const OrtGraph* graph);
std::vector<const OrtValueInfo*> graph_initializers(const OrtGraph* graph);
std::string graph_model_path(const OrtGraph* graph);  // empty for a model loaded from memory
// A custom metadata entry of the model the graph belongs to; nullopt when it has none.
std::optional<std::string> model_metadata(const OrtGraph* graph, const char* key);
std::string node_name(const OrtNode* node);
std::string node_op_type(const OrtNode* node);
std::string node_domain(const OrtNode* node);
// Missing optional values come back as nullptr.
std::vector<const OrtValueInfo*> node_inputs(const OrtNode* node);
std::vector<const OrtValueInfo*> node_outputs(const OrtNode* node);
// What a node reads from outside through its subgraphs (If, Loop, Scan).
std::vector<const OrtValueInfo*> node_implicit_inputs(const OrtNode* node);
// nullopt when the node has no such attribute. A string attribute may hold binary bytes
// (the embedded context payload), so the result is a byte string, not a C string.
std::optional<std::string> string_attribute(const OrtNode* node, const char* name);
std::optional<int64_t> int_attribute(const OrtNode* node, const char* name);

std::string value_name(const OrtValueInfo* value);
// Element type and shape as the model declares them; dims are absent when the rank is unknown
// and a symbolic dim reads as -1.
struct DeclaredTensor {
  int32_t elem_type = 0;  // ONNXTensorElementDataType; 0 when the value is not a tensor
  std::optional<std::vector<int64_t>> dims;
};
DeclaredTensor value_type(const OrtValueInfo* value);

// nullopt when the session has no such config entry.
std::optional<std::string> session_config(const OrtSessionOptions* options, const char* key);
// Every config entry of the session.
std::vector<std::pair<std::string, std::string>> session_config_entries(const OrtSessionOptions* options);

// The application's functions for the context binaries of a session (ORT's experimental EPContext
// data callbacks, API 28: set with OrtApi_SessionOptions_SetEpContextDataReadFunc and
// OrtCompileApi_ModelCompilationOptions_SetEpContextDataWriteFunc), to store binaries elsewhere
// than in files, e.g. encrypted. The npm build of ORT lacks the .inc that declares them, so their
// types are declared here. Null when the application set none (or this ORT has no such API).
using ReadNamedBuffer = OrtStatus*(ORT_API_CALL*)(void* state, const char* name, OrtAllocator* allocator,
                                                  void** buffer, size_t* size);
using WriteNamedBuffer = OrtStatus*(ORT_API_CALL*)(void* state, const char* name, const void* buffer, size_t size);
struct ContextDataFunctions {
  ReadNamedBuffer read = nullptr;
  void* read_state = nullptr;
  WriteNamedBuffer write = nullptr;
  void* write_state = nullptr;
};
ContextDataFunctions context_data_functions(const OrtSessionOptions* options);
// Calls them; throws Error naming `name` and the application's message when one fails. The bytes
// read are the buffer the application allocated with ORT's allocator.
std::shared_ptr<const uint8_t> read_context_data(const ContextDataFunctions& functions, const std::string& name,
                                                 size_t& size);
void write_context_data(const ContextDataFunctions& functions, const std::string& name, const std::string& bytes);

}  // namespace ctxgen::ort_ep

#include "compiled_node.h"

#include <cstring>
#include <exception>
#include <functional>
#include <mutex>

#include "ctxgen/error.h"
#include "ep_context.h"
#include "ort_api.h"
#include "plugin_backend.h"

namespace ctxgen::ort_ep {
namespace {

size_t element_size(int32_t elem_type) {
  switch (elem_type) {
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8:
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8:
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL: return 1;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT16:
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT16:
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16:
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16: return 2;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT:
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32: return 4;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64:
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE: return 8;
    default:
      throw Error(ErrorCode::kInvalidBinary, "graph value of unsupported element type " + elem_type_name(elem_type));
  }
}

size_t byte_size(const IoSignature& signature) {
  size_t count = 1;
  for (int64_t d : signature.dims) count *= static_cast<size_t>(d);
  return count * element_size(signature.elem_type);
}

// The element type and dims of an ORT tensor, into `dims` (reused from run to run).
int32_t actual_tensor(const OrtValue* value, std::vector<int64_t>& dims) {
  OrtTensorTypeAndShapeInfo* info = nullptr;
  check(api().ort->GetTensorTypeAndShape(value, &info), "GetTensorTypeAndShape");
  std::unique_ptr<OrtTensorTypeAndShapeInfo, void (*)(OrtTensorTypeAndShapeInfo*)> owner(
      info, api().ort->ReleaseTensorTypeAndShapeInfo);
  ONNXTensorElementDataType elem = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  check(api().ort->GetTensorElementType(info, &elem), "GetTensorElementType");
  size_t rank = 0;
  check(api().ort->GetDimensionsCount(info, &rank), "GetDimensionsCount");
  dims.resize(rank);
  if (rank > 0) check(api().ort->GetDimensions(info, dims.data(), rank), "GetDimensions");
  return static_cast<int32_t>(elem);
}

}  // namespace

CompiledNode::CompiledNode(std::string node_name, std::shared_ptr<const GraphRunner> executable,
                           std::vector<size_t> input_slots, std::vector<std::optional<size_t>> output_slots,
                           std::string cannot_run)
    : OrtNodeComputeInfo{},
      node_name_(std::move(node_name)),
      executable_(std::move(executable)),
      input_slots_(std::move(input_slots)),
      output_slots_(std::move(output_slots)),
      cannot_run_(std::move(cannot_run)) {
  ort_version_supported = ORT_API_VERSION;
  CreateState = CreateStateImpl;
  Compute = ComputeImpl;
  ReleaseState = ReleaseStateImpl;
}

// What a run needs besides the tensors: made by a node's first run and kept for the next, one
// set per run in flight, so that a run allocates nothing of its own.
struct CompiledNode::RunBuffers {
  std::vector<const void*> inputs;
  std::vector<void*> outputs;
  std::vector<std::vector<uint8_t>> unread;  // outputs ORT does not read still need somewhere to go
  std::vector<int64_t> dims;
};

CompiledNode::~CompiledNode() = default;

void CompiledNode::compute(OrtKernelContext* context) const {
  if (!cannot_run_.empty()) throw OrtCodeError(ORT_NOT_IMPLEMENTED, "node '" + node_name_ + "': " + cannot_run_);
  std::unique_ptr<RunBuffers> buffers;
  {
    std::lock_guard<std::mutex> lock(buffers_mutex_);
    if (!free_buffers_.empty()) {
      buffers = std::move(free_buffers_.back());
      free_buffers_.pop_back();
    }
  }
  const GraphRecord& graph = executable_->graph();
  if (!buffers) {
    buffers = std::make_unique<RunBuffers>();
    buffers->inputs.resize(graph.inputs.size());
    buffers->outputs.resize(graph.outputs.size());
    for (size_t i = 0; i < graph.outputs.size(); ++i)
      if (!output_slots_[i]) buffers->unread.emplace_back(byte_size(graph.outputs[i]));
  }
  run(context, *buffers);
  std::lock_guard<std::mutex> lock(buffers_mutex_);
  free_buffers_.push_back(std::move(buffers));
}

void CompiledNode::run(OrtKernelContext* context, RunBuffers& buffers) const {
  const GraphRecord& graph = executable_->graph();
  std::vector<const void*>& inputs = buffers.inputs;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const OrtValue* value = nullptr;
    check(api().ort->KernelContext_GetInput(context, input_slots_[i], &value), "KernelContext_GetInput");
    const IoSignature& expected = graph.inputs[i];
    // The model may declare symbolic dims; the program was compiled for exactly these.
    const int32_t elem_type = actual_tensor(value, buffers.dims);
    if (elem_type != expected.elem_type || buffers.dims != expected.dims) {
      throw OrtCodeError(ORT_INVALID_ARGUMENT, "EPContext node '" + node_name_ + "': input " + std::to_string(i) +
                                                   " '" + expected.name + "' is " + elem_type_name(elem_type) +
                                                   " " + dims_string(buffers.dims) + " but graph '" + graph.name +
                                                   "' was compiled for " + elem_type_name(expected.elem_type) + " " +
                                                   dims_string(expected.dims));
    }
    check(api().ort->GetTensorData(value, &inputs[i]), "GetTensorData");
  }
  check_fixed_inputs(context, buffers.dims);

  std::vector<void*>& outputs = buffers.outputs;
  for (size_t i = 0, unread = 0; i < outputs.size(); ++i) {
    const IoSignature& signature = graph.outputs[i];
    if (!output_slots_[i]) {
      outputs[i] = buffers.unread[unread++].data();
      continue;
    }
    OrtValue* value = nullptr;
    check(api().ort->KernelContext_GetOutput(context, *output_slots_[i], signature.dims.data(),
                                             signature.dims.size(), &value),
          "KernelContext_GetOutput");
    check(api().ort->GetTensorMutableData(value, &outputs[i]), "GetTensorMutableData");
  }
  // Kernels split their work over the session's intra-op threads, as ONNX Runtime's own kernels do.
  // A task's exception must not cross ONNX Runtime's C frames: the first is kept and rethrown here.
  const ParallelFor parallel = [context](size_t tasks, const std::function<void(size_t)>& body) {
    struct Tasks {
      const std::function<void(size_t)>& body;
      std::mutex mutex;
      std::exception_ptr error;
    } shared{body, {}, {}};
    auto call = [](void* data, size_t task) {
      auto& t = *static_cast<Tasks*>(data);
      try {
        t.body(task);
      } catch (...) {
        std::lock_guard<std::mutex> lock(t.mutex);
        if (!t.error) t.error = std::current_exception();
      }
    };
    check(api().ort->KernelContext_ParallelFor(context, call, tasks, 0, &shared), "KernelContext_ParallelFor");
    if (shared.error) std::rethrow_exception(shared.error);
  };
  executable_->run(inputs, outputs, parallel);
}

// The graph was compiled for one value of these inputs (--fix-value): any other must not run.
void CompiledNode::check_fixed_inputs(OrtKernelContext* context, std::vector<int64_t>& dims) const {
  const GraphRecord& graph = executable_->graph();
  for (size_t f = 0; f < graph.fixed_inputs.size(); ++f) {
    const FixedInput& fixed = graph.fixed_inputs[f];
    const OrtValue* value = nullptr;
    check(api().ort->KernelContext_GetInput(context, input_slots_[graph.inputs.size() + f], &value), "KernelContext_GetInput");
    const int32_t elem_type = actual_tensor(value, dims);
    const void* data = nullptr;
    check(api().ort->GetTensorData(value, &data), "GetTensorData");
    const size_t count = fixed.value.size() / fixed_element_size(fixed.io.elem_type);
    const bool shaped = elem_type == fixed.io.elem_type && dims == fixed.io.dims;
    if (shaped && (fixed.value.empty() || std::memcmp(data, fixed.value.data(), fixed.value.size()) == 0)) continue;
    const std::string compiled = fixed_values_text(fixed.io.elem_type, fixed.value.data(), count);
    // Fed another type or shape, the run is named by those; else by the values.
    const std::string given = shaped ? fixed_values_text(elem_type, static_cast<const uint8_t*>(data), count)
                                     : elem_type_name(elem_type) + " " + dims_string(dims);
    const std::string wanted =
        shaped ? compiled : elem_type_name(fixed.io.elem_type) + " " + dims_string(fixed.io.dims) + " " + compiled;
    throw OrtCodeError(ORT_INVALID_ARGUMENT, "EPContext node '" + node_name_ + "': input '" + fixed.io.name + "' is " + given +
                                                 ", but the model was compiled for " + wanted +
                                                 " (ctxgen --fix-value); feed " + compiled +
                                                 ", or compile the original again for the value you need");
  }
}

OrtStatus* ORT_API_CALL CompiledNode::CreateStateImpl(OrtNodeComputeInfo* self, OrtNodeComputeContext*,
                                                      void** state) noexcept {
  // The executable is immutable and every run brings its own arena, so no per-kernel state.
  *state = self;
  return nullptr;
}

OrtStatus* ORT_API_CALL CompiledNode::ComputeImpl(OrtNodeComputeInfo* self, void*,
                                                  OrtKernelContext* context) noexcept {
  return guarded(ORT_EP_FAIL, [&] { static_cast<const CompiledNode*>(self)->compute(context); });
}

void ORT_API_CALL CompiledNode::ReleaseStateImpl(OrtNodeComputeInfo*, void*) noexcept {}

std::vector<std::optional<size_t>> match_by_name(const std::string& node, const char* direction,
                                                 const std::vector<std::string>& wanted,
                                                 const std::vector<std::string>& available, bool required) {
  std::vector<std::optional<size_t>> slots(wanted.size());
  for (size_t i = 0; i < wanted.size(); ++i) {
    for (size_t j = 0; j < available.size() && !slots[i]; ++j) {
      if (available[j] == wanted[i]) slots[i] = j;
    }
    if (required && !slots[i]) {
      throw Error(ErrorCode::kInternal, "EPContext node '" + node + "': " + direction + " '" + wanted[i] +
                                            "' is not among the fused node's " + direction + "s");
    }
  }
  return slots;
}

std::vector<size_t> required_slots(const std::string& node, const std::vector<std::string>& wanted,
                                   const std::vector<std::string>& available) {
  std::vector<size_t> slots;
  for (const auto& slot : match_by_name(node, "input", wanted, available, true)) slots.push_back(*slot);
  return slots;
}

std::vector<std::string> value_names(const std::vector<const OrtValueInfo*>& values) {
  std::vector<std::string> names;
  names.reserve(values.size());
  for (const OrtValueInfo* value : values) names.push_back(value == nullptr ? std::string() : value_name(value));
  return names;
}

}  // namespace ctxgen::ort_ep

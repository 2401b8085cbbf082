#include <cmath>
#include <cstdlib>
#include <cstring>
#include <unordered_map>

#include "ctxgen/error.h"
#include "ctxgen/ref_identity.h"
#include "ctxgen/verify.h"

namespace ctxgen::verify {
namespace {

constexpr const char* kRegistrationName = "ctxgen";

size_t element_bytes(ONNXTensorElementDataType type) {
  switch (type) {
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT: case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32:
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT32: return 4;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE: case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64:
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT64: return 8;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT16: case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT16:
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16: case ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16: return 2;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8: case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8:
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL: return 1;
    default: return 0;
  }
}

template <typename T>
Difference compare_as(const Tensor& got, const Tensor& expected, double rtol, double atol) {
  Difference d;
  size_t n = expected.bytes.size() / sizeof(T);
  for (size_t i = 0; i < n; ++i) {
    T a, b;
    std::memcpy(&a, got.bytes.data() + i * sizeof(T), sizeof(T));
    std::memcpy(&b, expected.bytes.data() + i * sizeof(T), sizeof(T));
    double x = static_cast<double>(a), y = static_cast<double>(b);
    if (std::isnan(x) && std::isnan(y)) continue;
    double abs = std::fabs(x - y);
    if (std::isnan(abs)) abs = INFINITY;
    if (x == y) abs = 0;  // equal infinities
    d.max_abs = std::max(d.max_abs, abs);
    if (y != 0) d.max_rel = std::max(d.max_rel, abs / std::fabs(y));
    bool exact = !std::is_floating_point_v<T>;
    if (exact ? abs != 0 : abs > atol + rtol * std::fabs(y)) d.within = false;
  }
  return d;
}

}  // namespace

std::filesystem::path default_plugin() {
  const char* env = std::getenv("CTXGEN_ORT_EP");
  return env != nullptr && *env != '\0' ? std::filesystem::path(env) : std::filesystem::path(CTXGEN_ORT_EP_PATH);
}

OrtHost::OrtHost(const std::filesystem::path& plugin, OrtLoggingLevel log_level) : env_(log_level, "ctxgen") {
  try {
    env_.RegisterExecutionProviderLibrary(kRegistrationName, plugin.c_str());
    std::vector<Ort::ConstEpDevice> devices;
    for (const auto& device : env_.GetEpDevices())
      if (std::string(device.EpName()) == ref::kEpName) devices.push_back(device);
    if (devices.empty())
      throw Error(ErrorCode::kRuntime, plugin.string() + ": the plugin offers no device for EP " + ref::kEpName);
    plugin_options_.AppendExecutionProvider_V2(env_, devices, std::unordered_map<std::string, std::string>{});
  } catch (const Ort::Exception& e) {
    throw Error(ErrorCode::kRuntime, plugin.string() + ": cannot register the plugin EP: " + e.what());
  }
}

Ort::Session OrtHost::cpu_session(const std::filesystem::path& model) {
  try {
    return Ort::Session(env_, model.c_str(), Ort::SessionOptions{});
  } catch (const Ort::Exception& e) {
    throw Error(ErrorCode::kRuntime, model.string() + ": ONNX Runtime (CPU) cannot load it: " + e.what());
  }
}

Ort::Session OrtHost::plugin_session(const std::filesystem::path& model) {
  try {
    return Ort::Session(env_, model.c_str(), plugin_options_);
  } catch (const Ort::Exception& e) {
    throw Error(ErrorCode::kRuntime, model.string() + ": ONNX Runtime with " + ref::kEpName + " cannot load it: " + e.what());
  }
}

Tensor Tensor::from(const Ort::Value& value) {
  Tensor t;
  auto info = value.GetTensorTypeAndShapeInfo();
  t.type = info.GetElementType();
  t.dims = info.GetShape();
  size_t size = info.GetElementCount() * element_bytes(t.type);
  if (element_bytes(t.type) == 0) throw Error(ErrorCode::kRuntime, "tensor of element type " + std::to_string(t.type) + " cannot be compared");
  const auto* data = static_cast<const uint8_t*>(value.GetTensorRawData());
  t.bytes.assign(data, data + size);
  return t;
}

Ort::Value Tensor::view() {
  static const Ort::MemoryInfo cpu = Ort::MemoryInfo::CreateCpu(OrtArenaAllocator, OrtMemTypeDefault);
  return Ort::Value::CreateTensor(cpu, bytes.data(), bytes.size(), dims.data(), dims.size(), type);
}

Difference compare(const Tensor& got, const Tensor& expected, double rtol, double atol) {
  Difference d;
  if (got.type != expected.type) {
    d.within = false;
    d.problem = "element type " + std::to_string(got.type) + ", expected " + std::to_string(expected.type);
    return d;
  }
  if (got.dims != expected.dims || got.bytes.size() != expected.bytes.size()) {
    d.within = false;
    d.problem = "shape differs from the expected shape";
    return d;
  }
  switch (got.type) {
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT: return compare_as<float>(got, expected, rtol, atol);
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE: return compare_as<double>(got, expected, rtol, atol);
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64: return compare_as<int64_t>(got, expected, rtol, atol);
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32: return compare_as<int32_t>(got, expected, rtol, atol);
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8: return compare_as<int8_t>(got, expected, rtol, atol);
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8: case ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL:
      return compare_as<uint8_t>(got, expected, rtol, atol);
    default:
      d.within = got.bytes == expected.bytes;
      return d;
  }
}

}  // namespace ctxgen::verify

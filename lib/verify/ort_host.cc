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

template <typename T>
double read_as(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return static_cast<double>(v);
}

double read_float16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, sizeof h);
  int exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff;
  double sign = (h & 0x8000) != 0 ? -1.0 : 1.0;
  if (exponent == 0) return sign * std::ldexp(mantissa, -24);
  if (exponent == 0x1f) return mantissa != 0 ? NAN : sign * INFINITY;
  return sign * std::ldexp(mantissa + 1024, exponent - 25);
}

double read_bfloat16(const uint8_t* p) {
  uint16_t b;
  std::memcpy(&b, p, sizeof b);
  uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

}  // namespace

std::optional<ElementKind> element_kind(ONNXTensorElementDataType type) {
  switch (type) {
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT: return ElementKind{4, read_as<float>, false};
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE: return ElementKind{8, read_as<double>, false};
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16: return ElementKind{2, read_float16, false};
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16: return ElementKind{2, read_bfloat16, false};
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64: return ElementKind{8, read_as<int64_t>, true};
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT64: return ElementKind{8, read_as<uint64_t>, true};
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32: return ElementKind{4, read_as<int32_t>, true};
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT32: return ElementKind{4, read_as<uint32_t>, true};
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT16: return ElementKind{2, read_as<int16_t>, true};
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT16: return ElementKind{2, read_as<uint16_t>, true};
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8: return ElementKind{1, read_as<int8_t>, true};
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8: case ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL:
      return ElementKind{1, read_as<uint8_t>, true};
    default: return std::nullopt;
  }
}


std::filesystem::path default_plugin() {
  const char* env = std::getenv("CTXGEN_ORT_EP");
  if (env != nullptr && *env != '\0') return env;
  std::error_code error;
  auto program = std::filesystem::read_symlink("/proc/self/exe", error);
  if (error) throw Error(ErrorCode::kRuntime, "cannot find the running program (/proc/self/exe: " + error.message() +
                                                  ") to find the plugin EP beside it; set CTXGEN_ORT_EP");
  return (program.parent_path() / CTXGEN_PLUGIN_FROM_BIN).lexically_normal();
}

OrtHost::OrtHost(const std::filesystem::path& plugin, OrtLoggingLevel log_level) : env_(log_level, "ctxgen") {
  if (!std::filesystem::is_regular_file(plugin))
    throw Error(ErrorCode::kRuntime, plugin.string() + ": no plugin EP library there (an install keeps it in lib/ "
                                     "beside bin/ctxgen; CTXGEN_ORT_EP names another)");
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
  auto kind = element_kind(t.type);
  if (!kind) throw Error(ErrorCode::kRuntime, "tensor of element type " + std::to_string(t.type) + " cannot be compared");
  size_t size = info.GetElementCount() * kind->size;
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
  auto kind = element_kind(expected.type);
  if (got.dims != expected.dims || got.bytes.size() != expected.bytes.size() || !kind ||
      expected.bytes.size() % kind->size != 0) {
    d.within = false;
    d.problem = !kind ? "element type " + std::to_string(expected.type) + " cannot be compared"
                      : "shape differs from the expected shape";
    return d;
  }
  for (size_t offset = 0; offset < expected.bytes.size(); offset += kind->size) {
    const uint8_t* a = got.bytes.data() + offset;
    const uint8_t* b = expected.bytes.data() + offset;
    double x = kind->read(a), y = kind->read(b);
    // Integers compare bit for bit: 64-bit values do not all survive the trip through double.
    if (kind->exact && std::memcmp(a, b, kind->size) != 0) d.within = false;
    if (std::isnan(x) && std::isnan(y)) continue;
    double diff = x == y ? 0 : std::fabs(x - y);  // x == y covers equal infinities
    if (std::isnan(diff)) diff = INFINITY;
    d.max_abs = std::max(d.max_abs, diff);
    if (y != 0) d.max_rel = std::max(d.max_rel, diff / std::fabs(y));
    if (!kind->exact && diff > atol + rtol * std::fabs(y)) d.within = false;
  }
  return d;
}

}  // namespace ctxgen::verify

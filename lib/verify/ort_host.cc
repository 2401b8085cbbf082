#include <cstdlib>
#include <unordered_map>

#include "ctxgen/error.h"
#include "ctxgen/library.h"
#include "ctxgen/ort_telemetry.h"
#include "ctxgen/verify.h"

namespace ctxgen::verify {
namespace {

constexpr const char* kRegistrationName = "ctxgen";

bool is_virtual(const Ort::ConstEpDevice& device) {
  const char* value = device.Device().Metadata().GetValue("is_virtual");
  return value != nullptr && std::string(value) == "1";
}

}  // namespace

std::filesystem::path default_plugin() {
  const char* env = std::getenv("CTXGEN_ORT_EP");
  if (env != nullptr && *env != '\0') return env;
  std::error_code error;
  auto program = std::filesystem::read_symlink("/proc/self/exe", error);
  if (error) throw Error(ErrorCode::kRuntime, "cannot find the running program (/proc/self/exe: " + error.message() +
                                                  ") to find the plugin EP beside it; set CTXGEN_ORT_EP");
  return (program.parent_path() / CTXGEN_PLUGIN_FROM_BIN).lexically_normal();
}

OrtHost::OrtHost(const std::filesystem::path& plugin, BinaryIdentity identity, OrtLoggingLevel log_level)
    // Before ONNX Runtime's environment exists: that is when it reads the opt-out.
    : identity_(std::move(identity)), env_((opt_out_of_ort_telemetry(), log_level), "ctxgen") {
  if (!std::filesystem::exists(plugin))
    throw Error(ErrorCode::kRuntime, plugin.string() + ": no plugin EP library there (an install keeps it in lib/ "
                                     "beside bin/ctxgen; CTXGEN_ORT_EP names another)");
  const std::filesystem::path library = checked_library(plugin, "the plugin EP library", ErrorCode::kRuntime);
  try {
    env_.RegisterExecutionProviderLibrary(kRegistrationName, library.c_str());
    std::vector<Ort::ConstEpDevice> devices;
    for (const auto& device : env_.GetEpDevices())
      // A virtual device (cross-compiling) loads models but does not run them.
      if (device.EpName() == identity_.backend && !is_virtual(device)) devices.push_back(device);
    if (devices.empty())
      throw Error(ErrorCode::kRuntime, plugin.string() + ": the plugin offers no device for EP " + identity_.backend);
    plugin_options_.AppendExecutionProvider_V2(env_, devices, std::unordered_map<std::string, std::string>{});
  } catch (const Ort::Exception& e) {
    throw Error(ErrorCode::kRuntime, plugin.string() + ": cannot register the plugin EP: " + e.what());
  }
}

Ort::Session OrtHost::cpu_session(const std::filesystem::path& model, int threads) {
  try {
    Ort::SessionOptions options;
    options.SetIntraOpNumThreads(threads);
    return Ort::Session(env_, model.c_str(), options);
  } catch (const Ort::Exception& e) {
    throw Error(ErrorCode::kRuntime, model.string() + ": ONNX Runtime (CPU) cannot load it: " + e.what());
  }
}

Ort::Session OrtHost::cpu_session(const std::string& model, const std::string& weights_name, std::vector<char>& weights) {
  try {
    Ort::SessionOptions options;
    // The graph as written: fusions make float-only contrib ops (QuickGelu) a float64 graph cannot use.
    options.SetGraphOptimizationLevel(ORT_DISABLE_ALL);
    if (!weights.empty())  // ONNX Runtime refuses an empty file
      options.AddExternalInitializersFromFilesInMemory({weights_name}, {weights.data()}, {weights.size()});
    return Ort::Session(env_, model.data(), model.size(), options);
  } catch (const Ort::Exception& e) {
    throw Error(ErrorCode::kRuntime, std::string("ONNX Runtime (CPU) cannot load the model: ") + e.what());
  }
}

Ort::Session OrtHost::plugin_session(const std::filesystem::path& model, const std::map<std::string, std::string>& config,
                                     int threads) {
  try {
    if (config.empty() && threads == 0) return Ort::Session(env_, model.c_str(), plugin_options_);
    Ort::SessionOptions options = plugin_options_.Clone();
    for (const auto& [key, value] : config) options.AddConfigEntry(key.c_str(), value.c_str());
    options.SetIntraOpNumThreads(threads);
    return Ort::Session(env_, model.c_str(), options);
  } catch (const Ort::Exception& e) {
    throw Error(ErrorCode::kRuntime, model.string() + ": ONNX Runtime with " + identity_.backend + " cannot load it: " + e.what());
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

Ort::Value Tensor::view() const {
  static const Ort::MemoryInfo cpu = Ort::MemoryInfo::CreateCpu(OrtArenaAllocator, OrtMemTypeDefault);
  // ONNX Runtime only reads an input.
  return Ort::Value::CreateTensor(cpu, const_cast<uint8_t*>(bytes.data()), bytes.size(), dims.data(), dims.size(), type);
}

}  // namespace ctxgen::verify

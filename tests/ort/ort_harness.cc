#include "ort_harness.h"

#include <dlfcn.h>

#include <fstream>
#include <iterator>
#include <stdexcept>
#include <unordered_map>

#include "ctxgen/ref_identity.h"

namespace ctxgen::ort_test {
namespace {

constexpr const char* kRegistrationName = "ctxgen_ort_ep";

bool g_registered = false;

using GetStatsFn = void (*)(uint64_t*, uint64_t*);

// Our own handle on the plugin keeps it (and its counters) loaded across unregistering.
GetStatsFn stats_function() {
  static GetStatsFn fn = [] {
    void* handle = dlopen(CTXGEN_ORT_EP_PATH, RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) throw std::runtime_error(std::string("dlopen plugin: ") + dlerror());
    auto* symbol = reinterpret_cast<GetStatsFn>(dlsym(handle, "CtxgenOrtEp_GetStats"));
    if (symbol == nullptr) throw std::runtime_error("plugin does not export CtxgenOrtEp_GetStats");
    return symbol;
  }();
  return fn;
}

template <typename Make>
std::optional<Failure> failure_of(Make&& make) {
  try {
    make();
    return std::nullopt;
  } catch (const Ort::Exception& e) {
    return Failure{e.GetOrtErrorCode(), e.what()};
  }
}

}  // namespace

Ort::Env& Plugin::env() {
  static Ort::Env env(ORT_LOGGING_LEVEL_WARNING, "ctxgen-ort-test");
  return env;
}

void Plugin::register_library() {
  if (g_registered) return;
  stats_function();
  env().RegisterExecutionProviderLibrary(kRegistrationName, CTXGEN_ORT_EP_PATH);
  g_registered = true;
}

void Plugin::unregister_library() {
  if (!g_registered) return;
  env().UnregisterExecutionProviderLibrary(kRegistrationName);
  g_registered = false;
}

Ort::ConstEpDevice Plugin::device() {
  register_library();
  for (const Ort::ConstEpDevice& device : env().GetEpDevices()) {
    if (std::string(device.EpName()) == ref::kEpName) return device;
  }
  throw std::runtime_error(std::string("no OrtEpDevice for EP ") + ref::kEpName);
}

PluginStats Plugin::stats() {
  PluginStats stats;
  stats_function()(&stats.opened, &stats.live);
  return stats;
}

Ort::SessionOptions plugin_options(const Config& config) {
  Ort::SessionOptions options;
  for (const auto& [key, value] : config) options.AddConfigEntry(key.c_str(), value.c_str());
  options.AppendExecutionProvider_V2(Plugin::env(), {Plugin::device()}, std::unordered_map<std::string, std::string>{});
  return options;
}

Ort::Session open_session(const std::filesystem::path& model, const Ort::SessionOptions& options) {
  return Ort::Session(Plugin::env(), model.c_str(), options);
}

std::vector<float> run(Ort::Session& session, const std::vector<float>& x) {
  const Ort::MemoryInfo memory = Ort::MemoryInfo::CreateCpu(OrtArenaAllocator, OrtMemTypeDefault);
  const std::vector<int64_t> dims = {2, 3};
  Ort::Value input = Ort::Value::CreateTensor<float>(memory, const_cast<float*>(x.data()), x.size(), dims.data(),
                                                     dims.size());
  const char* input_names[] = {"X"};
  const char* output_names[] = {"Y"};
  auto outputs = session.Run(Ort::RunOptions{nullptr}, input_names, &input, 1, output_names, 1);
  const auto& y = outputs.at(0);
  const size_t count = y.GetTensorTypeAndShapeInfo().GetElementCount();
  const float* data = y.GetTensorData<float>();
  return {data, data + count};
}

std::vector<float> run_on_cpu(const std::filesystem::path& model, const std::vector<float>& x) {
  Ort::SessionOptions options;
  Ort::Session session(Plugin::env(), model.c_str(), options);
  return run(session, x);
}

std::optional<Failure> session_failure(const std::filesystem::path& model, const Ort::SessionOptions& options) {
  return failure_of([&] { open_session(model, options); });
}

std::optional<Failure> session_failure(const std::vector<char>& model_bytes, const Ort::SessionOptions& options) {
  return failure_of([&] { Ort::Session(Plugin::env(), model_bytes.data(), model_bytes.size(), options); });
}

std::vector<char> read_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path.string());
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace ctxgen::ort_test

#include "ort_harness.h"

#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <unordered_map>

#include "ctxgen/ort_telemetry.h"
#include "ctxgen/ref_identity.h"
#include "test_util.h"

namespace ctxgen::ort_test {
namespace {

constexpr const char* kRegistrationName = "ctxgen_ort_ep";

bool g_registered = false;

using GetStatsFn = void (*)(uint64_t*, uint64_t*);

// Our own handle on the plugin keeps it (and its counters) loaded across unregistering.
GetStatsFn stats_function() {
  static GetStatsFn fn = [] {
    void* handle = dlopen(Plugin::library(), RTLD_NOW | RTLD_LOCAL);
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
  static Ort::Env env = [] {
    ctxgen::opt_out_of_ort_telemetry();
    return Ort::Env(ORT_LOGGING_LEVEL_ERROR, "ctxgen-ort-test");
  }();
  return env;
}

void Plugin::register_library() {
  if (g_registered) return;
  stats_function();
  env().RegisterExecutionProviderLibrary(kRegistrationName, library());
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

const char* Plugin::library() {
  const char* runtime_only = std::getenv("CTXGEN_TEST_RUNTIME_ONLY");
  return runtime_only != nullptr && std::string(runtime_only) == "1" ? CTXGEN_ORT_EP_RUNTIME_PATH : CTXGEN_ORT_EP_PATH;
}

PluginStats Plugin::stats() {
  PluginStats stats;
  stats_function()(&stats.opened, &stats.live);
  return stats;
}

Ort::SessionOptions plugin_options(const Config& config) {
  Ort::SessionOptions options;
  for (const auto& [key, value] : config) options.AddConfigEntry(key.c_str(), value.c_str());
  const std::unordered_map<std::string, std::string> no_ep_options;
  options.AppendExecutionProvider_V2(Plugin::env(), {Plugin::device()}, no_ep_options);
  return options;
}

Ort::Session open_session(const std::filesystem::path& model, const Ort::SessionOptions& options) {
  return Ort::Session(Plugin::env(), model.c_str(), options);
}

std::vector<float> run(Ort::Session& session, const std::vector<float>& x, const std::vector<int64_t>& dims) {
  const Ort::MemoryInfo memory = Ort::MemoryInfo::CreateCpu(OrtArenaAllocator, OrtMemTypeDefault);
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

namespace {

Ort::Value filled_tensor(const Ort::TypeInfo& type, size_t salt) {
  const auto info = type.GetTensorTypeAndShapeInfo();
  const std::vector<int64_t> dims = info.GetShape();
  Ort::AllocatorWithDefaultOptions allocator;
  const ONNXTensorElementDataType elem = info.GetElementType();
  switch (elem) {
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT: {
      Ort::Value value = Ort::Value::CreateTensor<float>(allocator, dims.data(), dims.size());
      float* data = value.GetTensorMutableData<float>();
      const size_t count = info.GetElementCount();
      // Mixed signs and magnitudes, different for every input.
      for (size_t i = 0; i < count; ++i) data[i] = std::sin(0.37f * static_cast<float>(i + 7 * salt)) * 1.5f;
      return value;
    }
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64: {
      Ort::Value value = Ort::Value::CreateTensor<int64_t>(allocator, dims.data(), dims.size());
      int64_t* data = value.GetTensorMutableData<int64_t>();
      for (size_t i = 0; i < info.GetElementCount(); ++i) data[i] = static_cast<int64_t>((i + salt) % 3);
      return value;
    }
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL: {
      Ort::Value value = Ort::Value::CreateTensor<bool>(allocator, dims.data(), dims.size());
      bool* data = value.GetTensorMutableData<bool>();
      for (size_t i = 0; i < info.GetElementCount(); ++i) data[i] = (i + salt) % 2 == 0;
      return value;
    }
    default:
      throw std::runtime_error("test input of element type " + std::to_string(elem) + " is not supported");
  }
}

}  // namespace

Feeds make_feeds(Ort::Session& session) {
  Feeds feeds;
  Ort::AllocatorWithDefaultOptions allocator;
  for (size_t i = 0; i < session.GetInputCount(); ++i) {
    feeds.names.emplace_back(session.GetInputNameAllocated(i, allocator).get());
    feeds.values.push_back(filled_tensor(session.GetInputTypeInfo(i), i));
  }
  return feeds;
}

Fetched run_all(Ort::Session& session, const Feeds& feeds) {
  Fetched fetched;
  Ort::AllocatorWithDefaultOptions allocator;
  for (size_t i = 0; i < session.GetOutputCount(); ++i) {
    fetched.names.emplace_back(session.GetOutputNameAllocated(i, allocator).get());
  }
  std::vector<const char*> input_names, output_names;
  for (const std::string& name : feeds.names) input_names.push_back(name.c_str());
  for (const std::string& name : fetched.names) output_names.push_back(name.c_str());
  fetched.values = session.Run(Ort::RunOptions{nullptr}, input_names.data(), feeds.values.data(),
                               feeds.values.size(), output_names.data(), output_names.size());
  return fetched;
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

std::filesystem::path copy_model(const std::string& name, const std::filesystem::path& folder) {
  const std::filesystem::path source = testing::generated_models() / name;
  std::filesystem::create_directories(folder);
  std::filesystem::copy_file(source, folder / source.filename());
  // External data: <stem>.weights beside the model.
  const std::filesystem::path data = source.parent_path() / (source.stem().string() + ".weights");
  if (std::filesystem::exists(data)) std::filesystem::copy_file(data, folder / data.filename());
  return folder / source.filename();
}

std::set<std::string> files_in(const std::filesystem::path& folder) {
  std::set<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(folder)) names.insert(e.path().filename().string());
  return names;
}

bool is_virtual(const Ort::ConstEpDevice& device) {
  const char* value = device.Device().Metadata().GetValue("is_virtual");
  return value != nullptr && std::string(value) == "1";
}

void expect_matches_original(Ort::Session& actual, const std::filesystem::path& original) {
  const Feeds feeds = make_feeds(actual);
  const Fetched got = run_all(actual, feeds);
  Ort::Session reference(Plugin::env(), original.c_str(), Ort::SessionOptions{});
  const Fetched want = run_all(reference, feeds);
  ASSERT_EQ(got.names, want.names);
  for (size_t o = 0; o < got.values.size(); ++o) {
    const auto info = want.values[o].GetTensorTypeAndShapeInfo();
    ASSERT_EQ(got.values[o].GetTensorTypeAndShapeInfo().GetShape(), info.GetShape()) << got.names[o];
    ASSERT_EQ(info.GetElementType(), ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT) << got.names[o];
    const float* a = got.values[o].GetTensorData<float>();
    const float* b = want.values[o].GetTensorData<float>();
    for (size_t i = 0; i < info.GetElementCount(); ++i) {
      ASSERT_NEAR(a[i], b[i], 1e-4f * (1.0f + std::fabs(b[i]))) << "output '" << got.names[o] << "' element " << i;
    }
  }
}

Assigned assigned_to_ctxgen(const Ort::Session& session) {
  const OrtApi& ort = Ort::GetApi();
  const OrtEpAssignedSubgraph* const* subgraphs = nullptr;
  size_t count = 0;
  Ort::ThrowOnError(ort.Session_GetEpGraphAssignmentInfo(session, &subgraphs, &count));
  Assigned assigned;
  for (size_t s = 0; s < count; ++s) {
    const char* ep = nullptr;
    Ort::ThrowOnError(ort.EpAssignedSubgraph_GetEpName(subgraphs[s], &ep));
    const OrtEpAssignedNode* const* nodes = nullptr;
    size_t node_count = 0;
    Ort::ThrowOnError(ort.EpAssignedSubgraph_GetNodes(subgraphs[s], &nodes, &node_count));
    if (std::string(ep) == "CtxgenRef") {
      ++assigned.subgraphs;
      assigned.nodes += node_count;
      continue;
    }
    for (size_t n = 0; n < node_count; ++n) {
      const char* name = nullptr;
      Ort::ThrowOnError(ort.EpAssignedNode_GetName(nodes[n], &name));
      assigned.elsewhere.insert(name);
    }
  }
  return assigned;
}

}  // namespace ctxgen::ort_test

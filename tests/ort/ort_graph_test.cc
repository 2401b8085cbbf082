// ONNX Runtime's graph as a ctxgen model (lib/ort_ep/ort_model.cc), on its own: inside a session's
// GetCapability, the test backend (test_backend.h) is asked about exactly the model the CLI's load
// and specialise stages make of the same file: the same nodes and attributes, constants with the
// same bytes, the same types. (A node with subgraphs is the exception: it reaches the backend as an
// opaque stand-in, ort_model.h, and stays with ORT; ort_ordinary_test checks where it runs.)

#include <gtest/gtest.h>

#include <onnxruntime_cxx_api.h>

#include <cstdlib>
#include <map>

#include "ctxgen/model.h"
#include "ctxgen/ort_telemetry.h"
#include "ctxgen/specialise.h"
#include "test_backend.h"
#include "test_util.h"

namespace ctxgen::testing {
namespace {

struct Case {
  std::string model;  // in testdata/generate.py's output, or under testdata/ for exports/...
  std::map<std::string, int64_t> dims;
};

void PrintTo(const Case& c, std::ostream* out) { *out << c.model; }

fs::path path_of(const Case& c) {
  return c.model.rfind("exports/", 0) == 0 ? fs::path(CTXGEN_SOURCE_DIR) / "testdata" / c.model
                                           : generated_models() / c.model;
}

// What the test backend was asked about in a session on `model` through its plugin, ORT's own
// optimizations off so the graph is the file's.
std::string seen_in_ort(const fs::path& model, const std::map<std::string, int64_t>& dims, const TempDir& dir) {
  static Ort::Env env = [] {
    ctxgen::opt_out_of_ort_telemetry();
    return Ort::Env(ORT_LOGGING_LEVEL_WARNING, "ort_graph_test");
  }();
  static const bool registered = [] {
    env.RegisterExecutionProviderLibrary("ctxgen_test_ep", CTXGEN_TEST_EP_PATH);
    return true;
  }();
  (void)registered;
  std::vector<Ort::ConstEpDevice> devices;
  for (const auto& device : env.GetEpDevices())
    if (std::string(device.EpName()) == "CtxgenTest") devices.push_back(device);
  EXPECT_FALSE(devices.empty());
  Ort::SessionOptions options;
  options.SetGraphOptimizationLevel(ORT_DISABLE_ALL);
  for (const auto& [name, value] : dims) options.AddFreeDimensionOverrideByName(name.c_str(), value);
  options.AppendExecutionProvider_V2(env, devices, Ort::KeyValuePairs{});
  ::setenv("CTXGEN_TEST_BACKEND_MODELS", dir.path().c_str(), 1);
  { Ort::Session session(env, model.c_str(), options); }
  ::unsetenv("CTXGEN_TEST_BACKEND_MODELS");
  return read_file(dir.path() / "model.txt");
}

class OrtGraphTest : public ::testing::TestWithParam<Case> {};

TEST_P(OrtGraphTest, HandsTheBackendTheModelTheFileLoaderGives) {
  TempDir dir;
  LoadOptions load;
  load.fix_dims = GetParam().dims;
  // Specialised as the plugin specialises: folded values keep their bytes (ORT's graph reads them).
  Model model = load_model(path_of(GetParam()), load);
  SpecialiseOptions keep;
  keep.keep_folded_values = true;
  specialise(model, keep);
  const std::string expected = describe_model(model);
  const std::string seen = seen_in_ort(path_of(GetParam()), GetParam().dims, dir);
  ASSERT_FALSE(seen.empty()) << "the test backend was not asked about the model in ORT";
  EXPECT_EQ(seen, expected);
}

INSTANTIATE_TEST_SUITE_P(Models, OrtGraphTest,
                         ::testing::Values(Case{"cnn.onnx", {}}, Case{"islands.onnx", {}}, Case{"constants.onnx", {}},
                                           Case{"external.onnx", {}},
                                           Case{"exports/cnn_upsample.onnx", {{"batch", 1}}},
                                           Case{"exports/decoder_prefill.onnx", {{"batch", 1}, {"seq", 16}}}),
                         [](const auto& info) {
                           std::string name = fs::path(info.param.model).stem().string();
                           for (char& c : name)
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return name;
                         });

}  // namespace
}  // namespace ctxgen::testing

// The runtime-only plugin library (libctxgen_ort_ep_runtime.so): the same EP CtxgenRef without the
// compiler. What it runs is tested by ort_plugin_test and ort_compiled_test run again with it
// (their .runtime_only tests); here, what it does instead of compiling.

#include <gtest/gtest.h>

#include <mutex>

#include "ort_harness.h"
#include "test_util.h"

namespace fs = std::filesystem;

namespace ctxgen::ort_test {
namespace {

// The messages ORT logs, EPs' included. The environment is the process's one: made here first,
// with this sink, Plugin::env() gets it.
struct Log {
  std::mutex mutex;
  std::string text;
};

Log& log() {
  static Log log;
  return log;
}

void capture(void*, OrtLoggingLevel, const char*, const char*, const char*, const char* message) {
  std::lock_guard<std::mutex> lock(log().mutex);
  log().text += std::string(message) + "\n";
}

class RuntimeOnlyTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    static Ort::Env env(ORT_LOGGING_LEVEL_WARNING, "ctxgen-runtime-only-test", capture, nullptr);
    ASSERT_STREQ(Plugin::library(), CTXGEN_ORT_EP_RUNTIME_PATH) << "run with CTXGEN_TEST_RUNTIME_ONLY=1";
    Plugin::register_library();
  }
  testing::TempDir dir_;
};

TEST_F(RuntimeOnlyTest, LeavesAnOrdinaryModelToOnnxRuntimeAndSaysWhy) {
  const fs::path model = copy_model("islands.onnx", dir_.path());
  Ort::Session session = open_session(model, plugin_options({{"session.record_ep_graph_assignment_info", "1"}}));
  const Assigned assigned = assigned_to_ctxgen(session);
  EXPECT_EQ(assigned.nodes, 0u);
  EXPECT_FALSE(assigned.elsewhere.empty());
  expect_matches_original(session, model);
  std::lock_guard<std::mutex> lock(log().mutex);
  EXPECT_NE(log().text.find("claims no nodes: the model has no EPContext nodes of CtxgenRef, and this plugin library "
                            "only runs compiled models"),
            std::string::npos)
      << log().text;
}

TEST_F(RuntimeOnlyTest, RefusesToGenerateEpContextModels) {
  const fs::path model = copy_model("islands.onnx", dir_.path());
  Ort::SessionOptions options = plugin_options();
  Ort::ModelCompilationOptions compile(Plugin::env(), options);
  compile.SetInputModelPath(model.c_str());
  compile.SetOutputModelPath((dir_.path() / "islands_ctx.onnx").c_str());
  try {
    Ort::ThrowOnError(Ort::CompileModel(Plugin::env(), compile));
    FAIL() << "compiled with the runtime-only library";
  } catch (const Ort::Exception& e) {
    EXPECT_NE(std::string(e.what()).find("library only runs compiled models and cannot generate EPContext models"),
              std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(fs::exists(dir_.path() / "islands_ctx.onnx"));
}

}  // namespace
}  // namespace ctxgen::ort_test

// Backends are pluggable: a second backend (test_backend.h) compiles through the same pipeline,
// its outputs carry its identity, and they run in ONNX Runtime through its own plugin library,
// built from the same EP code with nothing but its BackendRuntime different; verify checks and
// runs them given that runtime. The ref plugin does not take them.

#include <gtest/gtest.h>

#include <onnx/onnx_pb.h>

#include <set>
#include <string>

#include "ctxgen/backend.h"
#include "ctxgen/error.h"
#include "ctxgen/format.h"
#include "ctxgen/pipeline.h"
#include "ctxgen/runtime.h"
#include "ctxgen/verify.h"
#include "test_backend.h"
#include "test_util.h"

namespace ctxgen::testing {
namespace {

std::string attribute(const onnx::NodeProto& node, const std::string& name) {
  for (const auto& a : node.attribute())
    if (a.name() == name) return a.s();
  return "";
}

TEST(PluggableBackend, CompilesAndRunsThroughItsOwnPluginAndVerify) {
  TempDir dir;
  const fs::path model = generated_models() / "cnn.onnx";
  BackendRegistry backends;
  backends.add(make_test_backend());
  CompileOptions options;
  options.backend = "test";
  options.output_dir = dir.path();
  compile_models({model}, options, backends);

  std::set<std::string> files;
  for (const auto& e : fs::directory_iterator(dir.path())) files.insert(e.path().filename().string());
  EXPECT_EQ(files, (std::set<std::string>{"cnn_ctx.onnx", "cnn_test.bin"}));
  EXPECT_EQ(ContextBinary::open(dir.path() / "cnn_test.bin")->identity(), test_identity());
  onnx::ModelProto proto;
  ASSERT_TRUE(proto.ParseFromString(read_file(dir.path() / "cnn_ctx.onnx")));
  size_t ours = 0;
  for (const auto& node : proto.graph().node()) {
    if (node.op_type() != "EPContext") continue;
    ++ours;
    EXPECT_EQ(attribute(node, "source"), "CtxgenTest");
    EXPECT_EQ(attribute(node, "ep_sdk_version"), "ctxgen-test 1.0");
    EXPECT_EQ(attribute(node, "ep_cache_context"), "cnn_test.bin");
  }
  EXPECT_GT(ours, 0u);
  std::map<std::string, std::string> metadata;
  for (const auto& entry : proto.metadata_props()) metadata[entry.key()] = entry.value();
  EXPECT_EQ(metadata[kCompatibilityMetadataPrefix + "CtxgenTest"], compatibility_info(test_identity()));
  EXPECT_EQ(metadata.count(kCompatibilityMetadataPrefix + "CtxgenRef"), 0u);

  verify::Options check;
  check.models = {dir.path() / "cnn_ctx.onnx"};
  check.references = {model};
  check.plugin = CTXGEN_TEST_EP_PATH;
  check.runtime = make_test_runtime();
  const verify::Result result = verify::run_isolated(check);
  EXPECT_TRUE(result.ok());
  ASSERT_FALSE(result.outputs.empty());
  bool loaded = false;
  for (const auto& line : result.checks) loaded = loaded || line.find("loads in ONNX Runtime with CtxgenTest") != std::string::npos;
  EXPECT_TRUE(loaded);

  // The ref backend's plugin and identity do not take another backend's outputs.
  check.plugin = CTXGEN_ORT_EP_PATH;
  check.runtime = runtime::make_ref_runtime();
  try {
    verify::run_isolated(check);
    ADD_FAILURE() << "the ref plugin ran a model compiled for CtxgenTest";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("its EPContext nodes are for CtxgenTest, not CtxgenRef"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace ctxgen::testing

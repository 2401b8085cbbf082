// ctxgen outputs in real ONNX Runtime through the ctxgen plugin EP: models run and match ORT's CPU
// EP on plain twins; binaries are shared across sessions; every bad EPContext node is refused with
// ORT_INVALID_GRAPH and a message that names the node and the offending value.

#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "ctxgen/ref_identity.h"
#include "ctxgen/runtime.h"
#include "ort_artifacts.h"
#include "ort_harness.h"
#include "test_util.h"

namespace fs = std::filesystem;

namespace ctxgen::ort_test {
namespace {

class OrtPluginTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    folder_ = std::make_unique<testing::TempDir>();
    make_artifacts(folder_->path());
  }
  static void TearDownTestSuite() { folder_.reset(); }
  void SetUp() override { Plugin::register_library(); }

  static fs::path model(const std::string& name) { return folder_->path() / name; }

  // The plugin's result for `ctx_model` equals ORT's CPU EP result for `plain_model`.
  static void expect_matches_cpu(Ort::Session& session, const std::string& plain_model) {
    const std::vector<float> expected = run_on_cpu(model(plain_model), test_input());
    const std::vector<float> actual = run(session, test_input());
    ASSERT_EQ(actual.size(), expected.size());
    for (size_t i = 0; i < expected.size(); ++i) EXPECT_NEAR(actual[i], expected[i], 1e-5f) << "element " << i;
  }

  static void expect_invalid_graph(const std::optional<Failure>& failure, const std::vector<std::string>& fragments) {
    ASSERT_TRUE(failure.has_value()) << "session creation succeeded";
    EXPECT_EQ(failure->code, ORT_INVALID_GRAPH) << failure->message;
    for (const std::string& fragment : fragments) {
      EXPECT_NE(failure->message.find(fragment), std::string::npos)
          << "message lacks '" << fragment << "': " << failure->message;
    }
  }

  static inline std::unique_ptr<testing::TempDir> folder_;
};

TEST_F(OrtPluginTest, OffersTheCpuAsItsDevice) {
  const Ort::ConstEpDevice device = Plugin::device();
  EXPECT_STREQ(device.EpName(), ref::kEpName);
  EXPECT_STREQ(device.EpVendor(), "ctxgen");
  EXPECT_EQ(device.Device().Type(), OrtHardwareDeviceType_CPU);
}

TEST_F(OrtPluginTest, SinglePartitionMatchesCpu) {
  Ort::Session session = open_session(model("single_ctx.onnx"), plugin_options());
  expect_matches_cpu(session, "single_plain.onnx");
}

TEST_F(OrtPluginTest, SeveralEpContextNodesWithACpuNodeBetweenMatchCpu) {
  const PluginStats before = Plugin::stats();
  Ort::Session session = open_session(model("multi_ctx.onnx"), plugin_options());
  // The main_context=0 node finds its graph in the binary the main node loaded.
  EXPECT_EQ(Plugin::stats().opened - before.opened, 1u);
  expect_matches_cpu(session, "multi_plain.onnx");
}

TEST_F(OrtPluginTest, EmbedModeMatchesCpuWithoutOpeningAFile) {
  const PluginStats before = Plugin::stats();
  Ort::Session session = open_session(model("embed_ctx.onnx"), plugin_options());
  EXPECT_EQ(Plugin::stats().opened, before.opened);
  expect_matches_cpu(session, "single_plain.onnx");
}

TEST_F(OrtPluginTest, ValueFedTwiceAndOutputNeverReadMatchCpu) {
  Ort::Session session = open_session(model("pair_ctx.onnx"), plugin_options());
  expect_matches_cpu(session, "pair_plain.onnx");
  // A second run reuses the first run's buffers, the unread output's among them.
  expect_matches_cpu(session, "pair_plain.onnx");
}

TEST_F(OrtPluginTest, SymbolicDimsAreCheckedAgainstTheCompiledShapeAtRunTime) {
  Ort::Session session = open_session(model("dynamic_ctx.onnx"), plugin_options());
  expect_matches_cpu(session, "single_plain.onnx");
  try {
    run(session, std::vector<float>(9, 1.0f), {3, 3});
    FAIL() << "a [3,3] input ran on a graph compiled for [2,3]";
  } catch (const Ort::Exception& e) {
    EXPECT_EQ(e.GetOrtErrorCode(), ORT_INVALID_ARGUMENT) << e.what();
    EXPECT_NE(std::string(e.what()).find("input 0 'x' is float32 [3,3] but graph 'g_add' was compiled for "
                                         "float32 [2,3]"),
              std::string::npos)
        << e.what();
  }
  // The refused run leaves the node able to run again.
  expect_matches_cpu(session, "single_plain.onnx");
}

TEST_F(OrtPluginTest, ModelFromMemoryFindsItsBinaryThroughContextFilePath) {
  const std::vector<char> bytes = read_bytes(model("single_ctx.onnx"));
  Ort::SessionOptions options = plugin_options({{"ep.context_file_path", model("single_ctx.onnx").string()}});
  Ort::Session session(Plugin::env(), bytes.data(), bytes.size(), options);
  expect_matches_cpu(session, "single_plain.onnx");
}

TEST_F(OrtPluginTest, ModelFromMemoryWithoutContextFilePathIsRefused) {
  expect_invalid_graph(session_failure(read_bytes(model("single_ctx.onnx")), plugin_options()),
                       {"add_node", "model_ref.bin", "ep.context_file_path"});
}

// Two sessions whose models both point at model_ref.bin, destroyed in either order.
class SharingTest : public OrtPluginTest, public ::testing::WithParamInterface<bool> {};

TEST_P(SharingTest, TwoSessionsMapTheBinaryOnceAndReleaseItWithTheLast) {
  const bool destroy_first_session_first = GetParam();
  const PluginStats before = Plugin::stats();
  const Ort::SessionOptions options = plugin_options({{"ep.share_ep_contexts", "1"}});
  auto first = std::make_unique<Ort::Session>(open_session(model("single_ctx.onnx"), options));
  auto second = std::make_unique<Ort::Session>(open_session(model("mm_ctx.onnx"), options));
  EXPECT_EQ(Plugin::stats().opened - before.opened, 1u);
  EXPECT_EQ(Plugin::stats().live - before.live, 1u);

  auto& destroyed = destroy_first_session_first ? first : second;
  auto& kept = destroy_first_session_first ? second : first;
  destroyed.reset();
  EXPECT_EQ(Plugin::stats().live - before.live, 1u) << "the remaining session still uses the binary";
  expect_matches_cpu(*kept, destroy_first_session_first ? "mm_plain.onnx" : "single_plain.onnx");
  kept.reset();
  EXPECT_EQ(Plugin::stats().live, before.live) << "the binary outlived its last session";
}

INSTANTIATE_TEST_SUITE_P(DestroyOrder, SharingTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "FirstSessionFirst" : "SecondSessionFirst"; });

// A link that stays in the model folder loads the file it names, whether its target is relative
// (the kernel keeps it beneath the folder) or absolute (checked by its canonical path), and
// sessions share the file by that path, however their models name it.
TEST_F(OrtPluginTest, SymlinkInsideTheModelFolderLoadsTheFileItNames) {
  for (const char* name : {"path_relative_link_ctx.onnx", "path_absolute_link_ctx.onnx"}) {
    Ort::Session session = open_session(model(name), plugin_options());
    expect_matches_cpu(session, "single_plain.onnx");
  }
  const PluginStats before = Plugin::stats();
  const Ort::SessionOptions options = plugin_options({{"ep.share_ep_contexts", "1"}});
  Ort::Session direct = open_session(model("single_ctx.onnx"), options);
  Ort::Session relative = open_session(model("path_relative_link_ctx.onnx"), options);
  Ort::Session absolute = open_session(model("path_absolute_link_ctx.onnx"), options);
  EXPECT_EQ(Plugin::stats().opened - before.opened, 1u);
  expect_matches_cpu(absolute, "single_plain.onnx");
}

TEST_F(OrtPluginTest, WithoutSharingEachSessionMapsItsOwnBinary) {
  const PluginStats before = Plugin::stats();
  Ort::Session first = open_session(model("single_ctx.onnx"), plugin_options());
  Ort::Session second = open_session(model("mm_ctx.onnx"), plugin_options());
  EXPECT_EQ(Plugin::stats().opened - before.opened, 2u);
  EXPECT_EQ(Plugin::stats().live - before.live, 2u);
}

TEST_F(OrtPluginTest, LaterSessionRunsAGraphFromABinaryAnEarlierSessionShared) {
  const Ort::SessionOptions options = plugin_options({{"ep.share_ep_contexts", "1"}});
  Ort::Session first = open_session(model("single_ctx.onnx"), options);
  const PluginStats before = Plugin::stats();
  Ort::Session second = open_session(model("mm_nomain_ctx.onnx"), options);
  EXPECT_EQ(Plugin::stats().opened, before.opened);
  expect_matches_cpu(second, "mm_plain.onnx");
}

TEST_F(OrtPluginTest, GraphOfAnEarlierSessionNeedsSharing) {
  Ort::Session first = open_session(model("single_ctx.onnx"), plugin_options());
  expect_invalid_graph(session_failure(model("mm_nomain_ctx.onnx"), plugin_options()),
                       {"mm_node", "g_mm", "not found", "ep.share_ep_contexts=1"});
}

TEST_F(OrtPluginTest, SharedGraphIsGoneWithTheSessionThatLoadedIt) {
  const Ort::SessionOptions options = plugin_options({{"ep.share_ep_contexts", "1"}});
  open_session(model("single_ctx.onnx"), options);
  expect_invalid_graph(session_failure(model("mm_nomain_ctx.onnx"), options),
                       {"mm_node", "g_mm", "not found", "another live session"});
}

struct RefusedModel {
  std::string name;
  std::string model;
  std::vector<std::string> fragments;  // the message names the node and the offending value
};
void PrintTo(const RefusedModel& refused, std::ostream* out) { *out << refused.model; }

class RefusedModelTest : public OrtPluginTest, public ::testing::WithParamInterface<RefusedModel> {};

TEST_P(RefusedModelTest, IsInvalidGraphNamingNodeAndValue) {
  expect_invalid_graph(session_failure(model(GetParam().model), plugin_options()), GetParam().fragments);
}

INSTANTIATE_TEST_SUITE_P(
    BadContext, RefusedModelTest,
    ::testing::Values(
        RefusedModel{"EmptyPath", "path_empty_ctx.onnx", {"add_node", "ep_cache_context ''", "is empty"}},
        RefusedModel{"AbsolutePath", "path_absolute_ctx.onnx", {"add_node", "model_ref.bin", "absolute path"}},
        RefusedModel{"ParentPath", "sub/path_dotdot_ctx.onnx", {"add_node", "'../model_ref.bin'", "'..'"}},
        RefusedModel{"SymlinkOutOfFolder",
                     "sub_link/path_symlink_ctx.onnx",
                     {"add_node", "'link.bin'", "outside the model folder"}},
        RefusedModel{"MissingFile", "path_missing_ctx.onnx", {"add_node", "missing.bin", "does not exist"}},
        RefusedModel{"EmptyFile", "path_emptyfile_ctx.onnx", {"add_node", "empty.bin", "is empty"}},
        RefusedModel{"Folder", "path_folder_ctx.onnx", {"add_node", "'sub'", "not a regular file"}},
        RefusedModel{"DanglingLink", "path_dangling_ctx.onnx", {"add_node", "dangling.bin", "does not exist"}},
        RefusedModel{"OtherSdkBinary",
                     "identity_ctx.onnx",
                     {"add_node", "other_sdk.bin", "sdk_version", "'ctxgen-ref 0.9'", std::string("'") + ref::kSdkVersion + "'"}},
        RefusedModel{"OtherCpuLevel",
                     "other_cpu_ctx.onnx",
                     {"add_node", "other_cpu.bin", "hardware_architecture", std::string("'") + kOtherCpu + "'",
                      "'" + runtime::hardware_architecture() + "'"}},
        RefusedModel{"OtherFormatVersion",
                     "version_ctx.onnx",
                     {"add_node", "future_version.bin", "format version " + std::to_string(kContextBinaryVersion + 1),
                      "version " + std::to_string(kContextBinaryVersion)}},
        RefusedModel{"NodeFromOtherSdk",
                     "node_version_ctx.onnx",
                     {"add_node", "ep_sdk_version", "'ctxgen-ref 0.1'", std::string("'") + ref::kSdkVersion + "'"}},
        RefusedModel{"NodeForOtherHardware",
                     "node_hardware_ctx.onnx",
                     {"add_node", "hardware_architecture", "'npu-x'", "'" + runtime::hardware_architecture() + "'"}},
        RefusedModel{"InputShape", "shape_ctx.onnx", {"add_node", "input 0 'X'", "[2,4]", "[2,3]"}},
        RefusedModel{"InputType", "type_ctx.onnx", {"add_node", "input 0 'X'", "float64", "float32"}},
        RefusedModel{"OutputCount", "output_count_ctx.onnx", {"add_node", "has 2 outputs but graph 'g_add'", "has 1"}},
        RefusedModel{"UnknownGraph", "missing_graph_ctx.onnx", {"add_node", "'g_nope'", "not found"}}),
    [](const auto& info) { return info.param.name; });

TEST_F(OrtPluginTest, JudgesCompatibilityInfoOfThisBuildOptimalAndOtherVersionsUnsupported) {
  const std::string ours = compatibility_info();
  EXPECT_EQ(Ort::GetModelCompatibilityForEpDevices({Plugin::device()}, ours.c_str()),
            OrtCompiledModelCompatibility_EP_SUPPORTED_OPTIMAL);
  std::string older = ours;
  const std::string version = "ctxgen-context-binary=" + std::to_string(kContextBinaryVersion) + ";";
  ASSERT_EQ(older.rfind(version, 0), 0u) << older;
  older.replace(0, version.size(), "ctxgen-context-binary=0;");
  EXPECT_EQ(Ort::GetModelCompatibilityForEpDevices({Plugin::device()}, older.c_str()),
            OrtCompiledModelCompatibility_EP_UNSUPPORTED);
}

// A binary packed for a CPU level this CPU's includes runs, slower than one packed for this level:
// worth recompiling. One packed for a level it does not include, or by another oneDNN, does not run.
TEST_F(OrtPluginTest, JudgesLowerCpuLevelsWorthRecompilingAndOthersUnsupported) {
  const std::string ours = compatibility_info();
  const std::string host = runtime::hardware_architecture();  // "x86_64 LEVEL, oneDNN X.Y.Z"
  const size_t level_at = host.find(' ') + 1, level_end = host.find(',');
  ASSERT_NE(host.substr(level_at, level_end - level_at), "sse41") << "this test needs a CPU above sse41";
  auto with_level = [&](const std::string& level) {
    std::string info = ours;
    info.replace(info.size() - host.size() + level_at, level_end - level_at, level);
    return info;
  };
  EXPECT_EQ(Ort::GetModelCompatibilityForEpDevices({Plugin::device()}, with_level("sse41").c_str()),
            OrtCompiledModelCompatibility_EP_SUPPORTED_PREFER_RECOMPILATION)
      << with_level("sse41");
  EXPECT_EQ(Ort::GetModelCompatibilityForEpDevices({Plugin::device()}, with_level("avx3").c_str()),
            OrtCompiledModelCompatibility_EP_UNSUPPORTED);
  std::string other_library = ours;
  other_library.replace(other_library.rfind("oneDNN "), std::string::npos, "oneDNN 9.9.9");
  EXPECT_EQ(Ort::GetModelCompatibilityForEpDevices({Plugin::device()}, other_library.c_str()),
            OrtCompiledModelCompatibility_EP_UNSUPPORTED);
}

TEST_F(OrtPluginTest, ModelRecordingThisBuildsCompatibilityInfoRuns) {
  Ort::AllocatorWithDefaultOptions allocator;
  const auto recorded = Ort::GetCompatibilityInfoFromModelAllocated(model("compat_ctx.onnx").c_str(), ref::kEpName,
                                                                    allocator);
  ASSERT_NE(recorded.get(), nullptr);
  EXPECT_EQ(std::string(recorded.get()), compatibility_info());
  Ort::Session session = open_session(model("compat_ctx.onnx"), plugin_options());
  expect_matches_cpu(session, "single_plain.onnx");
}

TEST_F(OrtPluginTest, ModelRecordingAnotherFormatVersionIsRefusedByOrt) {
  // ORT asks the factory before it partitions and refuses what the EP calls unsupported.
  const std::optional<Failure> failure = session_failure(model("stale_compat_ctx.onnx"), plugin_options());
  ASSERT_TRUE(failure.has_value());
  EXPECT_EQ(failure->code, ORT_FAIL) << failure->message;
  EXPECT_NE(failure->message.find("Compiled model is not supported by execution provider: CtxgenRef"),
            std::string::npos)
      << failure->message;
}

// ORT 1.29's own error when no EP in the session claims an EPContext node.
void expect_unclaimed(const std::optional<Failure>& failure, const std::string& source,
                      const std::string& session_eps) {
  ASSERT_TRUE(failure.has_value()) << "session creation succeeded";
  EXPECT_EQ(failure->code, ORT_NOT_IMPLEMENTED) << failure->message;
  for (const std::string& fragment :
       {"EPContext node generated by '" + source + "' is not compatible with any execution provider added to the "
        "session. EPContext node name: 'add_node'. Available session execution providers: [" + session_eps + "]"}) {
    EXPECT_NE(failure->message.find(fragment), std::string::npos) << failure->message;
  }
}

TEST_F(OrtPluginTest, EpContextNodeOfAnotherEpIsNotClaimed) {
  // The plugin is in the session yet leaves the node to others; nobody takes it, so ORT refuses.
  expect_unclaimed(session_failure(model("foreign_ctx.onnx"), plugin_options()), "QNNExecutionProvider",
                   std::string(ref::kEpName) + ", CPUExecutionProvider");
}

// Cross-compiling: registered under a name ending in ".virtual" (ORT then allows virtual devices),
// the plugin also offers a virtual device; a session on it alone loads a model but a run says it
// cannot, and a session given both devices runs.
TEST_F(OrtPluginTest, OffersAVirtualDeviceOnlyWhenRegisteredAsVirtualAndItDoesNotRun) {
  size_t ours = 0;
  for (const Ort::ConstEpDevice& device : Plugin::env().GetEpDevices()) {
    if (std::string(device.EpName()) != ref::kEpName) continue;
    ++ours;
    EXPECT_FALSE(is_virtual(device));
  }
  EXPECT_EQ(ours, 1u);

  Plugin::unregister_library();
  constexpr const char* kVirtualName = "ctxgen_ort_ep.virtual";
  Plugin::env().RegisterExecutionProviderLibrary(kVirtualName, Plugin::library());
  {
    std::vector<Ort::ConstEpDevice> virtual_devices, all;
    for (const Ort::ConstEpDevice& device : Plugin::env().GetEpDevices()) {
      if (std::string(device.EpName()) != ref::kEpName) continue;
      all.push_back(device);
      if (is_virtual(device)) virtual_devices.push_back(device);
    }
    EXPECT_EQ(all.size(), 2u) << "the CPU device stays on offer";
    ASSERT_EQ(virtual_devices.size(), 1u);
    {  // Given both, a session runs on the real one.
      Ort::SessionOptions both;
      both.AppendExecutionProvider_V2(Plugin::env(), all, std::unordered_map<std::string, std::string>{});
      Ort::Session session = open_session(model("single_ctx.onnx"), both);
      expect_matches_cpu(session, "single_plain.onnx");
    }
    Ort::SessionOptions options;
    options.AppendExecutionProvider_V2(Plugin::env(), virtual_devices, std::unordered_map<std::string, std::string>{});
    Ort::Session session = open_session(model("single_ctx.onnx"), options);
    try {
      run(session, test_input());
      ADD_FAILURE() << "a session on the virtual device ran";
    } catch (const Ort::Exception& e) {
      EXPECT_NE(std::string(e.what()).find("virtual device"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("cannot run them"), std::string::npos) << e.what();
    }
  }
  Plugin::env().UnregisterExecutionProviderLibrary(kVirtualName);
  Plugin::register_library();
}

TEST_F(OrtPluginTest, WithoutThePluginOrtCannotRunTheModel) {
  Plugin::unregister_library();
  const std::optional<Failure> failure = session_failure(model("single_ctx.onnx"), Ort::SessionOptions{});
  Plugin::register_library();
  expect_unclaimed(failure, ref::kEpName, "CPUExecutionProvider");
}

}  // namespace
}  // namespace ctxgen::ort_test

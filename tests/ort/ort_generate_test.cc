// CtxgenRef as the compiler inside ONNX Runtime: sessions with ep.context_enable=1 and ORT's Compile
// API write the EPContext models and context binary `ctxgen compile` writes; shared compile sessions
// write one binary for the group, the same one `ctxgen share` writes; the outputs run in ORT and
// match the CPU EP on the originals.

#include <gtest/gtest.h>

#include <onnx/onnx_pb.h>

#include <map>
#include <set>

#include "ctxgen/format.h"
#include "ctxgen/runtime.h"
#include "ort_harness.h"
#include "test_util.h"

namespace fs = std::filesystem;

namespace ctxgen::ort_test {
namespace {

using testing::quote;

onnx::ModelProto read_model(const fs::path& path) {
  onnx::ModelProto proto;
  EXPECT_TRUE(proto.ParseFromString(testing::read_file(path))) << path;
  return proto;
}

std::map<std::string, std::string> string_attributes(const onnx::NodeProto& node) {
  std::map<std::string, std::string> attributes;
  for (const auto& a : node.attribute())
    attributes[a.name()] = a.type() == onnx::AttributeProto::INT ? std::to_string(a.i()) : a.s();
  return attributes;
}

std::vector<onnx::NodeProto> ep_context_nodes(const onnx::ModelProto& model) {
  std::vector<onnx::NodeProto> nodes;
  for (const auto& node : model.graph().node())
    if (node.op_type() == "EPContext") nodes.push_back(node);
  return nodes;
}

// Compiles `input` to `output` through ORT's Compile API with CtxgenRef.
void compile_with_ort(const fs::path& input, const fs::path& output, const Config& config = {}, uint32_t flags = 0,
                      bool embed = false) {
  Ort::SessionOptions options = plugin_options(config);
  Ort::ModelCompilationOptions compile(Plugin::env(), options);
  compile.SetInputModelPath(input.c_str());
  compile.SetOutputModelPath(output.c_str());
  compile.SetEpContextEmbedMode(embed);
  compile.SetFlags(flags);
  Ort::ThrowOnError(Ort::CompileModel(Plugin::env(), compile));
}

class GenerateTest : public ::testing::Test {
 protected:
  void SetUp() override { Plugin::register_library(); }
  testing::TempDir dir_;
};

TEST_F(GenerateTest, ASessionWithContextEnableWritesTheModelAndBinaryTheCliWrites) {
  const fs::path original = copy_model("islands.onnx", dir_ / "in");
  {
    Ort::Session session = open_session(original, plugin_options({{"ep.context_enable", "1"}}));
    // The generating session runs too.
    expect_matches_original(session, original);
  }
  EXPECT_EQ(files_in(dir_ / "in"), (std::set<std::string>{"islands.onnx", "islands_ctx.onnx", "islands_ref.bin"}));
  const auto nodes = ep_context_nodes(read_model(dir_ / "in" / "islands_ctx.onnx"));
  ASSERT_EQ(nodes.size(), 3u);  // islands.onnx has three partitions
  for (size_t i = 0; i < nodes.size(); ++i) {
    auto attributes = string_attributes(nodes[i]);
    EXPECT_EQ(nodes[i].domain(), "com.microsoft");
    EXPECT_EQ(attributes["source"], "CtxgenRef");
    EXPECT_EQ(attributes["partition_name"], "islands_ref_" + std::to_string(i));
    EXPECT_EQ(attributes["main_context"], i == 0 ? "1" : "0");
    EXPECT_EQ(attributes["embed_mode"], "0");
    EXPECT_EQ(attributes.count("ep_cache_context"), i == 0 ? 1u : 0u);
    if (i == 0) {
      EXPECT_EQ(attributes["ep_cache_context"], "islands_ref.bin");
    }
    EXPECT_EQ(attributes["ep_sdk_version"], runtime::ref_identity().sdk_version);
    EXPECT_EQ(attributes["hardware_architecture"], runtime::ref_identity().hardware_architecture);
  }
  EXPECT_EQ(ContextBinary::open(dir_ / "in" / "islands_ref.bin")->identity(), runtime::ref_identity());
  Ort::Session compiled = open_session(dir_ / "in" / "islands_ctx.onnx", plugin_options());
  expect_matches_original(compiled, original);
}

TEST_F(GenerateTest, TheCompileApiWritesWhereItIsToldAndHonoursThePrefix) {
  const fs::path original = copy_model("cnn.onnx", dir_ / "in");
  const fs::path output = dir_ / "out" / "compiled.onnx";
  fs::create_directories(output.parent_path());
  compile_with_ort(original, output, {{"ep.context_node_name_prefix", "p_"}});
  // Named after the compiled model, as the CLI names it for -o.
  EXPECT_EQ(files_in(dir_ / "out"), (std::set<std::string>{"compiled.onnx", "compiled_ref.bin"}));
  const auto nodes = ep_context_nodes(read_model(output));
  ASSERT_FALSE(nodes.empty());
  // ORT places an EPContext node where its fused node was by name, so the node keeps ORT's name;
  // the graph it runs carries the prefix.
  EXPECT_EQ(string_attributes(nodes[0])["partition_name"], "p_cnn_ref_0");
  Ort::Session compiled = open_session(output, plugin_options());
  expect_matches_original(compiled, original);
}

TEST_F(GenerateTest, EmbedModePutsTheBinaryInTheMainNode) {
  const fs::path original = copy_model("cnn.onnx", dir_ / "in");
  const fs::path output = dir_ / "in" / "cnn_ctx.onnx";
  compile_with_ort(original, output, {}, 0, true);
  EXPECT_EQ(files_in(dir_ / "in"), (std::set<std::string>{"cnn.onnx", "cnn_ctx.onnx"}));
  const auto nodes = ep_context_nodes(read_model(output));
  ASSERT_FALSE(nodes.empty());
  auto attributes = string_attributes(nodes[0]);
  EXPECT_EQ(attributes["embed_mode"], "1");
  const std::string& payload = attributes["ep_cache_context"];
  EXPECT_NO_THROW(ContextBinary::from_memory(reinterpret_cast<const uint8_t*>(payload.data()), payload.size(), nullptr,
                                             "payload"));
  Ort::Session compiled = open_session(output, plugin_options());
  expect_matches_original(compiled, original);
}

TEST_F(GenerateTest, CompileApiFlagsBehaveAsOrtDocumentsThem) {
  const fs::path original = copy_model("cnn.onnx", dir_ / "in");
  const fs::path output = dir_ / "in" / "cnn_ctx.onnx";
  testing::write_file(output, "an earlier output");
  try {
    compile_with_ort(original, output, {}, OrtCompileApiFlags_ERROR_IF_OUTPUT_FILE_EXISTS);
    ADD_FAILURE() << "compiled over an existing output";
  } catch (const Ort::Exception& e) {
    EXPECT_NE(std::string(e.what()).find("exists"), std::string::npos) << e.what();
  }
  EXPECT_EQ(testing::read_file(output), "an earlier output");
  EXPECT_FALSE(fs::exists(dir_ / "in" / "cnn_ref.bin"));

  // A model with nothing the backend takes (every node a CPU island).
  const fs::path nothing = dir_ / "in" / "nothing.onnx";
  testing::write_file(nothing, testing::read_file(testing::generated_models() / "unsupported.onnx"));
  try {
    compile_with_ort(nothing, dir_ / "in" / "nothing_ctx.onnx", {}, OrtCompileApiFlags_ERROR_IF_NO_NODES_COMPILED);
    ADD_FAILURE() << "compiled a model in which nothing compiles";
  } catch (const Ort::Exception& e) {
    EXPECT_NE(std::string(e.what()).find("Unable to compile any nodes"), std::string::npos) << e.what();
  }
}

// The Compile API's sessions only compile (session.compile_only=1): the EP prepares nothing to run,
// so the binary it wrote is never mapped; a session that generates and may run maps it once.
TEST_F(GenerateTest, CompileOnlySessionsPrepareNothingToRun) {
  const fs::path original = copy_model("cnn.onnx", dir_ / "in");
  const uint64_t before = Plugin::stats().opened;
  compile_with_ort(original, dir_ / "in" / "cnn_ctx.onnx");
  EXPECT_TRUE(fs::exists(dir_ / "in" / "cnn_ref.bin"));
  EXPECT_EQ(Plugin::stats().opened, before);
  fs::remove(dir_ / "in" / "cnn_ctx.onnx");  // a generating session refuses to overwrite it
  {
    Ort::Session session = open_session(original, plugin_options({{"ep.context_enable", "1"}}));
    EXPECT_EQ(Plugin::stats().opened, before + 1);
  }
}

// ORT's weightless mode (ModelCompilationOptions_SetWeightlessEnabled): CtxgenRef keeps the
// initializers itself (EXTERNAL_ONLY, "EP-managed"): its binary refers to the model's external
// data, as `ctxgen compile --weightless` writes it.
TEST_F(GenerateTest, WeightlessCompilationRefersToTheModelsExternalData) {
  const fs::path original = copy_model("weightless.onnx", dir_ / "in");
  fs::create_directories(dir_ / "out");
  const auto compile_weightless = [&](bool embed) {
    Ort::SessionOptions options = plugin_options();
    Ort::ModelCompilationOptions compile(Plugin::env(), options);
    compile.SetInputModelPath(original.c_str());
    compile.SetOutputModelPath((dir_ / "out" / "weightless_ctx.onnx").c_str());
    compile.SetWeightlessEnabled(true);
    compile.SetEpContextEmbedMode(embed);
    Ort::ThrowOnError(Ort::CompileModel(Plugin::env(), compile));
  };
  try {
    compile_weightless(true);
    ADD_FAILURE() << "an embedded binary was made weightless";
  } catch (const Ort::Exception& e) {
    EXPECT_NE(std::string(e.what()).find("an embedded binary cannot refer to the model's external data"), std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(fs::exists(dir_ / "out" / "weightless_ctx.onnx"));
  compile_weightless(false);
  const auto binary = ContextBinary::open(dir_ / "out" / "weightless_ref.bin", [&] { return std::optional(dir_ / "in"); });
  ASSERT_EQ(binary->weight_files().size(), 1u);
  EXPECT_EQ(binary->weight_files()[0].kind, WeightFileKind::kSourceData);
  EXPECT_EQ(binary->weight_files()[0].path, "weightless.weights");
  EXPECT_EQ(binary->weight_files()[0].tensors.size(), 4u);
  EXPECT_LT(fs::file_size(dir_ / "out" / "weightless_ref.bin"), fs::file_size(dir_ / "in" / "weightless.weights") / 10);
  Ort::Session session = open_session(dir_ / "out" / "weightless_ctx.onnx",
                                      plugin_options({{"ep.context_source_model_path", original.string()}}));
  expect_matches_original(session, original);
  // A session sharing that binary with another is checked against its own source model.
  fs::create_directories(dir_ / "changed");
  fs::copy_file(original, dir_ / "changed" / "weightless.onnx");
  std::string data = testing::read_file(dir_ / "in" / "weightless.weights");
  data[10000] ^= 1;  // inside fc_w
  testing::write_file(dir_ / "changed" / "weightless.weights", data);
  const Config share = {{"ep.share_ep_contexts", "1"}, {"ep.context_source_model_path", original.string()}};
  Ort::Session first = open_session(dir_ / "out" / "weightless_ctx.onnx", plugin_options(share));
  Config changed = share;
  changed["ep.context_source_model_path"] = (dir_ / "changed" / "weightless.onnx").string();
  const auto second = session_failure(dir_ / "out" / "weightless_ctx.onnx", plugin_options(changed));
  ASSERT_TRUE(second);
  EXPECT_NE(second->message.find("tensor 'fc_w'"), std::string::npos) << second->message;
  // Compiled for the session alone (no EPContext model), a binary held in memory cannot refer to files.
  const auto jit = session_failure(original, plugin_options({{"ep.enable_weightless", "1"}}));
  ASSERT_TRUE(jit);
  EXPECT_NE(jit->message.find("only when it writes an EPContext model"), std::string::npos) << jit->message;
}

// The binary ORT's compile writes beside the model never replaces the model's own external data.
TEST_F(GenerateTest, OutputsNeverReplaceTheModelsWeights) {
  const fs::path original = copy_model("external.onnx", dir_.path());
  fs::rename(dir_ / "external.weights", dir_ / "external_ref.bin");  // named as the binary will be
  onnx::ModelProto proto;
  ASSERT_TRUE(proto.ParseFromString(testing::read_file(original)));
  for (auto& t : *proto.mutable_graph()->mutable_initializer())
    for (auto& kv : *t.mutable_external_data())
      if (kv.key() == "location") kv.set_value("external_ref.bin");
  testing::write_file(original, proto.SerializeAsString());
  const std::string before = testing::read_file(dir_ / "external_ref.bin");
  for (bool weightless : {false, true}) {
    Ort::SessionOptions options = plugin_options();
    Ort::ModelCompilationOptions compile(Plugin::env(), options);
    compile.SetInputModelPath(original.c_str());
    compile.SetOutputModelPath((dir_ / "external_ctx.onnx").c_str());
    compile.SetWeightlessEnabled(weightless);
    try {
      Ort::ThrowOnError(Ort::CompileModel(Plugin::env(), compile));
      ADD_FAILURE() << "the binary replaced the model's weights";
    } catch (const Ort::Exception& e) {
      EXPECT_NE(std::string(e.what()).find("which " + original.string() + " reads its weights from"), std::string::npos)
          << e.what();
    }
    EXPECT_EQ(testing::read_file(dir_ / "external_ref.bin"), before);
    EXPECT_FALSE(fs::exists(dir_ / "external_ctx.onnx"));
  }
}

TEST_F(GenerateTest, WhatCannotBeWrittenIsRefusedSayingWhy) {
  const fs::path original = copy_model("cnn.onnx", dir_ / "in");
  // Compiled from memory to memory, nothing says where the binary could go.
  const std::vector<char> bytes = read_bytes(original);
  Ort::SessionOptions options = plugin_options();
  Ort::ModelCompilationOptions compile(Plugin::env(), options);
  compile.SetInputModelFromBuffer(bytes.data(), bytes.size());
  Ort::AllocatorWithDefaultOptions allocator;
  void* output = nullptr;
  size_t output_size = 0;
  compile.SetOutputModelBuffer(allocator, &output, &output_size);
  try {
    Ort::ThrowOnError(Ort::CompileModel(Plugin::env(), compile));
    ADD_FAILURE() << "compiled from memory without a place for the binary";
  } catch (const Ort::Exception& e) {
    EXPECT_NE(std::string(e.what()).find("set ep.context_file_path to the path the compiled model will have"),
              std::string::npos)
        << e.what();
  }
  // Embedded, it needs no place.
  compile.SetEpContextEmbedMode(true);
  Ort::ThrowOnError(Ort::CompileModel(Plugin::env(), compile));
  ASSERT_NE(output, nullptr);
  EXPECT_GT(output_size, 0u);
  allocator.Free(output);

  // A shared group writes into one folder: its nodes name the binary by file name.
  const fs::path other = copy_model("share/fallback/cpu2.onnx", dir_ / "in");
  fs::create_directories(dir_ / "a");
  fs::create_directories(dir_ / "b");
  compile_with_ort(original, dir_ / "a" / "cnn_ctx.onnx", {{"ep.share_ep_contexts", "1"}});
  try {
    compile_with_ort(other, dir_ / "b" / "cpu2_ctx.onnx", {{"ep.share_ep_contexts", "1"}, {"ep.stop_share_ep_contexts", "1"}});
    ADD_FAILURE() << "a shared group wrote into two folders";
  } catch (const Ort::Exception& e) {
    EXPECT_NE(std::string(e.what()).find("must write their models into one folder"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(dir_ / "a" / "cnn_ref.bin"));

  // Embedded contexts belong to one model each.
  try {
    compile_with_ort(original, dir_ / "a" / "cnn_ctx2.onnx", {{"ep.share_ep_contexts", "1"}}, 0, true);
    ADD_FAILURE() << "a shared group embedded its contexts";
  } catch (const Ort::Exception& e) {
    EXPECT_NE(std::string(e.what()).find("cannot be combined with ep.share_ep_contexts=1"), std::string::npos)
        << e.what();
  }
  // The refusals left the group as it was: its last session writes its binary.
  compile_with_ort(other, dir_ / "a" / "cpu2_ctx.onnx", {{"ep.share_ep_contexts", "1"}, {"ep.stop_share_ep_contexts", "1"}});
  EXPECT_EQ(files_in(dir_ / "a"), (std::set<std::string>{"cnn_ctx.onnx", "cpu2_ctx.onnx", "cnn_ref.bin"}));
  Ort::Session first(Plugin::env(), (dir_ / "a" / "cnn_ctx.onnx").c_str(), plugin_options());
  expect_matches_original(first, original);
}

// The last session of a shared group ends it even when it compiles nothing.
TEST_F(GenerateTest, ALastSessionThatCompilesNothingStillWritesTheGroupsBinary) {
  const fs::path cnn = copy_model("cnn.onnx", dir_ / "in");
  const fs::path nothing = copy_model("unsupported.onnx", dir_ / "in");
  compile_with_ort(cnn, dir_ / "in" / "cnn_ctx.onnx", {{"ep.share_ep_contexts", "1"}});
  compile_with_ort(nothing, dir_ / "in" / "unsupported_ctx.onnx",
                   {{"ep.share_ep_contexts", "1"}, {"ep.stop_share_ep_contexts", "1"}});
  EXPECT_TRUE(fs::exists(dir_ / "in" / "cnn_ref.bin"));
  Ort::Session session(Plugin::env(), (dir_ / "in" / "cnn_ctx.onnx").c_str(), plugin_options());
  expect_matches_original(session, cnn);
}

// Cross-compiling: the library registered as virtual, the Compile API on the virtual device alone
// writes outputs that run on the real one.
TEST_F(GenerateTest, TheVirtualDeviceCompilesForTheRealOne) {
  const fs::path original = copy_model("cnn.onnx", dir_ / "in");
  Plugin::unregister_library();
  constexpr const char* kVirtualName = "ctxgen_ort_ep.virtual";
  Plugin::env().RegisterExecutionProviderLibrary(kVirtualName, CTXGEN_ORT_EP_PATH);
  {
    std::vector<Ort::ConstEpDevice> virtual_devices;
    for (const Ort::ConstEpDevice& device : Plugin::env().GetEpDevices()) {
      if (std::string(device.EpName()) == "CtxgenRef" && is_virtual(device)) virtual_devices.push_back(device);
    }
    ASSERT_EQ(virtual_devices.size(), 1u);
    Ort::SessionOptions options;
    options.AppendExecutionProvider_V2(Plugin::env(), virtual_devices, std::unordered_map<std::string, std::string>{});
    Ort::ModelCompilationOptions compile(Plugin::env(), options);
    compile.SetInputModelPath(original.c_str());
    const fs::path output = dir_ / "in" / "cnn_ctx.onnx";
    compile.SetOutputModelPath(output.c_str());
    Ort::ThrowOnError(Ort::CompileModel(Plugin::env(), compile));
  }
  Plugin::env().UnregisterExecutionProviderLibrary(kVirtualName);
  Plugin::register_library();
  Ort::Session compiled = open_session(dir_ / "in" / "cnn_ctx.onnx", plugin_options());
  expect_matches_original(compiled, original);
}

// Shared compile sessions: the group's models compiled one session each, the last with
// ep.stop_share_ep_contexts=1, give one binary named after the first model, and it is the binary
// `ctxgen share` writes for the same models: the same graphs, programs and weight table.
TEST_F(GenerateTest, SharedCompileSessionsWriteTheBinaryCtxgenShareWrites) {
  const fs::path first = copy_model("share/fallback/cpu1.onnx", dir_ / "in");
  const fs::path second = copy_model("share/fallback/cpu2.onnx", dir_ / "in");
  fs::create_directories(dir_ / "ort");
  compile_with_ort(first, dir_ / "ort" / "cpu1_ctx.onnx", {{"ep.share_ep_contexts", "1"}});
  EXPECT_FALSE(fs::exists(dir_ / "ort" / "cpu1_ref.bin")) << "written before the group's last session";
  compile_with_ort(second, dir_ / "ort" / "cpu2_ctx.onnx",
                   {{"ep.share_ep_contexts", "1"}, {"ep.stop_share_ep_contexts", "1"}});
  EXPECT_EQ(files_in(dir_ / "ort"), (std::set<std::string>{"cpu1_ctx.onnx", "cpu2_ctx.onnx", "cpu1_ref.bin"}));
  for (const char* model : {"cpu1_ctx.onnx", "cpu2_ctx.onnx"}) {
    const auto nodes = ep_context_nodes(read_model(dir_ / "ort" / model));
    ASSERT_EQ(nodes.size(), 2u) << model;  // a CPU node cuts each model in two
    EXPECT_EQ(string_attributes(nodes[0])["ep_cache_context"], "cpu1_ref.bin") << model;
  }

  const testing::CommandResult cli = testing::run_command(std::string(CTXGEN_BINARY) + " share " + quote(first) + "," +
                                                          quote(second) + " --output-dir " + quote(dir_ / "cli"));
  ASSERT_EQ(cli.exit_code, 0) << cli.output;
  const auto ours = ContextBinary::open(dir_ / "ort" / "cpu1_ref.bin");
  const auto theirs = ContextBinary::open(dir_ / "cli" / "cpu1_ref.bin");
  ASSERT_EQ(ours->graphs().size(), theirs->graphs().size());
  for (size_t g = 0; g < ours->graphs().size(); ++g) {
    const GraphRecord& a = ours->graphs()[g];
    const GraphRecord& b = theirs->graphs()[g];
    EXPECT_EQ(a.name, b.name);
    EXPECT_EQ(a.inputs, b.inputs) << a.name;
    EXPECT_EQ(a.outputs, b.outputs) << a.name;
    EXPECT_EQ(a.weight_ids, b.weight_ids) << a.name;
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(a.program), a.program_size),
              std::string(reinterpret_cast<const char*>(b.program), b.program_size))
        << a.name;
  }
  ASSERT_EQ(ours->weights().size(), theirs->weights().size());
  for (size_t w = 0; w < ours->weights().size(); ++w) {
    EXPECT_EQ(ours->weights()[w].hash, theirs->weights()[w].hash) << "weight " << w;
    EXPECT_EQ(ours->weights()[w].size, theirs->weights()[w].size) << "weight " << w;
  }
  EXPECT_EQ(ours->content_id(), theirs->content_id());

  Ort::SessionOptions shared = plugin_options({{"ep.share_ep_contexts", "1"}});
  Ort::Session a = open_session(dir_ / "ort" / "cpu1_ctx.onnx", shared);
  Ort::Session b = open_session(dir_ / "ort" / "cpu2_ctx.onnx", shared);
  expect_matches_original(a, first);
  expect_matches_original(b, second);
}

}  // namespace
}  // namespace ctxgen::ort_test

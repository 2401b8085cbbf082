// `ctxgen compile` and `ctxgen inspect` on generated models, run as a user would.

#include <nlohmann/json.hpp>

#include "e2e.h"

namespace ctxgen::testing {
namespace {

TEST(Compile, WritesContextModelAndBinaryNextToTheInput) {
  TempDir dir;
  fs::path model = copy_model("cnn.onnx", dir.path());
  auto r = ctxgen("compile " + quote(model) + " -e ref");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(files_in(dir.path()), (std::set<std::string>{"cnn.onnx", "cnn_ctx.onnx", "cnn_ref.bin"}));
  EXPECT_NE(r.output.find("10 of 10 nodes on ref in 1 partition(s), 0 on CPU"), std::string::npos) << r.output;

  onnx::ModelProto ctx = load_proto(dir / "cnn_ctx.onnx");
  EXPECT_NO_THROW(onnx::checker::check_model(ctx));
  EXPECT_EQ(ctx.producer_name(), "ctxgen");
  auto nodes = epcontext_nodes(ctx);
  ASSERT_EQ(nodes.size(), 1u);
  const auto& node = *nodes[0];
  EXPECT_EQ(node.domain(), "com.microsoft");
  EXPECT_EQ(node.name(), "cnn_ref_0");
  EXPECT_EQ(attribute(node, "main_context")->i(), 1);
  EXPECT_EQ(attribute(node, "embed_mode")->i(), 0);
  EXPECT_EQ(attribute(node, "ep_cache_context")->s(), "cnn_ref.bin");
  EXPECT_EQ(attribute(node, "source")->s(), "CtxgenRef");
  EXPECT_EQ(attribute(node, "partition_name")->s(), "cnn_ref_0");
  EXPECT_EQ(attribute(node, "onnx_model_filename")->s(), "cnn.onnx");
  EXPECT_NE(attribute(node, "ep_sdk_version"), nullptr);
  EXPECT_NE(attribute(node, "hardware_architecture"), nullptr);
  EXPECT_EQ(ctx.graph().initializer_size(), 0) << "weights of compiled nodes belong in the .bin";
  bool ms = false;
  for (const auto& o : ctx.opset_import()) ms = ms || (o.domain() == "com.microsoft" && o.version() == 1);
  EXPECT_TRUE(ms);
  ASSERT_EQ(ctx.graph().input_size(), 1);
  EXPECT_EQ(ctx.graph().input(0).name(), "x");
  EXPECT_EQ(ctx.graph().output(0).name(), "y");
}

TEST(Compile, SeveralPartitionsWithCpuIslands) {
  TempDir dir;
  fs::path model = copy_model("islands.onnx", dir.path());
  auto r = ctxgen("compile " + quote(model));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  onnx::ModelProto ctx = load_proto(dir / "islands_ctx.onnx");
  EXPECT_NO_THROW(onnx::checker::check_model(ctx));
  auto nodes = epcontext_nodes(ctx);
  ASSERT_EQ(nodes.size(), 3u);
  EXPECT_EQ(attribute(*nodes[0], "main_context")->i(), 1);
  for (size_t i = 1; i < nodes.size(); ++i) {
    EXPECT_EQ(attribute(*nodes[i], "main_context")->i(), 0);
    EXPECT_EQ(attribute(*nodes[i], "ep_cache_context"), nullptr);
    EXPECT_EQ(attribute(*nodes[i], "partition_name")->s(), nodes[i]->name());
  }
  std::vector<std::string> ops;
  for (const auto& n : ctx.graph().node()) ops.push_back(n.op_type());
  EXPECT_EQ(ops, (std::vector<std::string>{"EPContext", "Floor", "EPContext", "Round", "EPContext"}));
  // Outputs keep their order, including one produced by a CPU node.
  ASSERT_EQ(ctx.graph().output_size(), 2);
  EXPECT_EQ(ctx.graph().output(0).name(), "y");
  EXPECT_EQ(ctx.graph().output(1).name(), "f1");
}

TEST(Compile, ConstantNodeWeightsGoIntoTheBinary) {
  TempDir dir;
  auto r = ctxgen("compile " + quote(copy_model("constants.onnx", dir.path())));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  onnx::ModelProto ctx = load_proto(dir / "constants_ctx.onnx");
  EXPECT_EQ(ctx.graph().node_size(), 1);
  EXPECT_EQ(ctx.graph().initializer_size(), 0);
  auto inspected = nlohmann::json::parse(ctxgen("inspect --json " + quote(dir / "constants_ref.bin")).output);
  EXPECT_EQ(inspected["weights"]["count"], 2);
  EXPECT_EQ(inspected["weights"]["bytes"], 16 * 4 + 4 * 4);
}

TEST(Compile, ControlFlowStaysOnCpuWithItsSubgraphWeights) {
  TempDir dir;
  auto r = ctxgen("compile " + quote(copy_model("subgraph.onnx", dir.path())) + " -v");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  onnx::ModelProto ctx = load_proto(dir / "subgraph_ctx.onnx");
  EXPECT_NO_THROW(onnx::checker::check_model(ctx));
  const onnx::NodeProto* if_node = nullptr;
  for (const auto& n : ctx.graph().node())
    if (n.op_type() == "If") if_node = &n;
  ASSERT_NE(if_node, nullptr);
  for (const auto& a : if_node->attribute()) {
    ASSERT_EQ(a.g().initializer_size(), 2) << a.name();  // its own weight and its hoisted Constant
    for (const auto& t : a.g().initializer()) EXPECT_EQ(t.raw_data().size(), 64u) << t.name();
  }
  EXPECT_NE(r.output.find("node 'if' (If) -> CPU"), std::string::npos) << r.output;
}

TEST(Compile, OutputDoesNotDependOnTheSourceExternalData) {
  TempDir dir;
  auto r = ctxgen("compile " + quote(copy_model("external.onnx", dir.path())));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  fs::remove(dir / "external.weights");
  fs::remove(dir / "external.onnx");
  onnx::ModelProto ctx = load_proto(dir / "external_ctx.onnx");
  EXPECT_NO_THROW(onnx::checker::check_model(ctx));
  ASSERT_EQ(ctx.graph().initializer_size(), 1);  // `scale` feeds a CPU node
  EXPECT_EQ(ctx.graph().initializer(0).name(), "scale");
  EXPECT_EQ(ctx.graph().initializer(0).data_location(), onnx::TensorProto::DEFAULT);
  EXPECT_EQ(ctx.graph().initializer(0).raw_data().size(), 16u * 4);
}

TEST(Compile, ExternalInitializersFile) {
  TempDir dir;
  auto r = ctxgen("compile " + quote(copy_model("external.onnx", dir.path())) +
                  " --external-initializers-file cpu_weights.bin --output-dir " + quote(dir / "out"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(files_in(dir / "out"), (std::set<std::string>{"external_ctx.onnx", "external_ref.bin", "cpu_weights.bin"}));
  onnx::ModelProto ctx = load_proto(dir / "out" / "external_ctx.onnx");
  const auto& t = ctx.graph().initializer(0);
  EXPECT_EQ(t.data_location(), onnx::TensorProto::EXTERNAL);
  std::map<std::string, std::string> kv;
  for (const auto& e : t.external_data()) kv[e.key()] = e.value();
  EXPECT_EQ(kv["location"], "cpu_weights.bin");
  EXPECT_EQ(kv["length"], "64");
  EXPECT_EQ(fs::file_size(dir / "out" / "cpu_weights.bin"), 64u);
}

TEST(Compile, DynamicShapesFallBackUntilFixed) {
  TempDir dir;
  fs::path model = copy_model("dynamic.onnx", dir.path());
  auto r = ctxgen("compile " + quote(model));
  EXPECT_EQ(r.exit_code, 4) << r.output;
  EXPECT_NE(r.output.find("nothing to compile"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("dynamic shape"), std::string::npos) << r.output;
  EXPECT_EQ(files_in(dir.path()), (std::set<std::string>{"dynamic.onnx"}));

  r = ctxgen("compile " + quote(model) + " --fix-dim batch=2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  onnx::ModelProto ctx = load_proto(dir / "dynamic_ctx.onnx");
  EXPECT_EQ(epcontext_nodes(ctx).size(), 1u);
  EXPECT_EQ(ctx.graph().input(0).type().tensor_type().shape().dim(0).dim_value(), 2);

  r = ctxgen("compile " + quote(model) + " --input-shape x=3x8 -o " + quote(dir / "three.onnx"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(fs::exists(dir / "three.onnx"));
  EXPECT_TRUE(fs::exists(dir / "three_ref.bin"));
}

TEST(Compile, AllowEmptyWritesAModelWithNothingCompiled) {
  TempDir dir;
  fs::path model = copy_model("unsupported.onnx", dir.path());
  auto r = ctxgen("compile " + quote(model) + " --allow-empty");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(files_in(dir.path()), (std::set<std::string>{"unsupported.onnx", "unsupported_ctx.onnx"}));
  const onnx::ModelProto ctx = load_proto(dir / "unsupported_ctx.onnx");
  EXPECT_TRUE(epcontext_nodes(ctx).empty());
  // It does not need the EP, so ONNX Runtime is not asked whether the EP can run it.
  for (const auto& kv : ctx.metadata_props()) EXPECT_NE(kv.key(), "ep_compatibility_info.CtxgenRef");
}

// An exported tied embedding stores the table and its transpose; the MatMul's weight packed to
// [N, K] is the table's bytes again, so the binary holds them once.
TEST(Compile, ATiedEmbeddingIsStoredOnce) {
  TempDir dir;
  auto r = ctxgen("compile " + quote(copy_model("tied.onnx", dir.path())) + " --report " + quote(dir / "r.json"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto report = nlohmann::json::parse(read_file(dir / "r.json"));
  const auto& w = report["context_binary_weights"];
  EXPECT_EQ(w["tensors"], 2);
  EXPECT_EQ(w["unique_tensors"], 1);
  EXPECT_EQ(w["unique_bytes"], 32 * 16 * 4);
  auto bin = nlohmann::json::parse(ctxgen("inspect --json " + quote(dir / "tied_ref.bin")).output);
  EXPECT_EQ(bin["weights"]["count"], 1);
  EXPECT_EQ(bin["weights"]["bytes"], 32 * 16 * 4);
}

TEST(Compile, DotsInFolderAndFileNames) {
  TempDir dir;
  fs::path model = copy_model("dir.v1/model.v2.onnx", dir / "dir.v1");
  auto r = ctxgen("compile " + quote(model));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(files_in(dir / "dir.v1"), (std::set<std::string>{"model.v2.onnx", "model.v2_ctx.onnx", "model.v2_ref.bin"}));
}

TEST(Compile, NodeNamePrefixNamesNodesPartitionsAndGraphs) {
  TempDir dir;
  auto r = ctxgen("compile " + quote(copy_model("islands.onnx", dir.path())) + " --node-name-prefix app1_");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  onnx::ModelProto ctx = load_proto(dir / "islands_ctx.onnx");
  for (const auto* n : epcontext_nodes(ctx)) {
    EXPECT_EQ(n->name().rfind("app1_", 0), 0u) << n->name();
    EXPECT_EQ(attribute(*n, "partition_name")->s(), n->name());
  }
  auto bin = nlohmann::json::parse(ctxgen("inspect --json " + quote(dir / "islands_ref.bin")).output);
  for (const auto& g : bin["graphs"]) EXPECT_EQ(g["name"].get<std::string>().rfind("app1_", 0), 0u);
}

TEST(Compile, EmbedModePutsTheBinaryInTheModel) {
  TempDir dir;
  auto r = ctxgen("compile " + quote(copy_model("islands.onnx", dir.path())) + " --embed");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(files_in(dir.path()), (std::set<std::string>{"islands.onnx", "islands_ctx.onnx"}));
  onnx::ModelProto ctx = load_proto(dir / "islands_ctx.onnx");
  auto nodes = epcontext_nodes(ctx);
  ASSERT_EQ(nodes.size(), 3u);
  EXPECT_EQ(attribute(*nodes[0], "embed_mode")->i(), 1);
  EXPECT_GT(attribute(*nodes[0], "ep_cache_context")->s().size(), 100u);
  EXPECT_EQ(attribute(*nodes[2], "embed_mode")->i(), 1);
}

TEST(Compile, ExistingOutputsNeedForce) {
  TempDir dir;
  fs::path model = copy_model("cnn.onnx", dir.path());
  ASSERT_EQ(ctxgen("compile " + quote(model)).exit_code, 0);
  std::string before = read_file(dir / "cnn_ref.bin");
  write_file(dir / "cnn_ref.bin", "stale");
  auto r = ctxgen("compile " + quote(model));
  EXPECT_EQ(r.exit_code, 5) << r.output;
  EXPECT_NE(r.output.find("cnn_ctx.onnx: output exists already"), std::string::npos) << r.output;
  EXPECT_EQ(read_file(dir / "cnn_ref.bin"), "stale");
  r = ctxgen("compile " + quote(model) + " --force");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(read_file(dir / "cnn_ref.bin"), before);
}

TEST(Compile, SameInputsGiveByteIdenticalOutputs) {
  TempDir dir;
  for (const char* model : {"cnn.onnx", "islands.onnx", "external.onnx", "subgraph.onnx"}) {
    fs::path in = copy_model(model, dir / "in");
    ASSERT_EQ(ctxgen("compile " + quote(in) + " --output-dir " + quote(dir / "a")).exit_code, 0);
    ASSERT_EQ(ctxgen("compile " + quote(in) + " --output-dir " + quote(dir / "b")).exit_code, 0);
  }
  ASSERT_EQ(files_in(dir / "a"), files_in(dir / "b"));
  for (const auto& name : files_in(dir / "a")) EXPECT_EQ(read_file(dir / "a" / name), read_file(dir / "b" / name)) << name;
}

TEST(Inspect, ShowsPartitionsAttributesAndFallbackReasons) {
  TempDir dir;
  ASSERT_EQ(ctxgen("compile " + quote(copy_model("islands.onnx", dir.path()))).exit_code, 0);
  auto r = ctxgen("inspect " + quote(dir / "islands_ctx.onnx"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("EPContext islands_ref_0"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("floor1 (Floor): "), std::string::npos) << r.output;
  auto j = nlohmann::json::parse(ctxgen("inspect --json " + quote(dir / "islands_ctx.onnx")).output);
  EXPECT_EQ(j["epcontext_nodes"].size(), 3u);
  EXPECT_EQ(j["cpu_nodes"].size(), 2u);
  auto bin = nlohmann::json::parse(ctxgen("inspect --json " + quote(dir / "islands_ref.bin")).output);
  EXPECT_EQ(bin["graphs"].size(), 3u);
  EXPECT_EQ(bin["backend"], "CtxgenRef");
  EXPECT_EQ(bin["weights"]["count"], 3);
}

TEST(Cli, ListsBackends) {
  auto r = ctxgen("--list-backends");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.rfind("ref\tCtxgenRef", 0), 0u) << r.output;
}

}  // namespace
}  // namespace ctxgen::testing

namespace ctxgen::testing {
namespace {

// A run killed mid-write (kill -9) leaves hidden temporaries; the next run into the folder, which
// holds the folder's lock, knows nobody else owns them and removes them. Other hidden files stay.
TEST(Compile, LeftoverTemporariesOfKilledRunsAreRemoved) {
  TempDir dir;
  fs::path model = copy_model("cnn.onnx", dir / "m");
  fs::create_directories(dir / "out");
  write_file(dir / "out" / ".cnn_ctx.onnx.ctxgen-4242.tmp", "half written");
  write_file(dir / "out" / ".cnn_ref.bin.ctxgen-77.tmp", "half written");
  write_file(dir / "out" / ".keep", "the user's");
  auto r = ctxgen("compile " + quote(model) + " --output-dir " + quote(dir / "out"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(files_in(dir / "out"), (std::set<std::string>{".keep", "cnn_ctx.onnx", "cnn_ref.bin"}));
}

// Names that are not UTF-8 (a file name, a prefix) are carried through; the JSON written about
// them (report, metadata, inspect) shows U+FFFD instead of failing the run.
TEST(Compile, NamesThatAreNotUtf8AreCarried) {
  TempDir dir;
  fs::path model = dir / "m\xff.onnx";
  fs::copy_file(copy_model("islands.onnx", dir.path()), model);
  auto r = ctxgen("compile " + quote(model) + " --node-name-prefix '\xfe' --report " + quote(dir / "r.json"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(fs::exists(dir / "m\xff_ctx.onnx"));
  auto report = nlohmann::json::parse(read_file(dir / "r.json"), nullptr, false);
  ASSERT_FALSE(report.is_discarded()) << "the report is valid JSON";
  r = ctxgen("inspect " + quote(dir / "m\xff_ctx.onnx") + " --json");
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

}  // namespace
}  // namespace ctxgen::testing

// `ctxgen share`: N models, one context binary, every identical weight stored once.

#include <nlohmann/json.hpp>

#include "ctxgen/format.h"
#include "e2e.h"

namespace ctxgen::testing {
namespace {

// Unique weight bytes of one testdata MLP (two blocks of W1 16x32, b 32, W2 32x16, float32).
constexpr uint64_t kBlockBytes = (16 * 32 + 32 + 32 * 16) * 4;
constexpr uint64_t kModelBytes = 2 * kBlockBytes;

fs::path group(const std::string& name) { return generated_models() / "share" / name; }

nlohmann::json share(const std::string& inputs, const fs::path& out, const std::string& extra = "") {
  fs::path report = out / "report.json";
  fs::create_directories(out);
  auto r = ctxgen("share " + inputs + " --output-dir " + quote(out) + " --report " + quote(report) + " " + extra);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  auto j = nlohmann::json::parse(read_file(report), nullptr, false);
  fs::remove(report);
  return j;
}

uint64_t align64(uint64_t n) { return (n + 63) / 64 * 64; }

// The .bin size docs/context-binary-format.md §8 gives for what the binary holds.
uint64_t documented_size(const ContextBinary& b) {
  const auto& id = b.identity();
  uint64_t meta = 108 + 12 + id.backend.size() + id.sdk_version.size() + id.hardware_architecture.size();
  for (const auto& g : b.graphs()) {
    meta += 44 + g.name.size() + 4 * g.weight_ids.size();
    for (const auto* list : {&g.inputs, &g.outputs})
      for (const auto& io : *list) meta += 12 + io.name.size() + 8 * io.dims.size();
    for (const auto& f : g.fixed_inputs) meta += 16 + f.io.name.size() + 8 * f.io.dims.size() + f.value.size();
  }
  meta += 36 * b.weights().size();
  for (const auto& f : b.weight_files()) meta += 20 + f.path.size();
  uint64_t cursor = meta;
  for (const auto& g : b.graphs()) cursor = align64(cursor) + g.program_size;
  for (const auto& w : b.weights())
    if (w.file == 0) cursor = align64(cursor) + w.size;
  return cursor;
}

// Weight bytes in the binary; also checks the file is exactly those bytes plus the documented
// overhead.
uint64_t payload_bytes(const fs::path& bin) {
  auto binary = ContextBinary::open(bin);
  uint64_t total = 0;
  for (const auto& w : binary->weights()) total += w.size;
  EXPECT_EQ(fs::file_size(bin), documented_size(*binary)) << bin;
  return total;
}

void expect_points_at(const fs::path& ctx, const std::string& bin_name) {
  onnx::ModelProto proto = load_proto(ctx);
  auto nodes = epcontext_nodes(proto);
  ASSERT_FALSE(nodes.empty()) << ctx;
  EXPECT_EQ(attribute(*nodes[0], "ep_cache_context")->s(), bin_name) << ctx;
}

TEST(Share, FullSharingUnderDifferentNamesAndShapes) {
  TempDir out;
  auto report = share(quote(group("full/prefill.onnx")) + "," + quote(group("full/decode.onnx")), out.path());
  EXPECT_EQ(files_in(out.path()), (std::set<std::string>{"prefill_ctx.onnx", "decode_ctx.onnx", "prefill_ref.bin"}));
  expect_points_at(out / "prefill_ctx.onnx", "prefill_ref.bin");
  expect_points_at(out / "decode_ctx.onnx", "prefill_ref.bin");
  EXPECT_EQ(payload_bytes(out / "prefill_ref.bin"), kModelBytes);
  const auto& w = report["context_binary_weights"];
  EXPECT_EQ(w["tensors"], 12);
  EXPECT_EQ(w["unique_tensors"], 6);
  EXPECT_EQ(w["unique_bytes"], kModelBytes);
  EXPECT_EQ(report["models"][1]["weights"]["new_bytes"], 0);
  EXPECT_EQ(report["models"][1]["weights"]["bytes_shared_with_earlier_models"], kModelBytes);
  // Graph names are unique across the models.
  auto binary = ContextBinary::open(out / "prefill_ref.bin");
  ASSERT_EQ(binary->graphs().size(), 2u);
  EXPECT_EQ(binary->graphs()[0].name, "prefill_ref_0");
  EXPECT_EQ(binary->graphs()[1].name, "decode_ref_0");
  // The MatMul weights are stored packed, hashed only as they were written: the weight table
  // holds their hashes, and the report the hash of the file as it ended up.
  EXPECT_NO_THROW(binary->verify_payloads());
  for (const auto& f : report["outputs"]) {
    const std::string bytes = read_file(f["path"].get<std::string>());
    EXPECT_EQ(f["xxh3_128"], xxh3_128(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()).hex()) << f["path"];
  }
}

TEST(Share, PartialSharingStoresOnlyWhatChanged) {
  TempDir out;
  share(quote(group("partial/base.onnx")) + " " + quote(group("partial/tuned.onnx")), out.path());
  EXPECT_EQ(payload_bytes(out / "base_ref.bin"), kModelBytes + 32 * 16 * 4);
}

TEST(Share, NoSharing) {
  TempDir out;
  share(quote(group("none/a.onnx")) + "," + quote(group("none/b.onnx")), out.path());
  EXPECT_EQ(payload_bytes(out / "a_ref.bin"), 2 * kModelBytes);
}

TEST(Share, InitializersConstantNodesAndExternalDataShareAcrossThreeModels) {
  TempDir out;
  auto report = share(quote(group("kinds/init.onnx")) + "," + quote(group("kinds/const.onnx")) + "," +
                          quote(group("kinds/ext.onnx")),
                      out.path());
  EXPECT_EQ(files_in(out.path()),
            (std::set<std::string>{"init_ctx.onnx", "const_ctx.onnx", "ext_ctx.onnx", "init_ref.bin"}));
  EXPECT_EQ(payload_bytes(out / "init_ref.bin"), kModelBytes);
  EXPECT_EQ(report["context_binary_weights"]["tensors"], 18);
  EXPECT_EQ(report["context_binary_weights"]["unique_tensors"], 6);
}

TEST(Share, FallbackInitializersShareOneExternalFile) {
  TempDir out;
  auto report = share(quote(group("fallback/cpu1.onnx")) + "," + quote(group("fallback/cpu2.onnx")), out.path(),
                      "--external-initializers-file shared_cpu.bin");
  EXPECT_EQ(files_in(out.path()),
            (std::set<std::string>{"cpu1_ctx.onnx", "cpu2_ctx.onnx", "cpu1_ref.bin", "shared_cpu.bin"}));
  EXPECT_EQ(fs::file_size(out / "shared_cpu.bin"), 16u * 4);  // `scale`, once, under two names
  for (const char* ctx : {"cpu1_ctx.onnx", "cpu2_ctx.onnx"}) {
    onnx::ModelProto proto = load_proto(out / ctx);
    ASSERT_EQ(proto.graph().initializer_size(), 1) << ctx;
    std::map<std::string, std::string> kv;
    for (const auto& e : proto.graph().initializer(0).external_data()) kv[e.key()] = e.value();
    EXPECT_EQ(kv["location"], "shared_cpu.bin");
    EXPECT_EQ(kv["offset"], "0");
  }
  EXPECT_EQ(report["external_initializer_weights"]["unique_tensors"], 1);
  EXPECT_EQ(report["external_initializer_weights"]["tensors"], 2);
}

TEST(Share, ReportDescribesModelsOutputsAndTimings) {
  TempDir out;
  auto report = share(quote(group("fallback/cpu1.onnx")) + "," + quote(group("fallback/cpu2.onnx")), out.path());
  ASSERT_EQ(report["models"].size(), 2u);
  const auto& m = report["models"][0];
  EXPECT_EQ(m["nodes_on_cpu"], 2);
  EXPECT_EQ(m["cpu_nodes_by_op"]["Floor"], 1);
  EXPECT_EQ(m["cpu_nodes_by_op"]["Mod"], 1);
  EXPECT_EQ(m["partitions"].size(), 2u);
  ASSERT_EQ(report["outputs"].size(), 3u);
  for (const auto& f : report["outputs"]) {
    EXPECT_EQ(f["size"].get<uint64_t>(), fs::file_size(f["path"].get<std::string>()));
    EXPECT_EQ(f["xxh3_128"].get<std::string>().size(), 32u);
  }
  ASSERT_EQ(report["timings"].size(), 4u * 2 + 3) << "4 stages per model, then binary, models built, models written";
  EXPECT_EQ(report["timings"][4]["stage"], "load");
  EXPECT_NE(report["timings"][4]["model"], report["timings"][0]["model"]);
  EXPECT_EQ(report["timings"][8]["stage"], "write_context_binary");
}

TEST(Share, PathsWithSpacesAndSeparateArguments) {
  TempDir dir;
  fs::path a = dir / "my models" / "first model.onnx";
  fs::path b = dir / "my models" / "second,model.onnx";
  fs::create_directories(a.parent_path());
  fs::copy_file(group("full/prefill.onnx"), a);
  fs::copy_file(group("full/decode.onnx"), b);
  auto r = ctxgen("share " + quote(a) + " " + quote(b));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(fs::exists(dir / "my models" / "first model_ctx.onnx"));
  EXPECT_TRUE(fs::exists(dir / "my models" / "second,model_ctx.onnx"));
  EXPECT_TRUE(fs::exists(dir / "my models" / "first model_ref.bin"));
}

TEST(Share, RefusesEmbedSameStemsAndOutputFile) {
  TempDir out;
  std::string two = quote(group("full/prefill.onnx")) + "," + quote(group("full/decode.onnx"));
  auto r = ctxgen("share " + two + " --embed --output-dir " + quote(out.path()));
  EXPECT_EQ(r.exit_code, 2) << r.output;  // --embed is not a share option at all
  r = ctxgen("share " + quote(group("full/prefill.onnx")) + "," + quote(generated_models() / "share/fallback/../full/prefill.onnx") +
             " --output-dir " + quote(out.path()));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("two outputs would both be written"), std::string::npos) << r.output;
  EXPECT_TRUE(files_in(out.path()).empty());
}

}  // namespace
}  // namespace ctxgen::testing

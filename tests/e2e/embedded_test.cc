// Embedded weights read as views of the model file write the same bytes as protobuf's copies did:
// every output file of compile and share, in every output form, compared byte for byte.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "ctxgen/backend.h"
#include "ctxgen/pipeline.h"
#include "e2e.h"

namespace ctxgen::testing {
namespace {

// Runs `inputs` twice, copying and viewing, into two folders; every file must be the same.
void expect_same_outputs(const std::vector<fs::path>& inputs, CompileOptions options, const std::string& what) {
  SCOPED_TRACE(what);
  TempDir dir;
  std::map<bool, std::map<std::string, std::string>> written;
  for (bool views : {false, true}) {
    options.output_dir = dir.path() / (views ? "views" : "copies");
    options.per_model.assign(inputs.size(), LoadOptions{});
    for (auto& load : options.per_model) load.embedded_views = views;
    compile_models(inputs, options, builtin_backends());
    for (const auto& e : fs::directory_iterator(options.output_dir)) written[views][e.path().filename()] = read_file(e.path());
  }
  ASSERT_FALSE(written[true].empty());
  ASSERT_EQ(written[false].size(), written[true].size());
  for (const auto& [name, bytes] : written[false]) {
    ASSERT_TRUE(written[true].count(name)) << name;
    EXPECT_TRUE(written[true][name] == bytes) << name << " differs";
  }
}

TEST(EmbeddedViews, WriteWhatCopiesWrote) {
  TempDir llm;
  auto gen = run_command(std::string(CTXGEN_PYTHON) + " " + CTXGEN_SOURCE_DIR "/scripts/gen_llm_pair.py " +
                         quote(llm.path()) + " --size-mb 3 --hidden 128 --embedded --models 3");
  ASSERT_EQ(gen.exit_code, 0) << gen.output;
  const std::vector<fs::path> trio = {llm.path() / "prefill.onnx", llm.path() / "decode.onnx", llm.path() / "seq64.onnx"};
  const fs::path exports = fs::path(CTXGEN_SOURCE_DIR) / "testdata" / "exports";
  const std::vector<fs::path> decoder = {exports / "decoder_prefill.onnx", exports / "decoder_decode.onnx"};

  CompileOptions plain;
  expect_same_outputs(trio, plain, "share of the embedded LLM trio");
  expect_same_outputs(decoder, plain, "share of the exported decoder pair");
  expect_same_outputs({exports / "cnn_upsample.onnx"}, plain, "compile of the exported CNN");

  CompileOptions embed = plain;
  embed.embed = true;
  expect_same_outputs({decoder[0]}, embed, "--embed");

  CompileOptions external = plain;
  external.external_initializers_file = "weights.data";
  expect_same_outputs(decoder, external, "--external-initializers-file");

  CompileOptions stop = plain;
  stop.stop_after = Phase::kPartition;  // the whole model written back, every weight with it
  expect_same_outputs({trio[0]}, stop, "--stop-after partition");
}

// A weight folded at compile time (Neg of a constant) whose bytes sit at an odd offset of the file:
// the kernels get it aligned (the sanitizer build checks), and the outputs are protobuf's.
TEST(EmbeddedViews, FoldAWeightAtAnOddOffset) {
  constexpr int n = 1024;
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(17);
  auto* g = m.mutable_graph();
  g->set_name("odd");
  for (auto* v : {g->add_input(), g->add_output()}) {
    v->set_name(v == &g->input(0) ? "x" : "y");
    v->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::FLOAT);
    v->mutable_type()->mutable_tensor_type()->mutable_shape()->add_dim()->set_dim_value(n);
  }
  auto* w = g->add_initializer();
  w->set_name("w");
  w->set_data_type(onnx::TensorProto::FLOAT);
  w->add_dims(n);
  std::vector<float> values(n, 0.5f);
  w->set_raw_data(values.data(), values.size() * sizeof(float));
  auto* neg = g->add_node();
  neg->set_op_type("Neg");
  neg->add_input("w");
  neg->add_output("nw");
  auto* add = g->add_node();
  add->set_op_type("Add");
  add->add_input("x");
  add->add_input("nw");
  add->add_output("y");
  std::string bytes;
  for (std::string producer;; producer += "x") {  // lengthen the header until the weight is misaligned
    m.set_producer_name(producer);
    bytes = m.SerializeAsString();
    const size_t at = bytes.find(w->raw_data());
    if (at % 4 != 0) break;
  }
  TempDir dir;
  write_file(dir.path() / "odd.onnx", bytes);
  expect_same_outputs({dir.path() / "odd.onnx"}, CompileOptions{}, "a folded weight at an odd offset");

  // inspect counts a viewed weight as embedded, not as external data.
  auto r = ctxgen("inspect --json " + quote(dir.path() / "odd.onnx"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto initializers = nlohmann::json::parse(r.output)["initializers"];
  EXPECT_EQ(initializers["embedded_bytes"], 4096) << r.output;
  EXPECT_EQ(initializers["external"], false) << r.output;
}

}  // namespace
}  // namespace ctxgen::testing

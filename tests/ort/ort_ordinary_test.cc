// A session on an ordinary model (not compiled by the CLI) with CtxgenRef appended: the EP claims
// what the ref backend supports, as `ctxgen compile` would partition it, compiles it inside the
// session, and the outputs match ORT's CPU EP on the same model.

#include <gtest/gtest.h>

#include <map>
#include <set>

#include "ctxgen/pipeline.h"
#include "ort_harness.h"
#include "test_util.h"

namespace fs = std::filesystem;

namespace ctxgen::ort_test {
namespace {

using Dims = std::map<std::string, int64_t>;

// ORT's free dimension overrides are what --fix-dim is to the CLI.
Ort::SessionOptions recording_options(GraphOptimizationLevel level, const Dims& dims) {
  Ort::SessionOptions options = plugin_options({{"session.record_ep_graph_assignment_info", "1"}});
  options.SetGraphOptimizationLevel(level);
  for (const auto& [name, value] : dims) options.AddFreeDimensionOverrideByName(name.c_str(), value);
  return options;
}

struct Ordinary {
  std::string test_name;
  std::string model;   // in testdata/generate.py's output, or under testdata/ for exports/...
  bool partly_on_cpu;  // the ref backend leaves some nodes to ORT
  Dims dims = {};      // the model's open dims, fixed
};
void PrintTo(const Ordinary& o, std::ostream* out) { *out << o.model; }

class OrdinaryModelTest : public ::testing::TestWithParam<Ordinary> {
 protected:
  void SetUp() override { Plugin::register_library(); }
  static fs::path model() {
    const std::string& name = GetParam().model;
    return name.rfind("exports/", 0) == 0 ? fs::path(CTXGEN_SOURCE_DIR) / "testdata" / name
                                          : testing::generated_models() / name;
  }
};

// Without ORT's own graph optimizations the EP sees the model as the CLI does, so it makes the
// partitions `ctxgen compile` makes and leaves the same nodes to the CPU EP; the outputs match.
TEST_P(OrdinaryModelTest, ClaimsWhatTheCliCompilesAndMatchesTheCpuEp) {
  const fs::path model = OrdinaryModelTest::model();
  const auto backend = make_ref_backend();
  LoadOptions load;
  load.fix_dims = GetParam().dims;
  const PartitionedModel cli = partition_model(model, load, *backend);
  size_t cli_nodes = 0;
  for (const auto& partition : cli.plan.partitions) cli_nodes += partition.nodes.size();
  ASSERT_GT(cli_nodes, 0u);
  EXPECT_EQ(!cli.plan.cpu_nodes.empty(), GetParam().partly_on_cpu);

  Ort::Session session = open_session(model, recording_options(ORT_DISABLE_ALL, GetParam().dims));
  const Assigned assigned = assigned_to_ctxgen(session);
  EXPECT_EQ(assigned.subgraphs, cli.plan.partitions.size());
  EXPECT_GE(assigned.nodes, cli_nodes);
  std::set<std::string> cli_cpu;
  for (const auto& cpu : cli.plan.cpu_nodes) cli_cpu.insert(cli.model.graph().node(static_cast<int>(cpu.node)).name());
  EXPECT_EQ(assigned.elsewhere, cli_cpu);
  // The nodes folded into constants (shape arithmetic) ride along in the partitions: none runs on CPU.
  EXPECT_EQ(assigned.nodes + assigned.elsewhere.size(), static_cast<size_t>(load_model(model, load).graph().node_size()));
  expect_matches_original(session, model);
}

// With ORT's default optimizations (it folds and fuses first) the EP still takes the graph and
// the outputs still match.
TEST_P(OrdinaryModelTest, RunsAfterOrtsOwnOptimisations) {
  Ort::Session session = open_session(model(), recording_options(ORT_ENABLE_ALL, GetParam().dims));
  EXPECT_GT(assigned_to_ctxgen(session).nodes, 0u);
  expect_matches_original(session, model());
}

// The nodes of an If's branches are not converted (ort_model.h): the If stays with ORT, which runs
// its branches, and the EP takes the rest.
TEST(OrdinaryModel, ControlFlowStaysWithOrtAndTheRestRunsOnTheEp) {
  Plugin::register_library();
  const fs::path model = testing::generated_models() / "subgraph.onnx";
  Ort::Session session = open_session(model, recording_options(ORT_DISABLE_ALL, {}));
  const Assigned assigned = assigned_to_ctxgen(session);
  EXPECT_GT(assigned.nodes, 0u);
  EXPECT_TRUE(assigned.elsewhere.count("if"));
  expect_matches_original(session, model);
}

// A Shape ctxgen folds is still a node of ORT's graph, with an edge from the value it measures:
// fused nodes must be valid cuts of that graph, or ORT would refuse them all. Shared with a CPU
// node, the folded value leaves the partition as an output; read through a CPU node that reads the
// partition, the folded node and its reader form a second partition after the CPU node.
TEST(OrdinaryModel, FoldedShapesKeepTheFusedNodesValidInOrtsGraph) {
  Plugin::register_library();
  // The shapes on both sides of the CPU-only op are folded into one Concat: each folded value
  // keeps its bytes, since ORT's graph still reads them across the cut.
  struct Expected {
    size_t partitions;
    std::set<std::string> elsewhere;
  };
  const std::map<std::string, Expected> models = {{"folded/shared.onnx", {1, {"floor"}}},
                                                  {"folded/through_cpu.onnx", {2, {"floor"}}},
                                                  {"folded/split.onnx", {2, {"floor"}}}};
  for (const auto& [name, expected] : models) {
    const fs::path model = testing::generated_models() / name;
    Ort::Session session = open_session(model, recording_options(ORT_DISABLE_ALL, {}));
    const Assigned assigned = assigned_to_ctxgen(session);
    EXPECT_EQ(assigned.subgraphs, expected.partitions) << name;
    EXPECT_EQ(assigned.elsewhere, expected.elsewhere) << name;
    expect_matches_original(session, model);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Models, OrdinaryModelTest,
    ::testing::Values(Ordinary{"Cnn", "cnn.onnx", false}, Ordinary{"Islands", "islands.onnx", true},
                      Ordinary{"Constants", "constants.onnx", false}, Ordinary{"ExternalData", "external.onnx", true},
                      Ordinary{"ExportedCnn", "exports/cnn_upsample.onnx", false, {{"batch", 1}}},
                      Ordinary{"ExportedPrefill", "exports/decoder_prefill.onnx", false, {{"batch", 1}, {"seq", 16}}},
                      Ordinary{"ExportedDecode", "exports/decoder_decode.onnx", false,
                               {{"batch", 1}, {"seq", 1}, {"past", 15}}}),
    [](const auto& info) { return info.param.test_name; });

}  // namespace
}  // namespace ctxgen::ort_test

// CTXGEN_PROFILE: every op a compiled model runs in ONNX Runtime, timed, as a Chrome trace with a
// table of the time by op type.

#include <set>

#include <nlohmann/json.hpp>

#include "e2e.h"

namespace ctxgen::testing {
namespace {

TEST(Profile, EveryOpOfEveryRunWithItsTypeShapeAndShare) {
  TempDir dir;
  const fs::path cnn = copy_model("cnn.onnx", dir.path());
  ASSERT_EQ(ctxgen("compile " + quote(cnn)).exit_code, 0);
  // verify runs the compiled model once, in a child process that ends without exit handlers.
  const auto r = run_command("CTXGEN_PROFILE=" + quote(dir / "trace.json") + " " + std::string(CTXGEN_BINARY) +
                             " verify " + quote(dir / "cnn_ctx.onnx") + " --reference " + quote(cnn));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto trace = nlohmann::json::parse(read_file(dir / "trace.json"));
  const size_t ops = trace["traceEvents"].size();
  ASSERT_GT(ops, 0u);
  std::set<std::string> types;
  for (const auto& e : trace["traceEvents"]) {
    EXPECT_EQ(e["ph"], "X");
    EXPECT_GE(e["dur"].get<double>(), 0.0);
    EXPECT_EQ(e["args"]["graph"], "cnn_ref_0");
    EXPECT_EQ(e["args"]["output"].get<std::string>().rfind("float32 [", 0), 0u) << e.dump();
    types.insert(e["args"]["op_type"].get<std::string>());
  }
  EXPECT_TRUE(types.count("Conv")) << trace.dump();
  double share = 0;
  uint64_t runs = 0;
  for (const auto& row : trace["otherData"]["by_op_type"]) {
    share += row["share"].get<double>();
    runs += row["runs"].get<uint64_t>();
  }
  EXPECT_NEAR(share, 1.0, 1e-3);
  EXPECT_EQ(runs, ops);
  EXPECT_EQ(trace["otherData"]["events_left_out"], 0);
}

}  // namespace
}  // namespace ctxgen::testing

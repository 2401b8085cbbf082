// The ONNX project's own models (Debian's libonnx-testdata): every pytorch-converted model must
// compile at least one node on ref, and nearly all of their nodes must.

#include <nlohmann/json.hpp>

#include "e2e.h"

namespace ctxgen::testing {
namespace {

const fs::path kData = "/usr/share/libonnx-testdata/data";

TEST(OnnxTestData, EveryPytorchConvertedModelCompiles) {
  ASSERT_TRUE(fs::is_directory(kData / "pytorch-converted")) << "install libonnx-testdata (scripts/setup.sh)";
  TempDir dir;
  size_t models = 0, compiled = 0, nothing = 0, nodes = 0, on_ref = 0;
  std::vector<fs::path> paths;
  for (const auto& e : fs::directory_iterator(kData / "pytorch-converted")) paths.push_back(e.path() / "model.onnx");
  std::sort(paths.begin(), paths.end());
  for (const auto& model : paths) {
    ++models;
    std::string name = model.parent_path().filename().string();
    fs::path out = dir / name;
    auto r = ctxgen("compile " + quote(model) + " --output-dir " + quote(out) + " --report " + quote(dir / (name + ".json")));
    if (r.exit_code == 4) {
      ++nothing;
      ADD_FAILURE() << name << " compiles nothing: " << r.output;
      continue;
    }
    ASSERT_EQ(r.exit_code, 0) << name << ": " << r.output;
    ++compiled;
    auto report = nlohmann::json::parse(read_file(dir / (name + ".json")));
    nodes += report["models"][0]["nodes"].get<size_t>();
    on_ref += report["models"][0]["nodes_compiled"].get<size_t>();
    onnx::ModelProto ctx = load_proto(out / "model_ctx.onnx");
    EXPECT_NO_THROW(onnx::checker::check_model(ctx)) << name;
  }
  std::cout << "pytorch-converted: " << models << " models, " << compiled << " compiled, " << nothing
            << " with nothing to compile; " << on_ref << " of " << nodes << " nodes of compiled models on ref\n";
  EXPECT_EQ(models, 82u) << "libonnx-testdata 1.12 ships 82 pytorch-converted models";
  EXPECT_EQ(compiled, models);
  EXPECT_GE(on_ref * 100, nodes * 95) << on_ref << " of " << nodes << " nodes on ref";
}

}  // namespace
}  // namespace ctxgen::testing

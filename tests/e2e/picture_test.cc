// `ctxgen inspect MODEL --dot/--svg`: the partitioning as a picture, the same cut compile makes.

#include <regex>

#include <nlohmann/json.hpp>

#include "e2e.h"

namespace ctxgen::testing {
namespace {

const fs::path kExports = fs::path(CTXGEN_SOURCE_DIR) / "testdata/exports";

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// Only the DOT on standard output, so the test reads what a pipe to Graphviz would.
CommandResult picture(const std::string& args) {
  return run_command("(" + std::string(CTXGEN_BINARY) + " inspect " + args + " 2>/dev/null)");
}

// A model from x [2] to y [2] through `nodes`, a Python list of onnx.helper nodes (as h).
void make_model(const fs::path& path, const std::string& nodes) {
  auto r = run_command(std::string(CTXGEN_PYTHON) + " -c " +
                       quote("import onnx, sys\n"
                             "from onnx import helper as h, TensorProto as T\n"
                             "g = h.make_graph(" + nodes + ", \"g\", [h.make_tensor_value_info(\"x\", T.FLOAT, [2])],\n"
                             "                 [h.make_tensor_value_info(\"y\", T.FLOAT, [2])])\n"
                             "onnx.save(h.make_model(g, opset_imports=[h.make_opsetid(\"\", 17)]), sys.argv[1])\n") +
                       " " + quote(path));
  ASSERT_EQ(r.exit_code, 0) << r.output;
}

TEST(Picture, AModelIsCutAsCompileCutsIt) {
  TempDir dir;
  fs::path model = copy_model("islands.onnx", dir.path());
  auto r = picture(quote(model) + " --dot");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_EQ(ctxgen("compile " + quote(model) + " --report " + quote(dir / "r.json")).exit_code, 0);
  auto report = nlohmann::json::parse(read_file(dir / "r.json"))["models"][0];
  EXPECT_EQ(count(r.output, "subgraph cluster_"), report["partitions"].size()) << r.output;
  EXPECT_NE(r.output.find("6 of 8 nodes on ref in 3 partition(s), 2 on CPU"), std::string::npos) << r.output;
  // Each partition's nodes inside its cluster, each CPU node outside any, with its reason.
  std::smatch cluster;
  std::string rest = r.output;
  for (size_t k = 0; std::regex_search(rest, cluster, std::regex("subgraph cluster_\\d+ \\{([^}]*)\\}")); ++k) {
    EXPECT_EQ(count(cluster[1].str(), "[label="), report["partitions"][k]["nodes"].get<size_t>()) << cluster[1];
    EXPECT_EQ(cluster[1].str().find("CPU:"), std::string::npos);
    rest = cluster.suffix();
  }
  ASSERT_EQ(report["cpu_nodes"].size(), 2u);
  for (const auto& cpu : report["cpu_nodes"])
    EXPECT_NE(rest.find(cpu["node"].get<std::string>() + "\\nCPU: " + cpu["reason"].get<std::string>()), std::string::npos)
        << cpu << "\n" << rest;
  EXPECT_EQ(count(r.output, " -> "), 11u) << "every value that flows between nodes, once\n" << r.output;
}

TEST(Picture, ACompiledModelShowsItsEpContextNodesAndRecordedReasons) {
  TempDir dir;
  fs::path model = copy_model("islands.onnx", dir.path());
  ASSERT_EQ(ctxgen("compile " + quote(model)).exit_code, 0);
  auto r = picture(quote(dir / "islands_ctx.onnx") + " --dot");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(count(r.output, "subgraph cluster_"), 3u) << r.output;
  EXPECT_EQ(count(r.output, "label=\"EPContext"), 3u) << r.output;
  EXPECT_EQ(count(r.output, "CPU: unsupported op"), 2u) << r.output;
}

TEST(Picture, UnnamedCpuNodesOfACompiledModelKeepTheirReasons) {
  TempDir dir;
  make_model(dir / "unnamed.onnx",
             "[h.make_node(\"Relu\", [\"x\"], [\"r\"]), h.make_node(\"Floor\", [\"r\"], [\"f\"]),\n"
             " h.make_node(\"Relu\", [\"f\"], [\"s\"]), h.make_node(\"Floor\", [\"s\"], [\"y\"])]");
  ASSERT_EQ(ctxgen("compile " + quote(dir / "unnamed.onnx")).exit_code, 0);
  auto r = picture(quote(dir / "unnamed_ctx.onnx") + " --dot");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(count(r.output, "CPU: unsupported op"), 2u) << r.output;
  EXPECT_EQ(count(r.output, "no reason recorded"), 0u) << r.output;
}

TEST(Picture, ShapesGivenMoveTheBorders) {
  // The exported decoder with dynamic batch and sequence: shape arithmetic stays on CPU, each node
  // saying which dynamic shape; with both fixed it is one partition.
  auto dynamic = picture(quote(kExports / "decoder_prefill.onnx") + " --dot");
  ASSERT_EQ(dynamic.exit_code, 0) << dynamic.output;
  EXPECT_NE(dynamic.output.find("CPU: dynamic shape on input 0 'input_ids'"), std::string::npos);
  auto fixed = picture(quote(kExports / "decoder_prefill.onnx") + " --dot --fix-dim batch=1 --fix-dim seq=128");
  ASSERT_EQ(fixed.exit_code, 0) << fixed.output;
  EXPECT_EQ(count(fixed.output, "subgraph cluster_"), 1u);
  EXPECT_EQ(count(fixed.output, "CPU:"), 0u);
}

TEST(Picture, SvgThroughGraphvizAndNamesThatNeedEscaping) {
  TempDir dir;
  make_model(dir / "names.onnx",
             "[h.make_node(\"Relu\", [\"x\"], [\"r\"], name=\"say \\\"hi\\\" \\\\ there\"),\n"
             " h.make_node(\"Floor\", [\"r\"], [\"y\"], name=\"{braces} <angle>\")]");
  auto r = picture(quote(dir / "names.onnx") + " --svg");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("<?xml"), 0u) << r.output;
  EXPECT_NE(r.output.find("</svg>"), std::string::npos);
  EXPECT_NE(r.output.find("say &quot;hi&quot; \\ there"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("{braces} &lt;angle&gt;"), std::string::npos) << r.output;
  // A NUL would end Graphviz's string mid-name, and a control character is not text: both shown as \xHH.
  make_model(dir / "controls.onnx",
             "[h.make_node(\"Relu\", [\"x\"], [\"r\"], name=\"nul\\x00here\"),\n"
             " h.make_node(\"Floor\", [\"r\"], [\"y\"], name=\"bell\\x07\")]");
  r = picture(quote(dir / "controls.onnx") + " --svg");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("nul\\x00here"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("bell\\x07"), std::string::npos) << r.output;

  // Without Graphviz: one error line naming the package and --dot, nothing on standard output.
  auto missing = run_command("(PATH=/nonexistent " + std::string(CTXGEN_BINARY) + " inspect " + quote(dir / "names.onnx") +
                             " --svg 2>" + quote(dir / "err") + ")");
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_EQ(missing.output, "");
  EXPECT_NE(read_file(dir / "err").find("error: --svg needs Graphviz's dot, which is not installed (apt-get install graphviz)"),
            std::string::npos)
      << read_file(dir / "err");
}

TEST(Picture, OptionsThatDoNotGoTogether) {
  TempDir dir;
  fs::path model = copy_model("islands.onnx", dir.path());
  EXPECT_EQ(ctxgen("inspect " + quote(model) + " --dot --json").exit_code, 2);
  EXPECT_EQ(ctxgen("inspect " + quote(model) + " --dot --svg").exit_code, 2);
  auto r = ctxgen("inspect " + quote(model) + " --fix-dim n=1");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("cut a model for --dot or --svg"), std::string::npos) << r.output;
  r = ctxgen("inspect " + quote(model) + " -e ref");
  EXPECT_EQ(r.exit_code, 2) << "-e only cuts a model for a picture\n" << r.output;
  ASSERT_EQ(ctxgen("compile " + quote(model)).exit_code, 0);
  r = ctxgen("inspect " + quote(dir / "islands_ctx.onnx") + " --dot --fix-dim n=1");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("is compiled: it is drawn as it is"), std::string::npos) << r.output;
  r = ctxgen("inspect " + quote(model) + " --dot -e nope");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("unknown backend 'nope'"), std::string::npos) << r.output;
  r = ctxgen("inspect " + quote(dir / "none.onnx") + " --dot");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("none.onnx: no such file"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace ctxgen::testing

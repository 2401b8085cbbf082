// ctxgen-conformance: every model of the ONNX backend test data (Debian's libonnx-testdata) with its
// test data sets, run (a) by ONNX Runtime's CPU EP on the original (the ceiling) and (b) compiled by
// ctxgen and run through the plugin EP, both compared with the expected outputs.
// docs/conformance.md explains the numbers.

#include <fstream>
#include <iostream>
#include <map>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "ctxgen/error.h"
#include "ctxgen/model.h"
#include "ctxgen/pipeline.h"
#include "ctxgen/runtime.h"
#include "ctxgen/verify.h"

namespace fs = std::filesystem;
using namespace ctxgen;
using verify::Tensor;

namespace {

// onnx's backend test runner compares with these.
constexpr double kRtol = 1e-3, kAtol = 1e-7;

struct Case {
  std::vector<Tensor> inputs, outputs;
  std::vector<std::string> input_names, output_names;  // from the .pb files; may be empty
};

struct NotApplicable : std::runtime_error {
  using std::runtime_error::runtime_error;
};

Tensor read_tensor(const fs::path& path) {
  onnx::TensorProto proto;
  std::ifstream in(path, std::ios::binary);
  if (!proto.ParseFromIstream(&in) || proto.data_type() == 0 || proto.data_type() == onnx::TensorProto::STRING)
    throw NotApplicable(path.filename().string() + " is not a numeric tensor");
  Tensor t;
  t.type = static_cast<ONNXTensorElementDataType>(proto.data_type());  // ORT uses ONNX's codes
  t.dims.assign(proto.dims().begin(), proto.dims().end());
  try {
    t.bytes = tensor_bytes(proto);
  } catch (const Error& e) {  // sequence/optional data files also parse as (nonsense) tensors
    throw NotApplicable(path.filename().string() + ": " + e.what());
  }
  return t;
}

std::vector<Case> read_cases(const fs::path& dir) {
  std::vector<fs::path> sets;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_directory() && e.path().filename().string().rfind("test_data_set_", 0) == 0) sets.push_back(e.path());
  std::sort(sets.begin(), sets.end());
  std::vector<Case> cases;
  for (const auto& set : sets) {
    Case c;
    for (int k = 0; fs::exists(set / ("input_" + std::to_string(k) + ".pb")); ++k)
      c.inputs.push_back(read_tensor(set / ("input_" + std::to_string(k) + ".pb")));
    for (int k = 0; fs::exists(set / ("output_" + std::to_string(k) + ".pb")); ++k)
      c.outputs.push_back(read_tensor(set / ("output_" + std::to_string(k) + ".pb")));
    cases.push_back(std::move(c));
  }
  if (cases.empty()) throw NotApplicable("no test data set");
  return cases;
}

// Runs every case; returns "" when all outputs match, else what differed.
std::string run_cases(Ort::Session& session, std::vector<Case>& cases) {
  Ort::AllocatorWithDefaultOptions allocator;
  std::vector<std::string> inputs, outputs;
  for (size_t i = 0; i < session.GetInputCount(); ++i) {
    if (session.GetInputTypeInfo(i).GetONNXType() != ONNX_TYPE_TENSOR) throw NotApplicable("non-tensor input");
    inputs.emplace_back(session.GetInputNameAllocated(i, allocator).get());
  }
  for (size_t i = 0; i < session.GetOutputCount(); ++i) {
    if (session.GetOutputTypeInfo(i).GetONNXType() != ONNX_TYPE_TENSOR) throw NotApplicable("non-tensor output");
    outputs.emplace_back(session.GetOutputNameAllocated(i, allocator).get());
  }
  for (size_t n = 0; n < cases.size(); ++n) {
    Case& c = cases[n];
    if (c.inputs.size() > inputs.size() || c.outputs.size() != outputs.size())
      throw NotApplicable("test data does not match the model's inputs/outputs");
    std::vector<Ort::Value> feeds;
    std::vector<const char*> in_names, out_names;
    for (size_t i = 0; i < c.inputs.size(); ++i) {
      feeds.push_back(c.inputs[i].view());
      in_names.push_back(inputs[i].c_str());
    }
    for (const auto& o : outputs) out_names.push_back(o.c_str());
    auto got = session.Run(Ort::RunOptions{nullptr}, in_names.data(), feeds.data(), feeds.size(), out_names.data(),
                           out_names.size());
    verify::Tolerance tolerance;
    tolerance.rtol = kRtol;
    tolerance.atol = kAtol;
    for (size_t i = 0; i < outputs.size(); ++i) {
      auto d = verify::compare(Tensor::from(got[i]), c.outputs[i], tolerance);
      if (!d.within)
        return "data set " + std::to_string(n) + " output '" + outputs[i] + "': " +
               (d.problem.empty() ? d.failed
                                  : d.problem);
    }
  }
  return "";
}

std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Runs the ONNX backend test data through ONNX Runtime (CPU) and through ctxgen + the CtxgenRef plugin EP"};
  std::vector<std::string> suites = {"node", "pytorch-converted", "pytorch-operator", "simple"};
  std::string data = "/usr/share/libonnx-testdata/data", filter, json_path, plugin;
  bool require_ceiling = false;
  size_t min_on_ref = 0;
  app.add_option("--data", data, "Folder holding the suites")->capture_default_str();
  app.add_option("--suite", suites, "Suites to run (default: all four)");
  app.add_option("--filter", filter, "Only models whose folder name contains this");
  app.add_option("--json", json_path, "Write every result to this file");
  app.add_option("--plugin", plugin, "The ctxgen plugin EP library");
  app.add_flag("--require-ceiling", require_ceiling, "Exit 1 if a model that passes on the CPU EP fails through ctxgen");
  app.add_option("--min-nodes-on-ref", min_on_ref, "Exit 1 if fewer nodes run on ref (a coverage regression)");
  CLI11_PARSE(app, argc, argv);

  std::error_code ec;
  fs::path work = fs::temp_directory_path() / ("ctxgen-conformance-" + std::to_string(::getpid()));
  fs::create_directories(work);
  // ONNX Runtime's own log would repeat every failure counted below.
  verify::OrtHost host(plugin.empty() ? verify::default_plugin() : fs::path(plugin), runtime::ref_identity(),
                       ORT_LOGGING_LEVEL_FATAL);
  BackendRegistry backends = builtin_backends();

  size_t total = 0, not_applicable = 0, ceiling = 0, passed = 0, with_partition = 0, nodes = 0, compiled_nodes = 0,
         input_nodes = 0, folded_nodes = 0, removed_nodes = 0;
  std::map<std::string, std::vector<std::string>> failures;  // cause -> "model: message"
  nlohmann::json results = nlohmann::json::array();
  for (const auto& suite : suites) {
    std::vector<fs::path> dirs;
    for (const auto& e : fs::directory_iterator(fs::path(data) / suite, ec))
      if (e.is_directory() && fs::exists(e.path() / "model.onnx")) dirs.push_back(e.path());
    std::sort(dirs.begin(), dirs.end());
    for (const auto& dir : dirs) {
      std::string name = suite + "/" + dir.filename().string();
      if (!filter.empty() && name.find(filter) == std::string::npos) continue;
      ++total;
      nlohmann::json r = {{"model", name}};
      std::string stage = "ceiling";
      try {
        auto cases = read_cases(dir);
        std::string problem;
        try {
          Ort::Session original = host.cpu_session(dir / "model.onnx");
          problem = run_cases(original, cases);
        } catch (const NotApplicable&) {
          throw;
        } catch (const std::exception& e) {
          throw NotApplicable(std::string("ONNX Runtime cannot run the original: ") + first_line(e.what()));
        }
        r["cpu"] = problem.empty();
        if (!problem.empty()) {
          r["cpu_problem"] = problem;
          results.push_back(r);
          continue;
        }
        ++ceiling;
        stage = "compile error";
        CompileOptions options;
        options.output_dir = work / dir.filename();
        options.allow_empty = true;
        options.force = true;
        auto summary = compile_models({dir / "model.onnx"}, options, backends);
        const auto& m = summary.models.front();
        nodes += m.node_count;
        compiled_nodes += m.compiled_nodes;
        input_nodes += m.input_nodes;
        folded_nodes += m.folded_nodes;
        removed_nodes += m.removed_nodes;
        with_partition += m.partitions.empty() ? 0 : 1;
        r["nodes"] = m.node_count;
        r["nodes_on_ref"] = m.compiled_nodes;
        r["nodes_in_input"] = m.input_nodes;
        r["nodes_folded"] = m.folded_nodes;
        stage = "load error";
        Ort::Session session = host.plugin_session(m.output);
        stage = "run error";
        problem = run_cases(session, cases);
        if (!problem.empty()) {
          stage = "wrong output";
          throw std::runtime_error(problem);
        }
        r["ctxgen"] = true;
        ++passed;
      } catch (const NotApplicable& e) {
        ++not_applicable;
        r["not_applicable"] = e.what();
      } catch (const std::exception& e) {
        r["ctxgen"] = false;
        r["failure"] = stage;
        r["problem"] = first_line(e.what());
        failures[stage].push_back(name + ": " + first_line(e.what()));
      }
      results.push_back(r);
    }
  }
  fs::remove_all(work, ec);

  std::cout << "models: " << total << " (" << not_applicable << " not applicable: non-tensor data or not runnable by ONNX Runtime)\n"
            << "(a) ONNX Runtime CPU EP on the original matches the expected outputs: " << ceiling << "\n"
            << "(b) ctxgen + CtxgenRef plugin EP matches the expected outputs:      " << passed << "\n"
            << "models with at least one ref partition: " << with_partition << "\n"
            << "nodes of the input models: " << input_nodes << "; on ref: " << compiled_nodes << ", folded into constants: "
            << folded_nodes << ", removed as dead: " << removed_nodes << ", left on CPU: " << nodes - compiled_nodes << "\n"
            << "tolerance: rtol " << kRtol << ", atol " << kAtol << " (onnx's backend test runner)\n";
  for (const auto& [cause, list] : failures) {
    std::cout << cause << ": " << list.size() << "\n";
    for (const auto& f : list) std::cout << "  " << f << "\n";
  }
  if (!json_path.empty()) {
    std::ofstream out(json_path);
    out << nlohmann::json{{"models", total}, {"not_applicable", not_applicable}, {"cpu_pass", ceiling},
                          {"ctxgen_pass", passed}, {"models_with_partition", with_partition}, {"nodes", nodes},
                          {"nodes_on_ref", compiled_nodes}, {"nodes_in_input", input_nodes},
                          {"nodes_folded", folded_nodes}, {"nodes_removed", removed_nodes}, {"results", results}}.dump(2)
        << "\n";
  }
  std::cout << passed << " passed, " << ceiling - passed << " failed\n";
  if (compiled_nodes < min_on_ref) {
    std::cout << "coverage regression: " << compiled_nodes << " nodes on ref, at least " << min_on_ref << " required\n";
    return 1;
  }
  return require_ceiling && passed != ceiling ? 1 : 0;
}

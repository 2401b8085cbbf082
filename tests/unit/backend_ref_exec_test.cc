// End to end through compiler and runtime: every ONNX backend node test
// (/usr/share/libonnx-testdata/data/node/*) whose nodes ref supports is compiled as one partition,
// run with runtime::execute and compared with the expected outputs.

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "backend_test_util.h"
#include "ctxgen/error.h"
#include "ctxgen/runtime.h"

namespace ctxgen {
namespace {

namespace fs = std::filesystem;
const fs::path kNodeTests = "/usr/share/libonnx-testdata/data/node";

struct Tensor {
  int32_t dtype = 0;
  std::vector<int64_t> dims;
  std::vector<uint8_t> bytes;
};

Tensor read_tensor(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buf;
  buf << in.rdbuf();
  onnx::TensorProto t;
  if (!t.ParseFromString(buf.str())) throw std::runtime_error("cannot parse " + path.string());
  Tensor out;
  out.dtype = t.data_type();
  out.dims.assign(t.dims().begin(), t.dims().end());
  auto take = [&](const auto& field, size_t size) {
    out.bytes.resize(static_cast<size_t>(field.size()) * size);
    if (!out.bytes.empty()) std::memcpy(out.bytes.data(), field.data(), out.bytes.size());
  };
  if (t.has_raw_data()) out.bytes.assign(t.raw_data().begin(), t.raw_data().end());
  else if (t.data_type() == onnx::TensorProto::FLOAT) take(t.float_data(), 4);
  else if (t.data_type() == onnx::TensorProto::INT64) take(t.int64_data(), 8);
  return out;
}

enum class Outcome { kNotSupported, kPass, kMismatch };

struct Case {
  std::string name;
  Outcome outcome = Outcome::kNotSupported;
  std::string detail;
};

std::string compare(const std::vector<float>& got, const std::vector<float>& want) {
  if (got.size() != want.size()) return "size " + std::to_string(got.size()) + " vs " + std::to_string(want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    bool both_nan = std::isnan(got[i]) && std::isnan(want[i]);
    bool same_inf = std::isinf(want[i]) && got[i] == want[i];
    if (!both_nan && !same_inf && !(std::fabs(got[i] - want[i]) <= 1e-5f + 1e-4f * std::fabs(want[i])))
      return "element " + std::to_string(i) + ": got " + std::to_string(got[i]) + ", expected " + std::to_string(want[i]);
  }
  return {};
}

Case run_case(const fs::path& dir) {
  Case c;
  c.name = dir.filename().string();
  Model m;
  try {
    m = load_model(dir / "model.onnx");
  } catch (const Error& e) {
    c.detail = std::string("load: ") + e.what();
    return c;
  }
  auto backend = make_ref_backend();
  for (int i = 0; i < m.graph().node_size(); ++i) {
    auto s = backend->supports(m, m.graph().node(i));
    if (!s.supported) {
      c.detail = describe_node(m.graph().node(i), static_cast<size_t>(i)) + ": " + s.reason;
      return c;
    }
  }
  std::unordered_set<std::string> constants;
  for (const auto& [name, index] : m.constants) constants.insert(name);
  auto plan = partition_graph(m.graph(), constants, [](size_t) { return NodeSupport::yes(); });
  if (plan.partitions.size() != 1) {
    c.detail = "not one partition";
    return c;
  }
  const Partition& part = plan.partitions[0];
  WeightStore store;
  c.outcome = Outcome::kMismatch;
  try {
    auto graph = backend->compile(m, part, "g", store);
    auto program = ref::deserialize(graph.program.data(), graph.program.size());
    runtime::validate(program, store.size());

    std::map<std::string, Tensor> inputs, expected;
    int k = 0;
    for (const auto& v : m.graph().input())
      if (!m.constant(v.name())) inputs[v.name()] = read_tensor(dir / "test_data_set_0" / ("input_" + std::to_string(k++) + ".pb"));
    k = 0;
    for (const auto& v : m.graph().output())
      expected[v.name()] = read_tensor(dir / "test_data_set_0" / ("output_" + std::to_string(k++) + ".pb"));

    std::vector<const void*> in_ptrs;
    for (const auto& name : part.inputs) in_ptrs.push_back(inputs.at(name).bytes.data());
    std::vector<std::vector<float>> outs;
    std::vector<void*> out_ptrs;
    for (const auto& sig : graph.outputs) {
      int64_t n = 1;
      for (int64_t d : sig.dims) n *= d;
      outs.emplace_back(static_cast<size_t>(n));
    }
    for (auto& o : outs) out_ptrs.push_back(o.data());
    std::vector<uint8_t> arena;
    runtime::execute(program, [&](uint32_t id) { return store.entry(id).blob.data; }, in_ptrs, out_ptrs, arena);
    for (size_t i = 0; i < outs.size(); ++i) {
      const Tensor& want = expected.at(part.outputs[i]);
      std::vector<float> w(want.bytes.size() / 4);
      std::memcpy(w.data(), want.bytes.data(), want.bytes.size());
      std::string diff = compare(outs[i], w);
      if (!diff.empty()) {
        c.detail = "output '" + part.outputs[i] + "' " + diff;
        return c;
      }
    }
    c.outcome = Outcome::kPass;
  } catch (const std::exception& e) {
    c.detail = e.what();
  }
  return c;
}

TEST(RefExec, OnnxNodeTestsMatchExpectedOutputs) {
  if (!fs::exists(kNodeTests)) GTEST_SKIP() << kNodeTests << " is not installed";
  std::vector<fs::path> dirs;
  for (const auto& entry : fs::directory_iterator(kNodeTests))
    if (fs::exists(entry.path() / "model.onnx")) dirs.push_back(entry.path());
  std::sort(dirs.begin(), dirs.end());
  size_t pass = 0, compiled = 0;
  std::string failures;
  for (const auto& dir : dirs) {
    Case c = run_case(dir);
    if (c.outcome == Outcome::kNotSupported) continue;
    ++compiled;
    if (c.outcome == Outcome::kPass) ++pass;
    else failures += "  " + c.name + ": " + c.detail + "\n";
  }
  std::cout << "[ref exec] " << dirs.size() << " node tests, " << compiled << " fully supported, " << pass
            << " match the expected outputs\n";
  EXPECT_EQ(pass, compiled) << "mismatching node tests:\n" << failures;
  EXPECT_GT(compiled, 100u);
}

}  // namespace
}  // namespace ctxgen

// The ref runtime's kernels other than GEMM, one op at a time on the shapes the bench models run
// (the exported CNN at 32 x 32, the LLM pair's prefill, PaddleOCR's classifier), each as CtxgenRef runs it: a one-graph
// context binary held in memory, its op planned once by runtime::Executable, run on one thread.
// docs/benchmarks.md has the figures; ctxgen-gemm-bench covers the GEMMs.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "ctxgen/format.h"
#include "ctxgen/program_builder.h"
#include "ctxgen/runtime.h"

namespace {

using ctxgen::ref::Attr;
using ctxgen::ref::floats_attr;
using ctxgen::ref::ProgramBuilder;
using Dims = std::vector<int64_t>;

int64_t count(const Dims& dims) {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

// One op over float inputs of `inputs` dims, writing `out` dims.
struct Case {
  const char* name;
  const char* type;
  std::vector<Dims> inputs;
  Dims out;
  std::vector<Attr> attrs;
};

std::vector<Case> cases() {
  using ctxgen::ref::float_attr;
  using ctxgen::ref::int_attr;
  using ctxgen::ref::ints_attr;
  const auto resize = [](int64_t mode, Dims in, float scale) {
    Dims out = {in[0], in[1], static_cast<int64_t>(static_cast<float>(in[2]) * scale),
                static_cast<int64_t>(static_cast<float>(in[3]) * scale)};
    return Case{"", "Resize", {in}, out,
                {int_attr("mode", mode), int_attr("coord", 0), int_attr("nearest_mode", 0),
                 floats_attr("scales", {1, 1, scale, scale}), ints_attr("sizes", out)}};
  };
  const auto pool = [](Dims in, int64_t k) {
    return Case{"", "MaxPool", {in}, {in[0], in[1], in[2] / k, in[3] / k},
                {ints_attr("kernel_shape", {k, k}), ints_attr("strides", {k, k}), ints_attr("pads", {0, 0, 0, 0}),
                 ints_attr("dilations", {1, 1}), int_attr("ceil_mode", 0)}};
  };
  std::vector<Case> all = {
      resize(0, {1, 32, 8, 8}, 2.0f),
      resize(1, {1, 32, 16, 16}, 2.0f),
      pool({1, 16, 32, 32}, 2),
      pool({1, 32, 16, 16}, 4),
      {"", "Concat", {{1, 32, 16, 16}, {1, 32, 16, 16}}, {1, 64, 16, 16}, {int_attr("axis", 1)}},
      {"", "Add", {{128, 1024}, {128, 1024}}, {128, 1024}, {}},
      {"", "Add", {{128, 4096}, {4096}}, {128, 4096}, {}},
      {"", "Erf", {{128, 4096}}, {128, 4096}, {}},
      {"", "LayerNormalization", {{128, 1024}, {1024}, {1024}}, {128, 1024},
       {int_attr("axis", 1), float_attr("epsilon", 1e-5f), int_attr("output", 0)}},
      {"", "Softmax", {{16, 128, 128}}, {16, 128, 128}, {int_attr("axis", 2), int_attr("coerce_2d", 0)}},
      {"", "Transpose", {{128, 16, 64}}, {16, 128, 64}, {ints_attr("perm", {1, 0, 2})}},
      // The squeeze-and-excite pools of PaddleOCR's direction classifier.
      {"", "ReduceMean", {{1, 200, 2, 96}}, {1, 200, 1, 1}, {ints_attr("axes", {2, 3}), int_attr("keepdims", 1)}},
  };
  static const char* const kNames[] = {"cnn_resize_nearest", "cnn_resize_linear", "cnn_maxpool_2x2", "cnn_maxpool_4x4",
                                       "cnn_concat", "llm_add", "llm_add_bias", "llm_erf", "llm_layernorm",
                                       "llm_softmax", "llm_transpose_heads", "ocr_global_pool"};
  for (size_t i = 0; i < all.size(); ++i) all[i].name = kNames[i];
  return all;
}

// The case as CtxgenRef would load it: a context binary with one graph, planned once.
std::unique_ptr<ctxgen::runtime::Executable> executable(const Case& c) {
  ProgramBuilder p;
  std::vector<int32_t> ids;
  for (const Dims& d : c.inputs) ids.push_back(p.input(d));
  p.op(c.type, ids, p.output(c.out), c.attrs);
  ctxgen::CompiledGraph graph;
  graph.name = c.name;
  for (size_t i = 0; i < c.inputs.size(); ++i) graph.inputs.push_back({"x" + std::to_string(i), 1, c.inputs[i]});
  graph.outputs.push_back({"y", 1, c.out});
  graph.program = ctxgen::ref::serialize(p.program());
  auto bytes = std::make_shared<std::vector<uint8_t>>();
  ctxgen::write_context_binary({"CtxgenRef", "bench", ctxgen::runtime::hardware_architecture()}, {graph}, {},
                               [&](const uint8_t* data, size_t size) { bytes->insert(bytes->end(), data, data + size); });
  auto binary = ctxgen::ContextBinary::from_memory(bytes->data(), bytes->size(), bytes, "kernel-bench");
  return std::make_unique<ctxgen::runtime::Executable>(binary, c.name);
}

void run(benchmark::State& state, const Case& c) {
  const auto ex = executable(c);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> uniform(-2, 2);
  std::vector<std::vector<float>> inputs;
  std::vector<const void*> in;
  for (const Dims& d : c.inputs) {
    inputs.emplace_back(static_cast<size_t>(count(d)));
    for (float& v : inputs.back()) v = uniform(rng);
    in.push_back(inputs.back().data());
  }
  std::vector<float> out(static_cast<size_t>(count(c.out)));
  for (auto _ : state) {
    ex->run(in, {out.data()});
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(state.iterations() * count(c.out));
}

}  // namespace

int main(int argc, char** argv) {
  static const std::vector<Case> all = cases();
  for (const Case& c : all) benchmark::RegisterBenchmark(c.name, [&c](benchmark::State& s) { run(s, c); });
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

// Which CPU library runs ctxgen's GEMMs: single-precision row-major C = A x B on the shapes the
// bench models run, through each candidate Debian packages, at 1 and 2 threads. Built with the
// candidates that are installed (apps/gemm-bench/CMakeLists.txt); docs/benchmarks.md has the
// figures. Two threads are each library's own; ctxgen itself lends oneDNN ONNX Runtime's threads.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#ifdef CTXGEN_BENCH_OPENBLAS
#include <cblas.h>
#endif
#ifdef CTXGEN_BENCH_BLIS
#include <blis.h>
#endif
#ifdef CTXGEN_BENCH_DNNL
#include <oneapi/dnnl/dnnl.h>
#endif
#ifdef CTXGEN_BENCH_EIGEN
#include <Eigen/Core>
#endif
#include <omp.h>

namespace {

// m, k, n: the LLM pair's projections (prefill rows 128, decode 1), its attention scores, and the
// exported CNN's convolutions as im2col GEMMs.
struct Shape {
  const char* name;
  int64_t m, k, n;
};
constexpr Shape kShapes[] = {
    {"prefill_qkvo", 128, 1024, 1024}, {"prefill_up", 128, 1024, 4096}, {"prefill_down", 128, 4096, 1024},
    {"prefill_scores", 128, 1024, 128}, {"decode_up", 1, 1024, 4096},   {"decode_down", 1, 4096, 1024},
    {"cnn_conv1", 16, 27, 1024},        {"cnn_conv2", 32, 144, 256},
};

struct Operands {
  std::vector<float> a, b, c;
  explicit Operands(const Shape& s)
      : a(static_cast<size_t>(s.m * s.k)), b(static_cast<size_t>(s.k * s.n)), c(static_cast<size_t>(s.m * s.n)) {
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> d(-1, 1);
    for (auto& v : a) v = d(rng);
    for (auto& v : b) v = d(rng);
  }
};

// The i-k-j loop ctxgen's ref runtime used before oneDNN.
void loops(const Shape& s, Operands& o) {
  std::fill(o.c.begin(), o.c.end(), 0.0f);
  for (int64_t i = 0; i < s.m; ++i)
    for (int64_t p = 0; p < s.k; ++p) {
      const float av = o.a[static_cast<size_t>(i * s.k + p)];
      const float* brow = o.b.data() + p * s.n;
      float* row = o.c.data() + i * s.n;
      for (int64_t j = 0; j < s.n; ++j) row[j] += av * brow[j];
    }
}

template <typename F>
void run(benchmark::State& state, const Shape& s, F&& gemm) {
  Operands o(s);
  const int threads = static_cast<int>(state.range(0));
  for (auto _ : state) {
    gemm(s, o, threads);
    benchmark::DoNotOptimize(o.c.data());
    benchmark::ClobberMemory();
  }
  state.counters["GFLOPS"] = benchmark::Counter(2.0 * static_cast<double>(s.m * s.k * s.n),
                                                benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
}

void add(const std::string& library, void (*gemm)(const Shape&, Operands&, int), bool threaded) {
  for (const Shape& s : kShapes) {
    auto* b = benchmark::RegisterBenchmark((library + "/" + s.name).c_str(),
                                           [s, gemm](benchmark::State& st) { run(st, s, gemm); });
    b->Arg(1);
    if (threaded) b->Arg(2);
    b->ArgName("threads")->Unit(benchmark::kMicrosecond)->UseRealTime();
  }
}

}  // namespace

int main(int argc, char** argv) {
  add("loops", [](const Shape& s, Operands& o, int) { loops(s, o); }, false);
#ifdef CTXGEN_BENCH_OPENBLAS
  add("openblas", [](const Shape& s, Operands& o, int threads) {
    openblas_set_num_threads(threads);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, s.m, s.n, s.k, 1.0f, o.a.data(), s.k, o.b.data(), s.n, 0.0f,
                o.c.data(), s.n);
  }, true);
#endif
#ifdef CTXGEN_BENCH_BLIS
  add("blis", [](const Shape& s, Operands& o, int threads) {
    bli_thread_set_num_threads(threads);
    float one = 1.0f, zero = 0.0f;
    bli_sgemm(BLIS_NO_TRANSPOSE, BLIS_NO_TRANSPOSE, s.m, s.n, s.k, &one, o.a.data(), s.k, 1, o.b.data(), s.n, 1, &zero,
              o.c.data(), s.n, 1);
  }, true);
#endif
#ifdef CTXGEN_BENCH_DNNL
  add("onednn", [](const Shape& s, Operands& o, int threads) {
    omp_set_num_threads(threads);
    dnnl_sgemm('N', 'N', s.m, s.n, s.k, 1.0f, o.a.data(), s.k, o.b.data(), s.n, 0.0f, o.c.data(), s.n);
  }, true);
  // B stored [N, K], as ctxgen packs a constant weight (docs/benchmarks.md, "Weight layout").
  add("onednn_nk", [](const Shape& s, Operands& o, int threads) {
    omp_set_num_threads(threads);
    dnnl_sgemm('N', 'T', s.m, s.n, s.k, 1.0f, o.a.data(), s.k, o.b.data(), s.k, 0.0f, o.c.data(), s.n);
  }, true);
#endif
#ifdef CTXGEN_BENCH_EIGEN
  add("eigen", [](const Shape& s, Operands& o, int threads) {
    using Matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
    Eigen::setNbThreads(threads);
    Eigen::Map<const Matrix> a(o.a.data(), s.m, s.k), b(o.b.data(), s.k, s.n);
    Eigen::Map<Matrix> c(o.c.data(), s.m, s.n);
    c.noalias() = a * b;
  }, true);
#endif
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

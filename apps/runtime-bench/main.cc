// ctxgen-runtime-bench: how compiled models run in ONNX Runtime next to their originals, measured
// side by side in one process (scripts/bench.sh prints it; docs/benchmarks.md explains it).
//   ctxgen-runtime-bench [--runs N] [--threads 1,2] ORIGINAL.onnx=COMPILED_ctx.onnx ...
// Per pair: inference time with CtxgenRef / with the CPU EP on the original, and session creation
// of the compiled model / of the original. For the first pair: how inference scales from 1 to 2
// intra-op threads, with CtxgenRef and with the CPU EP. For the first two pairs (a shared group):
// the resident memory the second session adds, with ep.share_ep_contexts=1 / with the CPU EP,
// over its weights. With --threads (a table of unrelated models, scripts/real_models.sh): each
// pair's inference at each of those intra-op thread counts instead, and neither of the last two.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "ctxgen/error.h"
#include "ctxgen/model.h"
#include "ctxgen/runtime.h"
#include "ctxgen/verify.h"

namespace fs = std::filesystem;
using ctxgen::verify::OrtHost;
using ctxgen::verify::Tensor;

namespace {

double seconds_of(const std::function<void()>& work) {
  const auto start = std::chrono::steady_clock::now();
  work();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// The best of `runs` of each of two works, run in turns of a few runs each: both sides see the
// same minutes of a shared machine's load (a burst that lands on one side's block of runs would
// otherwise decide the ratio). An ONNX Runtime session's idle intra-op workers spin after its run
// (here a whole core for ~37 ms), and on two cores the other side's spinner took the CPU a run's
// own worker needed: run by run in alternation, the 512-wide transformer's decode step took
// 2.2-2.5 ms on two threads on either side, 1.0-1.05 ms with nothing spinning beside it, as in a
// process of one session. So a turn starts once the other side's workers have gone to sleep, and
// with one uncounted run that wakes its own.
std::pair<double, double> best_of(int runs, const std::function<void()>& a, const std::function<void()>& b) {
  constexpr int kTurn = 5;
  constexpr auto kPause = std::chrono::milliseconds(50);
  double best_a = 1e300, best_b = 1e300;
  const auto turn = [&](const std::function<void()>& work, int count, double& best) {
    std::this_thread::sleep_for(kPause);
    work();
    for (int i = 0; i < count; ++i) best = std::min(best, seconds_of(work));
  };
  for (int done = 0; done < runs; done += kTurn) {
    const int count = std::min(kTurn, runs - done);
    turn(a, count, best_a);
    turn(b, count, best_b);
  }
  return {best_a, best_b};
}

uint64_t resident_bytes() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  throw ctxgen::Error(ctxgen::ErrorCode::kInternal, "no VmRSS in /proc/self/status");
}

// A session's call: its inputs (random, of the compiled model's static shapes, the same for both
// sessions of a pair; an input compiled for one value (--fix-value) that value) and output names,
// found once so the timed runs do nothing else.
struct Call {
  std::vector<std::string> inputs, outputs;
  std::vector<Tensor> tensors;
};

Call call_for(const fs::path& compiled_path, Ort::Session& compiled, Ort::Session& session) {
  Ort::AllocatorWithDefaultOptions allocator;
  std::mt19937_64 rng(1);
  const auto fixed = ctxgen::verify::fixed_feeds(compiled_path, compiled);
  Call c;
  for (size_t i = 0; i < compiled.GetInputCount(); ++i) {
    c.inputs.emplace_back(compiled.GetInputNameAllocated(i, allocator).get());
    const Ort::TypeInfo type = compiled.GetInputTypeInfo(i);  // the shape info below is a view of it
    auto info = type.GetTensorTypeAndShapeInfo();
    const auto value = fixed.find(c.inputs.back());
    c.tensors.push_back(value != fixed.end()
                            ? value->second
                            : ctxgen::verify::random_tensor(info.GetElementType(), info.GetShape(), c.inputs.back(), rng));
  }
  for (size_t i = 0; i < session.GetOutputCount(); ++i) c.outputs.emplace_back(session.GetOutputNameAllocated(i, allocator).get());
  return c;
}

void run(Ort::Session& session, const Call& call) {
  std::vector<const char*> in, out;
  std::vector<Ort::Value> values;
  for (size_t i = 0; i < call.inputs.size(); ++i) {
    in.push_back(call.inputs[i].c_str());
    values.push_back(call.tensors[i].view());
  }
  for (const auto& n : call.outputs) out.push_back(n.c_str());
  session.Run(Ort::RunOptions{nullptr}, in.data(), values.data(), values.size(), out.data(), out.size());
}

uint64_t weight_bytes(const fs::path& original) {
  uint64_t total = 0;
  for (const auto& w : ctxgen::load_model(original).weights) total += w.data.size;
  return total;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Inference and session creation of compiled models against their originals, side by side"};
  int runs = 5;
  std::vector<std::string> pairs;
  std::vector<int> thread_counts;
  app.add_option("--runs", runs, "Runs per measurement; the best counts")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--threads", thread_counts, "Inference at each of these intra-op thread counts (comma-separated)")
      ->delimiter(',')
      ->allow_extra_args(false)
      ->check(CLI::PositiveNumber);
  app.add_option("pairs", pairs, "ORIGINAL.onnx=COMPILED_ctx.onnx")->required();
  CLI11_PARSE(app, argc, argv);
  try {
    OrtHost host(ctxgen::verify::default_plugin(), ctxgen::runtime::ref_identity());
    std::vector<std::pair<fs::path, fs::path>> models;
    for (const auto& p : pairs) {
      const auto eq = p.find('=');
      if (eq == std::string::npos) throw ctxgen::Error(ctxgen::ErrorCode::kUsage, "'" + p + "': give ORIGINAL=COMPILED");
      models.emplace_back(p.substr(0, eq), p.substr(eq + 1));
    }
    for (const auto& model : models) {
      const fs::path &original = model.first, &compiled = model.second;  // clang before 16 cannot capture structured bindings
      const auto [create_cpu, create_ctx] =
          best_of(runs, [&] { host.cpu_session(original); }, [&] { host.plugin_session(compiled); });
      const std::string name = original.filename().string();
      // 0 threads: the session options' default.
      for (int threads : thread_counts.empty() ? std::vector<int>{0} : thread_counts) {
        Ort::Session cpu = host.cpu_session(original, threads), ctx = host.plugin_session(compiled, {}, threads);
        const Call on_cpu = call_for(compiled, ctx, cpu), on_ctx = call_for(compiled, ctx, ctx);
        run(cpu, on_cpu);  // first runs allocate; they are not counted
        run(ctx, on_ctx);
        const auto [t_cpu, t_ctx] = best_of(runs, [&] { run(cpu, on_cpu); }, [&] { run(ctx, on_ctx); });
        const std::string on = threads == 0 ? "" : ", " + std::to_string(threads) + " thread" + (threads > 1 ? "s" : "");
        std::printf("inference, %s%s: CtxgenRef %.2f ms, CPU EP %.2f ms (best of %d)   ratio %.2f (target <= 1.0)\n",
                    name.c_str(), on.c_str(), 1e3 * t_ctx, 1e3 * t_cpu, runs, t_ctx / t_cpu);
      }
      std::printf("session creation, %s: _ctx.onnx %.1f ms, original %.1f ms   ratio %.2f (target <= 0.25)\n",
                  name.c_str(), 1e3 * create_ctx, 1e3 * create_cpu, create_ctx / create_cpu);
    }
    if (thread_counts.empty()) {
      const fs::path &original = models[0].first, &compiled = models[0].second;
      std::map<int, double> ctx_ms, cpu_ms;
      for (int threads : {1, 2}) {
        Ort::Session cpu = host.cpu_session(original, threads), ctx = host.plugin_session(compiled, {}, threads);
        const Call on_cpu = call_for(compiled, ctx, cpu), on_ctx = call_for(compiled, ctx, ctx);
        run(cpu, on_cpu);
        run(ctx, on_ctx);
        const auto [t_cpu, t_ctx] = best_of(runs, [&] { run(cpu, on_cpu); }, [&] { run(ctx, on_ctx); });
        cpu_ms[threads] = 1e3 * t_cpu;
        ctx_ms[threads] = 1e3 * t_ctx;
      }
      std::printf("threads, %s: CtxgenRef %.2f ms on 1, %.2f ms on 2 = x%.2f; CPU EP %.2f ms on 1, %.2f ms on 2 = x%.2f\n",
                  original.filename().c_str(), ctx_ms[1], ctx_ms[2], ctx_ms[1] / ctx_ms[2], cpu_ms[1], cpu_ms[2],
                  cpu_ms[1] / cpu_ms[2]);
    }
    if (models.size() >= 2 && thread_counts.empty()) {
      // The second session of a shared group on top of the first, each kind in a scope of its own.
      const uint64_t weights = weight_bytes(models[1].first);
      std::vector<Call> calls;  // the compiled models' static shapes serve the originals too
      for (size_t i = 0; i < 2; ++i) {
        Ort::Session ctx = host.plugin_session(models[i].second);
        calls.push_back(call_for(models[i].second, ctx, ctx));
      }
      auto added = [&](const std::function<Ort::Session(size_t)>& open) {
        Ort::Session first = open(0);
        run(first, calls[0]);
        const uint64_t before = resident_bytes();
        Ort::Session second = open(1);
        run(second, calls[1]);
        const uint64_t after = resident_bytes();
        return static_cast<double>(after - std::min(before, after));
      };
      const std::map<std::string, std::string> share = {{"ep.share_ep_contexts", "1"}};
      const double ctx_added = added([&](size_t i) { return host.plugin_session(models[i].second, share); });
      const double cpu_added = added([&](size_t i) { return host.cpu_session(models[i].first); });
      std::printf("second shared session: CtxgenRef +%.1f MB = %.1f%% of its %.1f MB of weights, CPU EP +%.1f MB = %.1f%%   "
                  "(target <= 5%%)\n",
                  ctx_added / 1e6, 100 * ctx_added / weights, weights / 1e6, cpu_added / 1e6, 100 * cpu_added / weights);
    }
  } catch (const ctxgen::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return ctxgen::exit_code(e.code());
  } catch (const Ort::Exception& e) {
    std::fprintf(stderr, "error: ONNX Runtime: %s\n", e.what());
    return ctxgen::exit_code(ctxgen::ErrorCode::kRuntime);
  }
  return 0;
}

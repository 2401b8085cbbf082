#pragma once
// Inside the pipeline: one model's state between the stages, and the run that takes it through
// them. compile --object stops after compiling and keeps the jobs; link starts from kept jobs and
// runs only what is left (docs/cli.md, "Objects").

#include <filesystem>
#include <functional>
#include <memory>
#include <vector>

#include "ctxgen/pipeline.h"

namespace ctxgen {

struct Job {
  Model model;  // after specialisation: plan indices are into its main graph's nodes
  size_t input_nodes = 0;
  SpecialiseSummary specialised;
  PartitionPlan plan;
  std::vector<CompiledGraph> graphs;
  std::filesystem::path output;
};

// What a run starts from. Empty `prepared`: each input model is loaded, specialised and
// partitioned. Otherwise `prepared(job, m)` gives model m as partitioned (link), and the run goes
// on from compiling. With options.compile_only, `compiled` gets the jobs once compiled (and the
// identity of the binaries they are compiled for), and nothing is written.
struct JobHooks {
  std::function<void(Job& job, size_t m)> prepared;
  std::function<void(std::vector<Job>& jobs, const CacheStats& cache, const BinaryIdentity& identity)> compiled;
};

// The backend options.backend names, set up with the options' settings (target, weightless).
// Throws Error(kUsage) naming the backends there are when none has that name.
std::unique_ptr<Backend> configured_backend(const BackendRegistry& backends, const CompileOptions& options);

void run_stages(const std::vector<std::filesystem::path>& inputs, const CompileOptions& options,
                const BackendRegistry& backends, const JobHooks& hooks, RunSummary& summary, bool& outputs_checked);

}  // namespace ctxgen

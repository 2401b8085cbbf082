#pragma once
// Runs the stages for N models: load -> partition -> compile (one shared weight store) -> write
// N EPContext models and one context binary. `compile` is this with N = 1.

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ctxgen/backend.h"
#include "ctxgen/bytes.h"
#include "ctxgen/compile_cache.h"
#include "ctxgen/model.h"
#include "ctxgen/specialise.h"
#include "ctxgen/weights.h"

namespace ctxgen {

// The phases of a run, in order: load (parse, fix dims, infer shapes), specialise (fold, type),
// partition (assign nodes), then compile and write. --stop-after writes the model as it stands
// after one of the first three, as <stem>_<phase>.onnx, instead of compiling.
enum class Phase { kLoad, kSpecialise, kPartition };
std::string phase_name(Phase phase);
std::optional<Phase> parse_phase(const std::string& name);

// What a long run is doing, for a progress display: a stage of model k of N starting (no bytes),
// its weights being hashed (compile: bytes so far of its total), or a file being written.
struct Progress {
  std::string stage;            // as in StageTiming
  std::filesystem::path model;  // the input model of a per-model stage; empty for the others
  size_t model_index = 0, model_count = 0;   // k of N (from 1) for per-model stages
  std::filesystem::path file;                // write stages: the file being written
  uint64_t bytes_done = 0, bytes_total = 0;  // compile and write stages; a written file ends with done == total
};

// --report - : the report goes to standard output.
inline constexpr const char* kStdoutReport = "-";

struct CompileOptions {
  std::string backend = "ref";
  std::string target;  // --target-cpu: what the backend compiles for; empty: this machine
  std::vector<LoadOptions> per_model;  // one per input model (resolve_shapes), or empty: no shape options
  std::filesystem::path output_file;  // -o: the EPContext model path (one input model only)
  std::filesystem::path output_dir;   // default: the first model's folder
  std::string node_name_prefix;
  bool embed = false;
  std::string external_initializers_file;  // file name beside the outputs; empty = embed them
  // --weightless: the binary refers to the weights the models store in external data, by offset
  // and hash, instead of holding them (the models must share one folder).
  bool weightless = false;
  bool force = false;                       // overwrite existing outputs
  bool allow_empty = false;                 // write models in which nothing compiled
  std::optional<Phase> stop_after;          // write the model after this phase instead of compiling
  // --report: written with the other outputs, all or nothing; on failure alone, with the error.
  // kStdoutReport ("-"): printed to standard output instead, on success and on failure.
  std::filesystem::path report_file;
  // Files the run reads besides the models (a manifest): no output, the report included, may be one.
  std::vector<std::filesystem::path> read_files;
  std::function<void(const Progress&)> progress;  // called as stages start and files are written
  // --cache: the compile cache's folder (docs/cli.md, "Compile cache"); empty: none.
  std::filesystem::path cache_dir;
  // --remote-cache: entries the local cache lacks are fetched from it, new ones stored there.
  std::shared_ptr<RemoteCache> remote_cache;
  // --cache-max-size: after the run, the least recently used entries go until the rest fit (as
  // `cache prune --max-size` prunes); none: no bound.
  std::optional<uint64_t> cache_max_size;
  // compile --object: the run stops after compiling, its cache entries the result; no file is written.
  bool compile_only = false;
  // link: every partition comes from the cache (the objects' entries); one it lacks is an error,
  // never compiled.
  bool cache_only = false;
};

struct PartitionSummary {
  std::string name;
  size_t nodes = 0;
  size_t inputs = 0, outputs = 0;
  size_t weights = 0;
  uint64_t program_bytes = 0;
};

struct CpuNodeSummary {
  std::string node;  // name or #index
  std::string op_type;
  std::string reason;
};

struct WeightSummary {
  uint64_t tensors = 0, bytes = 0;          // weights the compiled partitions of this model use
  uint64_t new_tensors = 0, new_bytes = 0;  // of those, not already stored for an earlier model
};

struct ModelSummary {
  std::filesystem::path input, output;
  size_t input_nodes = 0;                     // main-graph nodes of the input model
  size_t folded_nodes = 0, removed_nodes = 0;  // folded into constants / dead after folding
  size_t node_count = 0, compiled_nodes = 0;   // nodes left after specialisation / on the backend
  std::vector<PartitionSummary> partitions;
  std::vector<CpuNodeSummary> cpu_nodes;
  WeightSummary weights;
  std::vector<std::filesystem::path> data_files;  // files besides the model its weights are read from
};

struct OutputSummary {
  std::filesystem::path path;
  uint64_t size = 0;
  Hash128 hash;  // XXH3-128 of the file's bytes
};

struct StageTiming {
  // load, specialise, partition, compile (each per model), write_context_binary, build_models,
  // write_external_weights, write_models
  std::string stage;
  std::filesystem::path model;  // the input model of a per-model stage; empty for the others
  double milliseconds = 0;
};

struct RunSummary {
  std::string backend;
  std::vector<ModelSummary> models;
  std::vector<OutputSummary> outputs;  // every file written, in the order written
  WeightStoreStats weights;            // the context binary's store
  bool weights_known = true;           // false: another EP wrote binaries ctxgen cannot read (--ep-lib)
  WeightStoreStats external_weights;   // the external initializers file's store, if any
  std::vector<StageTiming> timings;    // in the order the stages ran
  CacheStats cache;
};

// Throws Error; on any failure no output file exists (outputs appear together at the end) but the
// report, when one was asked for, which then records the error.
// The files a run reads: its models and options.read_files; no output may replace one.
std::vector<std::filesystem::path> read_files(const std::vector<std::filesystem::path>& inputs, const CompileOptions& options);

RunSummary compile_models(const std::vector<std::filesystem::path>& inputs, const CompileOptions& options,
                          const BackendRegistry& backends);

// Compile and link (docs/cli.md, "Objects"): `compile MODEL --object OUT.ctxo` compiles one model
// into an object holding the model, the files its weights are in and its partitions' compile
// results; `link A.ctxo B.ctxo ...` writes exactly what `share` writes for the same models and
// options, compiling nothing. An object of another ctxgen version, backend, SDK or CPU level is
// refused by name.
RunSummary compile_object(const std::filesystem::path& model, const CompileOptions& options,
                          const BackendRegistry& backends, const std::filesystem::path& object);
// With `group` (link --manifest: each model's file name and shape options, in the manifest's
// order), the objects are linked in that order, one per model, each compiled with those options.
RunSummary link_objects(const std::vector<std::filesystem::path>& objects, CompileOptions options,
                        const BackendRegistry& backends,
                        const std::vector<std::pair<std::string, LoadOptions>>* group = nullptr);

// A compile or share run another way (ctxgen/ort_compile.h), reported as compile_models reports its
// own: `run` fills the summary, and sets `outputs_checked` once its outputs passed their checks;
// the report is then written with the outputs by `run`, or alone with the error when it throws
// (an exception other than Error becomes kInternal); --report - prints it.
using ReportedRun = std::function<void(RunSummary& summary, bool& outputs_checked)>;
RunSummary run_reported(const std::vector<std::filesystem::path>& inputs, const CompileOptions& options,
                        const ReportedRun& run);

// A model through load, specialise and partition, cut as compile would cut it, nothing written.
struct PartitionedModel {
  Model model;  // after specialisation: plan indices are into its main graph's nodes
  PartitionPlan plan;
};
PartitionedModel partition_model(const std::filesystem::path& input, const LoadOptions& load, const Backend& backend);

// One context binary of `graphs` over every weight in `store`, as the CLI writes it: in memory
// (what embed mode puts in a node, or what a session compiles for itself), or to `path` all or
// nothing (a temporary renamed into place, replacing an earlier file; Error kIo naming the path).
std::string context_binary_bytes(const BinaryIdentity& identity, const std::vector<CompiledGraph>& graphs,
                                 const WeightStore& store);
// A model compiled into a weightless binary, and the constants its compiled partitions read.
struct WeightlessSource {
  const Model* model = nullptr;
  std::vector<std::string> read;
};
// With `weightless_sources` (the models compiled, in one folder), a weightless binary: the weights
// that are tensors of their external data as stored are referred to there, and every tensor of it
// the partitions read is checked on open (--weightless).
void write_context_binary_file(const std::filesystem::path& path, const BinaryIdentity& identity,
                               const std::vector<CompiledGraph>& graphs, const WeightStore& store,
                               const std::vector<WeightlessSource>& weightless_sources = {});

// "<folder>/<stem>_ctx.onnx" naming: the stem is the file name without its last extension.
std::string file_stem(const std::filesystem::path& path);

}  // namespace ctxgen

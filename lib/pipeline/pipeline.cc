#include "ctxgen/pipeline.h"

#include <algorithm>
#include <chrono>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <optional>
#include <unordered_set>

#include "ctxgen/compile_cache.h"
#include "ctxgen/epcontext.h"
#include "ctxgen/error.h"
#include "ctxgen/format.h"
#include "ctxgen/log.h"
#include "ctxgen/report.h"
#include "ctxgen/outputs.h"
#include "job.h"

namespace fs = std::filesystem;

namespace ctxgen {
namespace {

constexpr const char* kVersion = CTXGEN_VERSION;
constexpr uint64_t kProtobufLimit = uint64_t{2} << 30;

class StageTimer {
 public:
  explicit StageTimer(std::vector<StageTiming>& out) : out_(out) {}
  void lap(const std::string& stage, const fs::path& model = {}) {
    auto now = std::chrono::steady_clock::now();
    out_.push_back({stage, model, std::chrono::duration<double, std::milli>(now - last_).count()});
    last_ = now;
  }

 private:
  std::vector<StageTiming>& out_;
  std::chrono::steady_clock::time_point last_ = std::chrono::steady_clock::now();
};

void check_relative_name(const std::string& name, const std::string& option) {
  fs::path p(name);
  bool bad = name.empty() || p.is_absolute() || p.filename().empty();
  for (const auto& part : p) bad = bad || part == "..";
  if (bad) throw Error(ErrorCode::kUsage, option + " '" + name + "': give a file name relative to the output folder, without '..'");
}

std::string serialize(const onnx::ModelProto& proto, const fs::path& path) {
  uint64_t size = proto.ByteSizeLong();
  if (size >= kProtobufLimit)
    throw Error(ErrorCode::kIo, path.string() + ": the model would be " + std::to_string(size) +
                                    " bytes; ONNX files are limited to 2 GiB: use --external-initializers-file");
  return deterministic_bytes(proto);
}

std::string describe_fallbacks(const Job& job) {
  std::map<std::string, size_t> by_reason;
  for (const auto& cpu : job.plan.cpu_nodes) ++by_reason[job.model.graph().node(static_cast<int>(cpu.node)).op_type() + ": " + cpu.reason];
  std::string text;
  size_t shown = 0;
  for (const auto& [reason, count] : by_reason) {
    if (shown++ == 5) {
      text += "; ...";
      break;
    }
    text += (text.empty() ? "" : "; ") + std::to_string(count) + " x " + reason;
  }
  return text;
}

// The fix to suggest when nothing compiled: the dims the model's inputs leave open, by name
// (--fix-dim) or, unnamed, by input (--input-shape). Empty when every input is static.
std::string open_dims_hint(const Model& model, const std::string& scope) {
  std::set<std::string> named;
  std::vector<std::string> unnamed;
  for (const auto& input : model.graph().input()) {
    if (!input.type().has_tensor_type() || !input.type().tensor_type().has_shape()) continue;
    for (const auto& dim : input.type().tensor_type().shape().dim()) {
      if (dim.has_dim_value()) continue;
      if (!dim.dim_param().empty()) named.insert(dim.dim_param());
      else if (unnamed.empty() || unnamed.back() != input.name()) unnamed.push_back(input.name());
    }
  }
  std::string hint;
  for (const auto& name : named) hint += " --fix-dim " + scope + name + "=N";
  for (const auto& input : unnamed) hint += " --input-shape " + scope + input + "=AxBx...";
  return hint.empty() ? "" : "its inputs have open dims: freeze them with" + hint;
}

ModelSummary summarize(const Job& job, const WeightSummary& weights) {
  ModelSummary s;
  s.input = job.model.path;
  s.output = job.output;
  s.input_nodes = job.input_nodes;
  s.folded_nodes = job.specialised.folded_nodes;
  s.removed_nodes = job.specialised.removed_nodes;
  s.node_count = static_cast<size_t>(job.model.graph().node_size());
  // From the partition plan, with what compiling added when it ran (--stop-after partition stops before).
  for (size_t p = 0; p < job.plan.partitions.size(); ++p) {
    const auto& part = job.plan.partitions[p];
    PartitionSummary summary{"partition " + std::to_string(p), part.nodes.size(), part.inputs.size(), part.outputs.size(),
                             part.constants.size(), 0};
    if (p < job.graphs.size()) {
      const auto& g = job.graphs[p];
      summary = {g.name, g.node_count, g.inputs.size(), g.outputs.size(), g.weight_ids.size(), g.program.size()};
    }
    s.partitions.push_back(summary);
    s.compiled_nodes += summary.nodes;
  }
  for (const auto& cpu : job.plan.cpu_nodes) {
    const auto& node = job.model.graph().node(static_cast<int>(cpu.node));
    s.cpu_nodes.push_back({node_label(node, cpu.node), node.op_type(), cpu.reason});
  }
  s.weights = weights;
  return s;
}

// The reasons travel with the model so `ctxgen inspect` can show them later.
void record_fallbacks(onnx::ModelProto& out, const Job& job) {
  nlohmann::json list = nlohmann::json::array();
  for (const auto& cpu : job.plan.cpu_nodes) {
    const auto& node = job.model.graph().node(static_cast<int>(cpu.node));
    list.push_back({{"node", node_label(node, cpu.node)},
                    {"op_type", node.op_type()},
                    {"reason", cpu.reason}});
  }
  set_metadata(out, kFallbackMetadataKey, json_text(list));
  set_metadata(out, kSpecialisedMetadataKey,
               json_text(nlohmann::json{{"nodes_in_input", job.input_nodes},
                                        {"nodes_folded", job.specialised.folded_nodes},
                                        {"nodes_removed", job.specialised.removed_nodes},
                                        {"branches_inlined", job.specialised.inlined_branches},
                                        {"folded_by_op", job.specialised.folded_by_op}}));
  if (job.model.fixed_values.empty()) return;
  // The values as given (and accepted by load): text keeps int64 exact and nan/inf intact.
  nlohmann::json fixed = nlohmann::json::object();
  for (const auto& [name, value] : job.model.fixed_values) fixed[name] = {{"dims", value.dims}, {"values", value.values}};
  set_metadata(out, kFixedValuesMetadataKey, json_text(fixed));
}

// Where every output goes; planned before any work so a clash or an existing file fails fast.
struct Plan {
  fs::path folder;
  std::vector<fs::path> models;  // one per input: _ctx.onnx, or _<phase>.onnx with --stop-after
  fs::path binary;               // empty when nothing but models is written
  fs::path external;             // the external initializers file, if any
  fs::path report;               // the JSON report, if any
};

Plan plan_outputs(const std::vector<fs::path>& inputs, const CompileOptions& options, const Backend& backend) {
  Plan plan;
  plan.folder = !options.output_file.empty() ? options.output_file.parent_path()
                : !options.output_dir.empty() ? options.output_dir
                                              : inputs.front().parent_path();
  std::string suffix = options.stop_after ? "_" + phase_name(*options.stop_after) + ".onnx" : "_ctx.onnx";
  for (const auto& in : inputs)
    plan.models.push_back(!options.output_file.empty() ? options.output_file : plan.folder / (file_stem(in) + suffix));
  std::string bin_stem = !options.output_file.empty() ? file_stem(options.output_file) : file_stem(inputs.front());
  if (!options.embed && !options.stop_after) plan.binary = plan.folder / (bin_stem + "_" + backend.name() + ".bin");
  if (!options.external_initializers_file.empty()) plan.external = plan.folder / options.external_initializers_file;
  if (options.report_file != kStdoutReport) plan.report = options.report_file;
  return plan;
}

std::vector<fs::path> planned_paths(const Plan& plan) {
  std::vector<fs::path> paths = plan.models;
  for (const auto& p : {plan.binary, plan.external, plan.report})
    if (!p.empty()) paths.push_back(p);
  return paths;
}

void check_options(const std::vector<fs::path>& inputs, const CompileOptions& options) {
  if (inputs.empty()) throw Error(ErrorCode::kUsage, "no input model given");
  if (!options.per_model.empty() && options.per_model.size() != inputs.size())
    throw Error(ErrorCode::kInternal, "shape options for " + std::to_string(options.per_model.size()) + " models, " +
                                          std::to_string(inputs.size()) + " models given");
  bool share = inputs.size() > 1;
  if (share && options.embed)
    throw Error(ErrorCode::kUsage, "--embed cannot be combined with several models: embedded contexts cannot share one binary");
  if (share && !options.output_file.empty())
    throw Error(ErrorCode::kUsage, "-o names one output model; with several models use --output-dir");
  if (!options.output_file.empty() && !options.output_dir.empty())
    throw Error(ErrorCode::kUsage, "give -o or --output-dir, not both: -o already says where the outputs go");
  if (!options.external_initializers_file.empty())
    check_relative_name(options.external_initializers_file, "--external-initializers-file");
  if (options.stop_after && options.embed)
    throw Error(ErrorCode::kUsage, "--stop-after writes the model before compiling: there is no context to --embed");
  if (options.weightless && options.embed)
    throw Error(ErrorCode::kUsage, "--weightless cannot be combined with --embed: a binary inside the model cannot "
                                   "refer to the weights' file");
  if (options.weightless && options.stop_after)
    throw Error(ErrorCode::kUsage, "--stop-after writes the model before compiling: there is no binary to make --weightless");
  if (options.weightless) {
    // A weightless binary is opened with one source model's folder: its data files are all there.
    for (const auto& in : inputs)
      if (external_data_folder(in) != external_data_folder(inputs.front()))
        throw Error(ErrorCode::kUsage, "--weightless: " + in.string() + " is not in the folder of " +
                                           inputs.front().string() + "; the models of a weightless binary must "
                                           "share one folder, where the binary finds their weights");
  }
}


// An output that is a file a loaded model reads (its external data) would be replaced under it; the
// check is by file identity, so no spelling of the path slips through.
void check_not_read(const Job& job, const std::vector<fs::path>& planned) {
  std::set<fs::path> read;
  for (const auto& w : job.model.weights)
    if (w.data.file) read.insert(w.data.file->path());
  for (const auto& out : planned) {
    std::error_code ec;
    if (!fs::exists(out, ec)) continue;
    for (const auto& file : read)
      if (fs::equivalent(out, file, ec))
        throw Error(ErrorCode::kUsage, out.string() + ": an output would overwrite " + file.string() + ", which " +
                                           job.model.path.string() + " reads its weights from");
  }
}

// ---- the phases ---------------------------------------------------------------------------------

void phase_load(Job& job, const fs::path& input, const LoadOptions& load) {
  job.model = load_model(input, load);
  job.input_nodes = static_cast<size_t>(job.model.graph().node_size());
}

void phase_specialise(Job& job) { job.specialised = specialise(job.model); }

void phase_partition(Job& job, const Backend& backend) {
  const auto& graph = job.model.graph();
  std::unordered_set<std::string> constants;
  for (const auto& [name, index] : job.model.constants) constants.insert(name);
  job.plan = partition_graph(graph, constants, [&](size_t i) {
    return backend.supports(job.model, graph.node(static_cast<int>(i)));
  });
}

void phase_compile(Job& job, const Backend& backend, const std::string& stem, WeightStore& store, CompileCache* cache) {
  // Output names are unique (OutputSet checks), so stems and graph names are unique too.
  for (size_t p = 0; p < job.plan.partitions.size(); ++p) {
    std::string name = stem + "_" + backend.name() + "_" + std::to_string(p);
    try {
      const Partition& partition = job.plan.partitions[p];
      job.graphs.push_back(cache ? cache->compile(job.model, partition, name, store)
                                 : backend.compile(job.model, partition, name, store));
    } catch (const Error& e) {
      throw e.within(job.model.path.string() + ": partition '" + name + "'");
    }
  }
  // The first partition checks the inputs --fix-value compiled in: the model keeps them as inputs.
  for (const auto& [name, value] : job.model.fixed_values)
    job.graphs.front().fixed_inputs.push_back(
        {IoSignature{name, value.declared.type().tensor_type().elem_type(), value.dims}, value.bytes});
}

// The model as it stands after an earlier phase (--stop-after): after partition, each node's
// doc_string says where it goes and why.
onnx::ModelProto snapshot(const Job& job, Phase phase, const Backend& backend) {
  onnx::ModelProto out = *job.model.proto;
  // Constants folding left unread (their bytes may already be released) are not part of it.
  auto used = names_in_use(out.graph());
  auto* inits = out.mutable_graph()->mutable_initializer();
  inits->erase(std::remove_if(inits->begin(), inits->end(), [&](const onnx::TensorProto& t) { return !used.count(t.name()); }),
               inits->end());
  if (phase != Phase::kPartition) return out;
  auto* graph = out.mutable_graph();
  for (size_t p = 0; p < job.plan.partitions.size(); ++p)
    for (size_t node : job.plan.partitions[p].nodes)
      graph->mutable_node(static_cast<int>(node))->set_doc_string("ctxgen: " + backend.name() + " partition " + std::to_string(p));
  for (const auto& cpu : job.plan.cpu_nodes)
    graph->mutable_node(static_cast<int>(cpu.node))->set_doc_string("ctxgen: CPU: " + cpu.reason);
  record_fallbacks(out, job);
  return out;
}

WeightSummary weight_summary(const Job& job, const WeightStore& store, std::vector<bool>& counted) {
  WeightSummary w;
  for (const auto& g : job.graphs)
    for (uint32_t id : g.weight_ids) {
      w.tensors += 1;
      w.bytes += store.entry(id).blob.size;
      if (!counted[id]) {
        counted[id] = true;
        w.new_tensors += 1;
        w.new_bytes += store.entry(id).blob.size;
      }
    }
  return w;
}

// What the report says of one model, with the files besides it its weights are read from.
ModelSummary model_summary(const Job& job, const WeightStore& store, std::vector<bool>& counted) {
  ModelSummary s = summarize(job, weight_summary(job, store, counted));
  std::set<fs::path> data_files;
  for (const Weight& w : job.model.weights)
    if (w.data.file && w.data.file->path() != job.model.path) data_files.insert(w.data.file->path());
  s.data_files.assign(data_files.begin(), data_files.end());
  return s;
}

// `sink`, telling options.progress every 64 MiB how far it got. `total` may leave out headers and
// padding; the caller reports the end (report_written).
ByteSink reporting(ByteSink sink, const CompileOptions& options, const char* stage, const fs::path& file, uint64_t total) {
  if (!options.progress) return sink;
  constexpr uint64_t kEvery = uint64_t{64} << 20;
  return [sink = std::move(sink), &options, stage, file, total, done = uint64_t{0}, next = kEvery](
             const uint8_t* data, size_t size) mutable {
    sink(data, size);
    done += size;
    if (done >= next) {
      options.progress({stage, {}, 0, 0, file, done, std::max(done + 1, total)});
      next = done + kEvery;
    }
  };
}

// Progress of the compile stage of model k of N: bytes of weights hashed, every 64 MiB, of the
// bytes its partitions read as loaded. The total is an estimate (lowering may fold or repack
// weights before they are hashed); a count that passes it is shown as its own total.
std::function<void(uint64_t)> hash_progress(const Job& job, const CompileOptions& options, const fs::path& model,
                                            size_t index, size_t count) {
  uint64_t total = 0;
  for (const auto& partition : job.plan.partitions)
    for (const auto& name : partition.constants)
      if (const Weight* w = job.model.constant(name)) total += w->data.size;
  constexpr uint64_t kEvery = uint64_t{64} << 20;
  return [&options, model, index, count, total, done = uint64_t{0}, next = kEvery](uint64_t size) mutable {
    done += size;
    if (done >= next) {
      options.progress({"compile", model, index, count, {}, done, std::max(done, total)});
      next = done + kEvery;
    }
  };
}

void report_written(const CompileOptions& options, const char* stage, const OutputSummary& file) {
  if (options.progress) options.progress({stage, {}, 0, 0, file.path, file.size, file.size});
}

OutputSummary write_external_weights(const ExternalWeightsFile& external, const fs::path& path, OutputSet& outputs,
                                     const CompileOptions& options) {
  OutputFile& file = outputs.open(path);
  const uint32_t last = external.store().size() - 1;
  const ByteSink sink = reporting(file.sink(), options, "write_external_weights", path,
                                  external.offsets()[last] + external.store().entry(last).blob.size);
  static const uint8_t zeros[kExternalDataAlignment] = {};
  uint64_t at = 0;
  for (uint32_t id = 0; id < external.store().size(); ++id) {
    const Blob& blob = external.store().entry(id).blob;
    sink(zeros, external.offsets()[id] - at);
    sink(blob.pin().data, blob.size);
    blob.release();
    at = external.offsets()[id] + blob.size;
  }
  OutputSummary summary = file.finish(path);
  outputs.finished(summary);
  report_written(options, "write_external_weights", summary);
  return summary;
}

}  // namespace

PartitionedModel partition_model(const fs::path& input, const LoadOptions& load, const Backend& backend) {
  Job job;
  phase_load(job, input, load);
  phase_specialise(job);
  phase_partition(job, backend);
  return {std::move(job.model), std::move(job.plan)};
}

std::string file_stem(const fs::path& path) { return path.filename().stem().string(); }

namespace {

std::vector<WeightPayload> payloads_of(const WeightStore& store) {
  std::vector<WeightPayload> payloads;
  for (uint32_t id = 0; id < store.size(); ++id) payloads.push_back({store.entry(id).hash, store.entry(id).blob});
  return payloads;
}

// --weightless: a weight that is the bytes of a tensor in the models' external data stays there,
// referred to by its file (relative to the models' folder), offset and hash, and named by the
// tensor. Every other tensor of those files the compiled partitions read is recorded too, after the
// store's weights, as a weight no graph reads, so that it is checked when the binary is opened: one
// with the same bytes as a referred tensor (the graphs read that one), one the compiler transformed
// into the weights the binary holds (a BatchNormalization folded into a Conv), an integer one.
std::vector<WeightFile> refer_to_source_data(const std::vector<WeightlessSource>& sources, const WeightStore& store,
                                             std::vector<WeightPayload>& payloads) {
  const fs::path folder = external_data_folder(sources.front().model->path);
  std::map<std::tuple<fs::path, size_t, size_t>, std::string> tensors;  // (file, offset, size) -> name
  for (const WeightlessSource& source : sources)
    for (const Weight& w : source.model->weights)
      if (w.external && w.data.file) tensors.emplace(std::tuple{w.data.file->path(), w.data.file_offset, w.data.size}, w.name);
  std::vector<WeightFile> files;
  std::map<fs::path, uint32_t> file_of;
  std::set<std::tuple<fs::path, size_t, size_t>> recorded;
  // Makes `payload` the reference to `blob`, when that is a tensor of the files not recorded yet.
  const auto refer = [&](WeightPayload& payload, const Blob& blob) {
    if (!blob.file || blob.make || !payload.hash) return false;
    const std::tuple key{blob.file->path(), blob.file_offset, blob.size};
    const auto tensor = tensors.find(key);
    if (tensor == tensors.end() || !recorded.insert(key).second) return false;
    const auto [file, added] = file_of.emplace(blob.file->path(), static_cast<uint32_t>(files.size() + 1));
    if (added) files.push_back({blob.file->path().lexically_relative(folder).string(), WeightFileKind::kSourceData, {}, {}});
    payload.file = file->second;
    payload.file_offset = blob.file_offset;
    files[payload.file - 1].tensors.push_back(tensor->second);
    return true;
  };
  std::vector<WeightPayload> checked;
  for (uint32_t id = 0; id < store.size(); ++id) {
    if (!refer(payloads[id], payloads[id].blob)) continue;
    for (const Blob& copy : store.entry(id).also_in_files) {
      WeightPayload check{payloads[id].hash, copy};
      if (refer(check, copy)) checked.push_back(std::move(check));
    }
  }
  if (files.empty())
    throw Error(ErrorCode::kUsage, "weightless binary: the compiled partitions read no tensor of " +
                                       sources.front().model->path.string() + (sources.size() > 1 ? " or the other models" : "") +
                                       " as it is stored in external data (embedded weights, and those the compiler "
                                       "computes, such as a BatchNormalization folded into a Conv, stay in the binary), "
                                       "so the binary would hold them all; save the model with external data "
                                       "(onnx.save_model(..., save_as_external_data=True)) or compile without weightless "
                                       "mode");
  for (const WeightlessSource& source : sources)
    for (const std::string& name : source.read) {
      const Weight* w = source.model->constant(name);
      if (w == nullptr || !w->external || !w->data.file) continue;
      const Blob blob = w->data.blob();
      WeightPayload check{xxh3_128(blob.pin().data, blob.size), blob};
      blob.release();
      if (refer(check, blob)) checked.push_back(std::move(check));
    }
  payloads.insert(payloads.end(), checked.begin(), checked.end());
  for (const WeightFile& file : files)
    log().info("--weightless: {} tensor(s) stay in {}: the binary reads them there, beside the source model",
               file.tensors.size(), (folder / file.path).string());
  return files;
}

std::vector<WeightlessSource> sources_of(const std::vector<Job>& jobs) {
  std::vector<WeightlessSource> sources;
  for (const Job& job : jobs) {
    sources.push_back({&job.model, {}});
    for (const Partition& p : job.plan.partitions) sources.back().read.insert(sources.back().read.end(), p.constants.begin(), p.constants.end());
  }
  return sources;
}

WrittenBinary write_to_string(const BinaryIdentity& identity, const std::vector<CompiledGraph>& graphs,
                              const std::vector<WeightPayload>& payloads, std::string& bytes) {
  return write_context_binary(
      identity, graphs, payloads,
      [&](const uint8_t* data, size_t size) { bytes.append(reinterpret_cast<const char*>(data), size); },
      [&](uint64_t offset, const uint8_t* data, size_t size) {
        bytes.replace(offset, size, reinterpret_cast<const char*>(data), size);
      });
}

}  // namespace

std::vector<fs::path> read_files(const std::vector<fs::path>& inputs, const CompileOptions& options) {
  std::vector<fs::path> read = inputs;
  read.insert(read.end(), options.read_files.begin(), options.read_files.end());
  return read;
}

std::string context_binary_bytes(const BinaryIdentity& identity, const std::vector<CompiledGraph>& graphs,
                                 const WeightStore& store) {
  std::string bytes;
  write_to_string(identity, graphs, payloads_of(store), bytes);
  return bytes;
}

void write_context_binary_file(const fs::path& path, const BinaryIdentity& identity,
                               const std::vector<CompiledGraph>& graphs, const WeightStore& store,
                               const std::vector<WeightlessSource>& weightless_sources) {
  OutputSet outputs({path}, true);
  OutputFile& file = outputs.open(path);
  std::vector<WeightPayload> payloads = payloads_of(store);
  const std::vector<WeightFile> weight_files =
      weightless_sources.empty() ? std::vector<WeightFile>{} : refer_to_source_data(weightless_sources, store, payloads);
  write_context_binary(identity, graphs, payloads, file.sink(), file.patcher(), weight_files);
  outputs.finished(file.finish(path));
  outputs.commit();
}

std::string phase_name(Phase phase) {
  switch (phase) {
    case Phase::kLoad: return "load";
    case Phase::kSpecialise: return "specialise";
    case Phase::kPartition: return "partition";
  }
  return "?";
}

std::optional<Phase> parse_phase(const std::string& name) {
  for (Phase p : {Phase::kLoad, Phase::kSpecialise, Phase::kPartition})
    if (phase_name(p) == name) return p;
  return std::nullopt;
}

std::unique_ptr<Backend> configured_backend(const BackendRegistry& backends, const CompileOptions& options) {
  const Backend* backend = backends.find(options.backend);
  if (backend == nullptr) {
    std::string known;
    for (const auto* b : backends.list()) known += (known.empty() ? "" : ", ") + b->name();
    throw Error(ErrorCode::kUsage, "unknown backend '" + options.backend + "' (available: " + known + ")");
  }
  return backend->with({options.target, options.weightless});
}

// `outputs_checked` becomes true once every planned output, the report among them, passed the
// checks (nothing overwritten without --force, no input replaced, folders made and locked).
void run_stages(const std::vector<fs::path>& inputs, const CompileOptions& options, const BackendRegistry& backends,
                const JobHooks& hooks, RunSummary& summary, bool& outputs_checked) {
  StageTimer timer(summary.timings);
  if (!hooks.prepared)
    for (const auto& in : inputs) check_model_file(in);
  check_options(inputs, options);
  const std::unique_ptr<Backend> configured = configured_backend(backends, options);
  const Backend& backend = *configured;
  summary.backend = backend.name();
  Plan plan = plan_outputs(inputs, options, backend);
  OutputSet outputs(planned_paths(plan), options.force, read_files(inputs, options));
  outputs_checked = true;

  // Compiling hashes every weight a partition reads: on a large model that is the long part of
  // the stage, so the hasher tells the progress display how far it got.
  std::function<void(uint64_t)> hashed;
  std::unique_ptr<CompileCache> cache;
  if (!options.cache_dir.empty() && !options.stop_after) {
    cache = std::make_unique<CompileCache>(options.cache_dir, backend, options.weightless, options.remote_cache);
    if (options.cache_only) cache->cache_only();
  }
  WeightStore store([&hashed, &cache](const uint8_t* data, size_t size) {
    const Hash128 hash = cache ? cache->hash(data, size) : xxh3_128(data, size);
    if (hashed) hashed(size);
    return hash;
  });
  std::vector<Job> jobs(inputs.size());
  auto stops_at = [&](Phase phase) { return options.stop_after && *options.stop_after == phase; };
  for (size_t m = 0; m < inputs.size(); ++m) {
    // A stage of this model: announced as it starts, timed when it ends.
    auto stage = [&](const char* name, const auto& work) {
      if (options.progress) options.progress({name, inputs[m], m + 1, inputs.size(), {}, 0, 0});
      work();
      timer.lap(name, inputs[m]);
    };
    Job& job = jobs[m];
    job.output = plan.models[m];
    if (hooks.prepared) {
      stage("read_object", [&] { hooks.prepared(job, m); });
    } else {
      stage("load", [&] {
        phase_load(job, inputs[m], options.per_model.empty() ? LoadOptions{} : options.per_model.at(m));
        check_not_read(job, planned_paths(plan));
      });
      if (stops_at(Phase::kLoad)) continue;
      stage("specialise", [&] { phase_specialise(job); });
      if (stops_at(Phase::kSpecialise)) continue;
      stage("partition", [&] { phase_partition(job, backend); });
      if (stops_at(Phase::kPartition)) continue;
    }
    if (job.plan.partitions.empty() && !options.allow_empty) {
      // In a group, a --fix-dim for one model is scoped to it (an unscoped one must fit every model).
      const std::string hint = open_dims_hint(job.model, inputs.size() > 1 ? file_stem(inputs[m]) + ":" : "");
      throw Error(ErrorCode::kNothingCompiled,
                  inputs[m].string() + ": nothing to compile: " +
                      (job.plan.cpu_nodes.empty()
                           ? "every node was folded into constants (" + std::to_string(job.specialised.folded_nodes) +
                                 " folded), so the outputs are constants"
                           : "no node is supported by backend '" + backend.name() + "' (" + describe_fallbacks(job) + ")") +
                      "; " + hint + (hint.empty() ? "" : ", or ") + "pass --allow-empty to write the model anyway");
    }
    if (job.plan.partitions.empty() && !job.model.fixed_values.empty())
      throw Error(ErrorCode::kNothingCompiled,
                  inputs[m].string() + ": nothing to compile, so no compiled partition checks the value of input '" +
                      job.model.fixed_values.begin()->first + "' (--fix-value keeps it an input that must be fed " +
                      "the value given); --allow-empty cannot be combined with --fix-value here");
    // Some nodes compiled and others stayed on CPU for want of static shapes: the fix, said once.
    const bool dynamic = std::any_of(job.plan.cpu_nodes.begin(), job.plan.cpu_nodes.end(), [](const CpuNode& c) {
      return c.reason.find("dynamic shape") != std::string::npos || c.reason.find("unknown shape") != std::string::npos;
    });
    if (dynamic && !job.plan.partitions.empty()) {
      const std::string hint = open_dims_hint(job.model, inputs.size() > 1 ? file_stem(inputs[m]) + ":" : "");
      if (!hint.empty()) log().warn("{}: nodes stay on CPU for dynamic shapes; {}", inputs[m].string(), hint);
    }
    stage("compile", [&] {
      if (options.progress) hashed = hash_progress(job, options, inputs[m], m + 1, inputs.size());
      if (cache) cache->add_files(job.model);
      phase_compile(job, backend, options.node_name_prefix + file_stem(inputs[m]), store, cache.get());
      hashed = nullptr;
    });
  }
  summary.weights = store.stats();
  if (options.compile_only) {
    // compile --object: the jobs and the cache's entries are the result; nothing is written.
    std::vector<bool> counted(store.size(), false);
    for (const Job& job : jobs) summary.models.push_back(model_summary(job, store, counted));
    if (cache) {
      summary.cache = cache->stats();
      cache->save();
    }
    if (hooks.compiled) hooks.compiled(jobs, summary.cache, backend.identity());
    return;
  }

  // Context binary first: in embed mode its bytes go into the models.
  std::string embedded;
  WrittenBinary written;
  if (!options.stop_after) {
    const BinaryIdentity identity = backend.identity();
    std::vector<WeightPayload> payloads = payloads_of(store);
    std::vector<CompiledGraph> all_graphs;
    for (const auto& job : jobs) all_graphs.insert(all_graphs.end(), job.graphs.begin(), job.graphs.end());
    const std::vector<WeightFile> weight_files = options.weightless && !all_graphs.empty()
                                                     ? refer_to_source_data(sources_of(jobs), store, payloads)
                                                     : std::vector<WeightFile>{};
    if (options.embed && !all_graphs.empty()) {
      written = write_to_string(identity, all_graphs, payloads, embedded);
    } else if (!all_graphs.empty()) {
      uint64_t total = 0;
      for (const auto& p : payloads) total += p.file > 0 ? 0 : p.blob.size;
      for (const auto& g : all_graphs) total += g.program.size();
      OutputFile& file = outputs.open(plan.binary);
      written = write_context_binary(identity, all_graphs, payloads,
                                     reporting(file.sink(), options, "write_context_binary", plan.binary, total),
                                     file.patcher(), weight_files);
      outputs.finished(file.finish(plan.binary));
      report_written(options, "write_context_binary", outputs.written().back());
    }
    timer.lap("write_context_binary");
  }

  EpContextSettings settings{backend.identity(), options.embed, options.embed ? embedded : plan.binary.filename().string(), kVersion,
                             written.bytes > 0 ? written.content_id.hex() : ""};
  std::unique_ptr<ExternalWeightsFile> external;
  if (!options.external_initializers_file.empty())
    external = std::make_unique<ExternalWeightsFile>(options.external_initializers_file);
  // With an external weights file, every model is built first: the file's content hash goes into
  // each model, so a model beside a weights file of another run is refused by verify.
  std::vector<onnx::ModelProto> outs(jobs.size());
  for (size_t m = 0; m < jobs.size(); ++m) {
    if (options.stop_after) {
      outs[m] = snapshot(jobs[m], *options.stop_after, backend);
    } else {
      outs[m] = build_epcontext_model(jobs[m].model, jobs[m].plan, jobs[m].graphs, settings);
      record_fallbacks(outs[m], jobs[m]);
    }
    if (external) external->externalize(outs[m], jobs[m].model);
  }
  if (external && external->store().size() == 0) {
    // No empty side file: no CPU node needs a weight, so no model points at it. One an earlier run
    // left (replaced with --force) would sit beside models that do not use it: it goes too.
    log().info("no initializer is left for CPU nodes; {} is not written", plan.external.string());
    outputs.remove_on_commit(plan.external);
    external.reset();
  }
  timer.lap("build_models");
  if (external) {
    const std::string id = write_external_weights(*external, plan.external, outputs, options).hash.hex();
    timer.lap("write_external_weights");
    summary.external_weights = external->store().stats();
    for (auto& out : outs)
      if (external_location(out.graph())) set_metadata(out, kExternalWeightsIdMetadataKey, id);
  }
  std::vector<bool> counted(store.size(), false);  // weight ids an earlier model already used
  for (size_t m = 0; m < jobs.size(); ++m) {
    if (!external) embed_weights(outs[m], jobs[m].model);
    std::string bytes = serialize(outs[m], jobs[m].output);
    outs[m] = onnx::ModelProto();  // its embedded weights leave memory once written (Clear() keeps them)
    if (options.progress)
      options.progress({"write_models", inputs[m], m + 1, jobs.size(), jobs[m].output, 0, 0});
    OutputFile& file = outputs.open(jobs[m].output);
    file.write(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    outputs.finished(file.finish(jobs[m].output));
    summary.models.push_back(model_summary(jobs[m], store, counted));
  }
  timer.lap("write_models");
  if (cache) summary.cache = cache->stats();  // the binary's writer may have found damaged entries
  if (!plan.report.empty()) {
    // The report describes the other outputs, so it is written last; it lands with them or not at all.
    summary.outputs = outputs.written();
    write_report(outputs, plan.report, report_json(inputs, options, summary));
  }
  outputs.commit();
  summary.outputs = outputs.written();
  if (cache) cache->save();
  if (cache && options.cache_max_size) {
    const uint64_t removed = prune_cache(options.cache_dir, *options.cache_max_size);
    if (removed > 0) log().info("--cache-max-size: {} least recently used entries removed", removed);
  }
}

namespace {

bool is_report(const fs::path& path) {
  std::ifstream in(path);
  const auto json = nlohmann::json::parse(in, nullptr, false);
  return json.is_object() && json.contains("schema_version") && json.contains("ctxgen_version");
}

// A failed run's report, written alone and only where it cannot cost the user a file: after the
// run's outputs, the report among them, passed their checks, and never over anything but an
// earlier report (which needs --force, as any output does). Not being able to write it is
// logged: the run's own error is the one that matters.
void write_failure_report(const std::vector<fs::path>& inputs, const CompileOptions& options,
                          const RunSummary& so_far, const Error& error, bool outputs_checked) {
  const nlohmann::json report = report_json(inputs, options, so_far, &error);
  if (options.report_file == kStdoutReport) {
    std::cout << json_text(report, 2) << std::endl;
    return;
  }
  // A run refused over its outputs (the report is one of them) says why in its error alone.
  if (!outputs_checked) return;
  const fs::path& path = options.report_file;
  try {
    if (fs::exists(fs::symlink_status(path)) && !is_report(path))
      throw Error(ErrorCode::kOutputExists, path.string() + " exists and is not a ctxgen report");
    OutputSet outputs({path}, options.force, read_files(inputs, options));
    write_report(outputs, path, report);
    outputs.commit();
  } catch (const Error& e) {
    log().warn("the report of the failed run was not written: {}", e.what());
  }
}

}  // namespace

RunSummary compile_models(const std::vector<fs::path>& inputs, const CompileOptions& options,
                          const BackendRegistry& backends) {
  return run_reported(inputs, options, [&](RunSummary& summary, bool& outputs_checked) {
    run_stages(inputs, options, backends, JobHooks{}, summary, outputs_checked);
  });
}

RunSummary run_reported(const std::vector<fs::path>& inputs, const CompileOptions& options, const ReportedRun& run) {
  RunSummary summary;
  bool outputs_checked = false;
  try {
    run(summary, outputs_checked);
  } catch (const Error& e) {
    if (!options.report_file.empty()) write_failure_report(inputs, options, summary, e, outputs_checked);
    throw;
  } catch (const std::exception& e) {  // out of memory, or a bug: reported as what it is
    const Error internal(ErrorCode::kInternal, std::string("internal error: ") + e.what());
    if (!options.report_file.empty()) write_failure_report(inputs, options, summary, internal, outputs_checked);
    throw internal;
  }
  if (options.report_file == kStdoutReport) std::cout << json_text(report_json(inputs, options, summary), 2) << std::endl;
  return summary;
}

}  // namespace ctxgen

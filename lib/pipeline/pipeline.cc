#include "ctxgen/pipeline.h"

#include <chrono>
#include <map>
#include <unordered_set>

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>

#include "ctxgen/epcontext.h"
#include "ctxgen/error.h"
#include "ctxgen/format.h"
#include "ctxgen/log.h"
#include "ctxgen/report.h"
#include "outputs.h"

namespace fs = std::filesystem;

namespace ctxgen {
namespace {

constexpr const char* kVersion = "0.1.0";
constexpr uint64_t kProtobufLimit = uint64_t{2} << 30;

class StageTimer {
 public:
  explicit StageTimer(std::vector<std::pair<std::string, double>>& out) : out_(out) {}
  void lap(const std::string& stage) {
    auto now = std::chrono::steady_clock::now();
    out_.emplace_back(stage, std::chrono::duration<double, std::milli>(now - last_).count());
    last_ = now;
  }

 private:
  std::vector<std::pair<std::string, double>>& out_;
  std::chrono::steady_clock::time_point last_ = std::chrono::steady_clock::now();
};

struct Job {
  Model model;
  PartitionPlan plan;
  std::vector<CompiledGraph> graphs;
  fs::path output;
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
  std::string bytes;
  {
    google::protobuf::io::StringOutputStream stream(&bytes);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    proto.SerializeToCodedStream(&coded);
  }
  return bytes;
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

ModelSummary summarize(const Job& job, const WeightSummary& weights) {
  ModelSummary s;
  s.input = job.model.path;
  s.output = job.output;
  s.node_count = static_cast<size_t>(job.model.graph().node_size());
  for (size_t p = 0; p < job.graphs.size(); ++p) {
    const auto& g = job.graphs[p];
    s.partitions.push_back({g.name, g.node_count, g.inputs.size(), g.outputs.size(), g.weight_ids.size(), g.program.size()});
    s.compiled_nodes += g.node_count;
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
  auto* kv = out.add_metadata_props();
  kv->set_key(kFallbackMetadataKey);
  kv->set_value(list.dump());
}

}  // namespace

std::string file_stem(const fs::path& path) { return path.filename().stem().string(); }

RunSummary compile_models(const std::vector<fs::path>& inputs, const CompileOptions& options,
                          const BackendRegistry& backends) {
  RunSummary summary;
  StageTimer timer(summary.timings_ms);
  if (inputs.empty()) throw Error(ErrorCode::kUsage, "no input model given");
  const Backend* backend = backends.find(options.backend);
  if (backend == nullptr) {
    std::string known;
    for (const auto* b : backends.list()) known += (known.empty() ? "" : ", ") + b->name();
    throw Error(ErrorCode::kUsage, "unknown backend '" + options.backend + "' (available: " + known + ")");
  }
  summary.backend = backend->name();
  bool share = inputs.size() > 1;
  if (share && options.embed)
    throw Error(ErrorCode::kUsage, "--embed cannot be combined with several models: embedded contexts cannot share one binary");
  if (share && !options.output_file.empty())
    throw Error(ErrorCode::kUsage, "-o names one output model; with several models use --output-dir");
  if (!options.output_file.empty() && !options.output_dir.empty())
    throw Error(ErrorCode::kUsage, "give -o or --output-dir, not both: -o already says where the outputs go");
  if (!options.external_initializers_file.empty())
    check_relative_name(options.external_initializers_file, "--external-initializers-file");

  // Plan every output path before any work, so a name clash or an existing file fails fast.
  fs::path folder = !options.output_file.empty() ? options.output_file.parent_path()
                    : !options.output_dir.empty() ? options.output_dir
                                                  : inputs.front().parent_path();
  std::vector<fs::path> ctx_paths;
  for (const auto& in : inputs)
    ctx_paths.push_back(!options.output_file.empty() ? options.output_file : folder / (file_stem(in) + "_ctx.onnx"));
  std::string bin_stem = !options.output_file.empty() ? file_stem(options.output_file) : file_stem(inputs.front());
  fs::path bin_path = folder / (bin_stem + "_" + backend->name() + ".bin");
  std::vector<fs::path> planned = ctx_paths;
  if (!options.embed) planned.push_back(bin_path);
  if (!options.external_initializers_file.empty()) planned.push_back(folder / options.external_initializers_file);
  for (const auto& in : inputs)
    for (const auto& out : planned)
      if (fs::weakly_canonical(fs::absolute(in)) == fs::weakly_canonical(fs::absolute(out)))
        throw Error(ErrorCode::kUsage, out.string() + ": an output would overwrite an input model");
  OutputSet outputs(planned, options.force);

  WeightStore store;
  std::vector<Job> jobs;
  for (size_t m = 0; m < inputs.size(); ++m) {
    Job job{load_model(inputs[m], options.load), {}, {}, ctx_paths[m]};
    timer.lap("load " + inputs[m].filename().string());
    const auto& graph = job.model.graph();
    std::unordered_set<std::string> constants;
    for (const auto& [name, index] : job.model.constants) constants.insert(name);
    job.plan = partition_graph(graph, constants, [&](size_t i) {
      return backend->supports(job.model, graph.node(static_cast<int>(i)));
    });
    timer.lap("partition " + inputs[m].filename().string());
    if (job.plan.partitions.empty() && !options.allow_empty)
      throw Error(ErrorCode::kNothingCompiled,
                  inputs[m].string() + ": nothing to compile: no node is supported by backend '" + backend->name() +
                      "' (" + describe_fallbacks(job) + "); pass --allow-empty to write the model anyway");
    // Output names are unique (OutputSet checks), so stems and graph names are unique too.
    std::string stem = options.node_name_prefix + file_stem(inputs[m]);
    for (size_t p = 0; p < job.plan.partitions.size(); ++p) {
      std::string name = stem + "_" + backend->name() + "_" + std::to_string(p);
      try {
        job.graphs.push_back(backend->compile(job.model, job.plan.partitions[p], name, store));
      } catch (const Error& e) {
        throw e.within(inputs[m].string() + ": partition '" + name + "'");
      }
    }
    timer.lap("compile " + inputs[m].filename().string());
    jobs.push_back(std::move(job));
  }
  summary.weights = store.stats();

  // Context binary first: in embed mode its bytes go into the models.
  BinaryIdentity identity{backend->ep_name(), backend->sdk_version(), backend->hardware_architecture()};
  std::vector<WeightPayload> payloads;
  for (uint32_t id = 0; id < store.size(); ++id) payloads.push_back({store.entry(id).hash, store.entry(id).blob});
  std::vector<CompiledGraph> all_graphs;
  for (const auto& job : jobs) all_graphs.insert(all_graphs.end(), job.graphs.begin(), job.graphs.end());
  bool any_compiled = !all_graphs.empty();
  std::string embedded;
  if (options.embed && any_compiled) {
    write_context_binary(identity, all_graphs, payloads, [&](const uint8_t* data, size_t size) {
      embedded.append(reinterpret_cast<const char*>(data), size);
    });
  } else if (any_compiled) {
    OutputFile& file = outputs.open(bin_path);
    write_context_binary(identity, all_graphs, payloads, file.sink());
    outputs.finished(file.finish(bin_path));
  }
  timer.lap("write context binary");

  EpContextSettings settings{backend->ep_name(), backend->sdk_version(), backend->hardware_architecture(),
                             options.embed, options.embed ? embedded : bin_path.filename().string(), kVersion};
  std::unique_ptr<ExternalWeightsFile> external;
  if (!options.external_initializers_file.empty())
    external = std::make_unique<ExternalWeightsFile>(options.external_initializers_file);
  std::vector<bool> counted(store.size(), false);  // weight ids an earlier model already used
  for (auto& job : jobs) {
    onnx::ModelProto out = build_epcontext_model(job.model, job.plan, job.graphs, settings);
    record_fallbacks(out, job);
    if (external) external->externalize(out, job.model);
    else embed_weights(out, job.model);
    std::string bytes = serialize(out, job.output);
    OutputFile& file = outputs.open(job.output);
    file.write(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    outputs.finished(file.finish(job.output));

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
    summary.models.push_back(summarize(job, w));
  }
  if (external) {
    fs::path path = folder / external->location();
    OutputFile& file = outputs.open(path);
    static const uint8_t zeros[kExternalDataAlignment] = {};
    uint64_t at = 0;
    for (uint32_t id = 0; id < external->store().size(); ++id) {
      const Blob& blob = external->store().entry(id).blob;
      file.write(zeros, external->offsets()[id] - at);
      file.write(blob.data, blob.size);
      blob.release();
      at = external->offsets()[id] + blob.size;
    }
    outputs.finished(file.finish(path));
    summary.external_weights = external->store().stats();
  }
  timer.lap("write models");
  outputs.commit();
  summary.outputs = outputs.written();
  return summary;
}

}  // namespace ctxgen
